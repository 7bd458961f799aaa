-- What the console and `stats` read besides the snapshot: the backlog's minute rows, the
-- flow spans, each queue at a glance, the job lists (reads/).
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: queue_minute_record
-- The row of the minute that just ended, once: the ready jobs as they are now (counted in
-- full, by type and by queue, once a minute by one worker, so that no reader has to), and
-- what finished or expired within the minute. A second archiver in the same minute finds the
-- row and counts nothing.
WITH m AS (
    SELECT date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00') - interval '1 minute' AS start
), ready AS MATERIALIZED (
    SELECT queue, type, count(*) AS jobs, count(*) FILTER (WHERE run_at <= now()) AS due,
           extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now()))::float8 AS oldest_age
    FROM {schema}.job WHERE status = 'ready'
    GROUP BY queue, type
), by_type AS (
    SELECT type, sum(jobs) AS jobs, sum(due) AS due, max(oldest_age) AS oldest_age FROM ready GROUP BY type
), by_queue AS (
    SELECT queue, sum(jobs) AS jobs, sum(due) AS due, max(oldest_age) AS oldest_age FROM ready GROUP BY queue
)
INSERT INTO {schema}.queue_minute
    (minute, ready, ready_due, oldest_ready_age, done, dead, lease_expiries, by_type, by_queue)
SELECT m.start,
       coalesce((SELECT sum(jobs) FROM ready), 0),
       coalesce((SELECT sum(due) FROM ready), 0),
       (SELECT max(oldest_age) FROM ready),
       (SELECT count(*) FROM {schema}.job
        WHERE status = 'done' AND finished_at >= m.start AND finished_at < m.start + interval '1 minute')
       + coalesce((SELECT sum(jobs) FROM {schema}.done_tally WHERE minute = m.start), 0),
       (SELECT count(*) FROM {schema}.job
        WHERE status IN ('dead', 'failed') AND finished_at >= m.start AND finished_at < m.start + interval '1 minute'),
       (SELECT count(*) FROM {schema}.lease_expiry
        WHERE reaped_at >= m.start AND reaped_at < m.start + interval '1 minute'),
       coalesce((SELECT jsonb_object_agg(type, jsonb_build_array(jobs, due, oldest_age)) FROM by_type),
                jsonb_build_object()),
       coalesce((SELECT jsonb_object_agg(queue, jsonb_build_array(jobs, due, oldest_age)) FROM by_queue),
                jsonb_build_object())
FROM m
WHERE NOT EXISTS (SELECT 1 FROM {schema}.queue_minute q WHERE q.minute = m.start)
ON CONFLICT (minute) DO NOTHING
RETURNING minute;

-- name: queue_minute_prune
DELETE FROM {schema}.queue_minute WHERE minute < now() - interval '1 day';

