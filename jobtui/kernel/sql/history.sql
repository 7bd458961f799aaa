-- The archiver's history: the backlog's minute rows and the flow spans, recorded once a
-- minute and pruned after a day (core/history.py; reads/backlog.py and reads/flows.py read them).
-- noun: history
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: history_minute_record
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

-- name: history_minute_prune
DELETE FROM {schema}.queue_minute WHERE minute < now() - interval '1 day';

-- name: history_flow_record
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

-- name: history_flow_prune
DELETE FROM {schema}.queue_flow WHERE span_end < now() - interval '1 day';