-- name: queue_flow_record
-- The drain forecast's span (migration 0013): what was enqueued and what finished, by queue
-- and type, from the end of the last span (at most 10 minutes back; else one minute) to now
-- (or %(until)s). Enqueues are the ids above the last span's last_id: they are read by the
-- primary key, as many as were enqueued, whatever the backlog. Finishes are done, dead and
-- failed rows of the span (their indexes, by finished_at), plus the jobs deleted at completion
-- (done_tally, by type only: queue NULL; its whole minutes, each in the span its end falls
-- in). Without an `until`, nothing is recorded when the
-- last span ended under 30 s ago (a second archiver in the same minute).
WITH RECURSIVE bounds AS (
    SELECT coalesce(%(until)s::timestamptz, now()) AS span_end,
           coalesce(prev.span_end, coalesce(%(until)s::timestamptz, now()) - interval '1 minute') AS span_start,
           prev.last_id AS after_id,
           (SELECT coalesce(max(id), 0) FROM {schema}.job) AS last_id
    FROM (SELECT 1) AS one
    LEFT JOIN LATERAL (SELECT f.span_end, f.last_id FROM {schema}.queue_flow AS f
                       WHERE f.span_end < coalesce(%(until)s::timestamptz, now())
                         AND f.span_end >= coalesce(%(until)s::timestamptz, now()) - interval '10 minutes'
                       ORDER BY f.span_end DESC LIMIT 1) AS prev ON true
), dead_types AS (
    -- The types of the dead and failed jobs, one index probe each (job_dead_idx leads with the
    -- type): the span's dead jobs are then one range per type, however many dead jobs wait.
    (SELECT type FROM {schema}.job WHERE status IN ('dead', 'failed') ORDER BY type LIMIT 1)
    UNION ALL
    SELECT (SELECT j.type FROM {schema}.job AS j
            WHERE j.status IN ('dead', 'failed') AND j.type > d.type ORDER BY j.type LIMIT 1)
    FROM dead_types AS d WHERE d.type IS NOT NULL
), flows AS (
    SELECT j.queue, j.type, count(*) AS enqueued, 0 AS finished
    FROM {schema}.job AS j, bounds AS b
    WHERE b.after_id IS NOT NULL AND j.id > b.after_id AND j.id <= b.last_id
    GROUP BY j.queue, j.type
    UNION ALL
    SELECT j.queue, j.type, 0, count(*) FROM {schema}.job AS j, bounds AS b
    WHERE j.status = 'done' AND j.finished_at >= b.span_start AND j.finished_at < b.span_end
    GROUP BY j.queue, j.type
    UNION ALL
    SELECT j.queue, j.type, 0, count(*) FROM dead_types AS d, bounds AS b
    -- OFFSET 0 keeps it a lookup per type, not a join over the whole index.
    CROSS JOIN LATERAL (SELECT x.queue, x.type FROM {schema}.job AS x
                        WHERE x.type = d.type AND x.status IN ('dead', 'failed')
                          AND x.finished_at >= b.span_start AND x.finished_at < b.span_end
                        OFFSET 0) AS j
    WHERE d.type IS NOT NULL
    GROUP BY j.queue, j.type
    UNION ALL
    SELECT NULL, t.type, 0, sum(t.jobs) FROM {schema}.done_tally AS t, bounds AS b
    WHERE t.minute >= date_bin('1 minute', b.span_start, timestamptz '2000-01-01 00:00:00+00')
      AND t.minute < date_bin('1 minute', b.span_end, timestamptz '2000-01-01 00:00:00+00')
    GROUP BY t.type
)
INSERT INTO {schema}.queue_flow (span_end, span_start, last_id, enqueues_known, pairs)
SELECT b.span_end, b.span_start, b.last_id, b.after_id IS NOT NULL,
       coalesce((SELECT jsonb_agg(jsonb_build_array(queue, type, enqueued, finished) ORDER BY queue, type)
                 FROM (SELECT queue, type, sum(enqueued)::bigint AS enqueued, sum(finished)::bigint AS finished
                       FROM flows GROUP BY queue, type) AS p), '[]'::jsonb)
FROM bounds AS b
WHERE %(until)s::timestamptz IS NOT NULL
   OR NOT EXISTS (SELECT 1 FROM {schema}.queue_flow WHERE span_end > now() - interval '30 seconds')
ON CONFLICT (span_end) DO NOTHING
RETURNING span_end;

-- name: queue_flow_prune
DELETE FROM {schema}.queue_flow WHERE span_end < now() - interval '1 day';

-- name: queue_flow_recent
-- The spans of the last 11 minutes (at most one a minute, so a handful of rows), oldest
-- first: the forecast reads the last five minutes of them, and each span's enqueues are
-- told apart from the ids drawn since the span before.
SELECT span_start, span_end, last_id, enqueues_known, pairs FROM {schema}.queue_flow
WHERE span_end > now() - interval '11 minutes'
ORDER BY span_end;

-- name: console_session
-- A console connection's first statement: a timeout for every later one, and who and where it
-- is: a standby (in recovery), or a server whose transactions are read-only. Behind a
-- transaction pooler the setting is local (%(local)s): a session's would stay on the server
-- connection for its next client; the console then relies on ending a hung read itself.
SELECT set_config('statement_timeout', %(statement_timeout)s, %(local)s) AS statement_timeout,
       current_user AS role, current_database() AS database,
       current_setting('transaction_read_only') = 'on' AS read_only, pg_is_in_recovery() AS standby;

-- name: list_running
-- Running jobs for the console: oldest lease first, expired leases included; a page at a
-- time, each after the (locked_until, id) of the previous page's last job (NULL: the first).
-- `runner` is what the worker's heartbeat said runs the job, only when it describes this attempt
-- (its token is the row's): compared as jsonb, so that no text in it can fail a cast.
-- With a `worker`, only the jobs it holds (the Workers pane's enter): still a walk of the
-- running jobs' index, whose size the fleet's slots bound, not the backlog.
SELECT id, type, locked_by AS worker, attempts AS attempt, max_attempts,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age, extract(epoch FROM locked_until - now()) AS lease_left,
       extract(epoch FROM now() - started_at) AS running_for, locked_until,
       CASE WHEN runner -> 'token' = to_jsonb(lease_token) THEN runner END AS runner
FROM {schema}.job
WHERE status = 'running'
  AND (%(worker)s::text IS NULL OR locked_by = %(worker)s::text)
  AND (%(after_until)s::timestamptz IS NULL
       OR locked_until > %(after_until)s::timestamptz
       OR (locked_until = %(after_until)s::timestamptz AND id > %(after_id)s::bigint))
ORDER BY locked_until, id
LIMIT %(limit)s;

-- name: list_ready
-- Ready jobs of one type, in claim order, among the first %(scan)s + 1 entries of the ready
-- index: the list refreshes every second while it is open, and a type whose jobs wait behind
-- a bigger backlog of others would have the whole index read for it each time. `cut` says
-- that entries were left unread; a row with a NULL id stands for no job.
WITH head AS MATERIALIZED (
    SELECT id, type, run_at FROM {schema}.job WHERE status = 'ready'
    ORDER BY run_at, id
    LIMIT %(scan)s + 1
), picked AS (
    SELECT id FROM head WHERE type = %(type)s ORDER BY run_at, id LIMIT %(limit)s
)
SELECT (SELECT count(*) FROM head) > %(scan)s AS cut, j.id, j.type, j.attempts, j.max_attempts,
       extract(epoch FROM now() - j.run_at) AS waiting, extract(epoch FROM now() - j.created_at) AS age,
       coalesce(split_part(j.last_error, E'\n', 1), '') AS last_error
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT * FROM {schema}.job WHERE id IN (SELECT id FROM picked) AND status = 'ready') AS j ON true
ORDER BY j.run_at, j.id;

-- name: list_dead_group
-- The jobs of one dead-letter group, newest first.
SELECT id, type, status, attempts, max_attempts, finished_at, locked_by AS worker,
       coalesce(split_part(last_error, E'\n', 1), '') AS last_error
FROM {schema}.job
WHERE status = %(status)s AND type = %(type)s AND error_fingerprint IS NOT DISTINCT FROM %(fingerprint)s
ORDER BY finished_at DESC, id DESC
LIMIT %(limit)s;

-- name: queue_overview
-- `jobtui queue list`, `stats`, Prometheus and the console's Queues pane: per queue and per job
-- type, the ready jobs (and how many are due), running ones, the oldest due job's age (a
-- pause makes it grow: that is what the pause costs), jobs done in the last minute, and the
-- queue's limit and pause. Queues and types with no job but a control row are listed too.
-- Read by column name; runs on a timer, so it touches a bounded number of pages however big
-- the backlog and whatever the table's order (jobtui/reads/overview.py says what it makes of
-- them):
-- * the queues and the types: the rows of the first %(cap)s + 1 ready jobs in claim order (the
--   index does not hold the queue; in claim order each next row may sit on another page):
--   every ready job while there are at most %(cap)s. `head_rows` says how many were read. A
--   queue's or type's oldest age stays exact when one of its due jobs is among them (its first
--   one is its oldest), and so does every figure of its due jobs while the newest one read is
--   delayed (`newest_age` < 0);
-- * the done jobs of the last minute: at most the newest %(sample)s + 1 (`done_span` says the
--   seconds they span); jobs deleted at completion are counted by type only, in done_tally,
--   and not here;
-- * the running jobs, as many as the workers run.
WITH head AS MATERIALIZED (
    -- The rows of the first entries of the ready index in claim order: one page per row at
    -- worst (the index does not hold the queue), so at most %(cap)s + 1 pages.
    SELECT queue, type, run_at FROM {schema}.job WHERE status = 'ready' ORDER BY run_at, id LIMIT %(cap)s + 1
), type_head AS MATERIALIZED (
    SELECT type AS name, count(*) AS ready, count(*) FILTER (WHERE run_at <= now()) AS due,
           min(run_at) FILTER (WHERE run_at <= now()) AS oldest, max(run_at) AS newest
    FROM head GROUP BY type
), queue_head AS MATERIALIZED (
    SELECT queue AS name, count(*) AS ready, count(*) FILTER (WHERE run_at <= now()) AS due,
           min(run_at) FILTER (WHERE run_at <= now()) AS oldest, max(run_at) AS newest
    FROM head GROUP BY queue
), recent AS MATERIALIZED (
    SELECT queue, type, finished_at FROM {schema}.job
    WHERE status = 'done' AND finished_at > now() - interval '1 minute'
    ORDER BY finished_at DESC
    LIMIT %(sample)s + 1
), running AS MATERIALIZED (
    SELECT queue, type, count(*) AS jobs FROM {schema}.job WHERE status = 'running' GROUP BY queue, type
), grouped AS (
    SELECT 'queue' AS kind, name, sum(ready) AS ready, sum(due) AS due, min(oldest) AS oldest, max(newest) AS newest,
           sum(running) AS running, sum(done) AS done, min(done_since) AS done_since
    FROM (SELECT name, ready, due, oldest, newest, 0 AS running, 0 AS done, NULL::timestamptz AS done_since
          FROM queue_head
          UNION ALL
          SELECT queue, 0, 0, NULL, NULL, jobs, 0, NULL FROM running
          UNION ALL
          SELECT queue, 0, 0, NULL, NULL, 0, count(*), min(finished_at) FROM recent GROUP BY queue) AS q
    GROUP BY name
    UNION ALL
    SELECT 'type', name, sum(ready), sum(due), min(oldest), max(newest), sum(running), sum(done), min(done_since)
    FROM (SELECT name, ready, due, oldest, newest, 0 AS running, 0 AS done, NULL::timestamptz AS done_since
          FROM type_head
          UNION ALL
          SELECT type, 0, 0, NULL, NULL, jobs, 0, NULL FROM running
          UNION ALL
          SELECT type, 0, 0, NULL, NULL, 0, count(*), min(finished_at) FROM recent GROUP BY type) AS t
    GROUP BY name
), heads AS (
    SELECT 'queue' AS kind, coalesce(sum(ready), 0) AS head_rows, max(newest) AS newest FROM queue_head
    UNION ALL
    SELECT 'type', coalesce(sum(ready), 0), max(newest) FROM type_head
)
SELECT coalesce(g.kind, c.kind) AS kind, coalesce(g.name, c.name) AS name,
       coalesce(g.ready, 0)::bigint AS ready, coalesce(g.due, 0)::bigint AS due,
       coalesce(g.running, 0)::bigint AS running, coalesce(g.done, 0)::bigint AS done_last_minute,
       extract(epoch FROM now() - g.oldest)::float8 AS oldest_age,
       c.max_running, c.paused_at, c.paused_by,
       c.rate_per_second AS rate, CASE WHEN c.ramp_until > now() THEN c.ramp_until END AS ramp_until,
       {schema}.control_rate(c.rate_per_second, c.ramp_from, c.ramp_until, now()) AS rate_now,
       h.head_rows,
       extract(epoch FROM now() - h.newest)::float8 AS newest_age,
       extract(epoch FROM now() - g.done_since)::float8 AS done_span
FROM grouped AS g
FULL JOIN {schema}.queue_control AS c ON c.kind = g.kind AND c.name = g.name
JOIN heads AS h ON h.kind = coalesce(g.kind, c.kind)
WHERE g.name IS NOT NULL OR c.paused_at IS NOT NULL OR c.max_running IS NOT NULL
   OR c.rate_per_second IS NOT NULL OR c.ramp_until > now()
ORDER BY 1, 2;

-- name: queue_overview_estimate
-- What the queue overview estimates from when the ready jobs are too many to read: the
-- archiver's newest minute row (its ready jobs by queue and by type, counted once that
-- minute) and the planner's estimate of the ready index's entries. Catalog and one small
-- table only. No share of the planner's column statistics: they mix every status, and would
-- give a type whose jobs are all dead a backlog.
SELECT (SELECT greatest(reltuples, 0)::bigint FROM pg_class
        WHERE oid = to_regclass(format('%%I.job_ready_idx', %(schema_name)s::text))) AS index_estimate,
       m.recorded_at, extract(epoch FROM now() - m.recorded_at)::float8 AS minute_age, m.by_queue, m.by_type
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT recorded_at, ready, by_queue, by_type FROM {schema}.queue_minute
                   ORDER BY minute DESC LIMIT 1) AS m ON true;
