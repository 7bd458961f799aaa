-- Each queue and job type at a glance (reads/overview.py).
-- noun: overview
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: overview_backlog
-- Per queue and per job type: the ready jobs (and how many are due), running ones, the oldest
-- due job's age (a pause makes it grow: that is what the pause costs), and the queue's limit,
-- rate and pause. Queues and types with no job but a control row are listed too. What the
-- console's header reads on every refresh (its findings, and the snapshot's ready jobs by
-- type), and with overview_done what `jobtui queue list`, `stats`, Prometheus and the Queues
-- pane show. Read by column name; runs on a timer, so it touches a bounded number of pages
-- however big the backlog and whatever the table's order (jobtui/reads/overview.py says what
-- it makes of them):
-- * the queues and the types: the rows of the first %(cap)s + 1 ready jobs in claim order (the
--   index does not hold the queue; in claim order each next row may sit on another page):
--   every ready job while there are at most %(cap)s. `head_rows` says how many were read. A
--   queue's or type's oldest age stays exact when one of its due jobs is among them (its first
--   one is its oldest), and so does every figure of its due jobs while the newest one read is
--   delayed (`newest_age` < 0);
-- * the running jobs, as many as the workers run.
WITH head AS MATERIALIZED (
    -- The rows of the first entries of the ready index in claim order: one page per row at
    -- worst (the index does not hold the queue), so at most %(cap)s + 1 pages.
    SELECT queue, type, run_at FROM {schema}.job WHERE status = 'ready' ORDER BY run_at, id LIMIT %(cap)s + 1
), grouped AS (
    -- Each queue and each type: one grouping set apiece over the same rows.
    SELECT CASE WHEN GROUPING(queue) = 0 THEN 'queue' ELSE 'type' END AS kind,
           CASE WHEN GROUPING(queue) = 0 THEN queue ELSE type END AS name,
           sum(ready) AS ready, sum(due) AS due, min(oldest) AS oldest, sum(running) AS running
    FROM (SELECT queue, type, 1 AS ready, (run_at <= now())::int AS due,
                 CASE WHEN run_at <= now() THEN run_at END AS oldest, 0 AS running
          FROM head
          UNION ALL
          SELECT queue, type, 0, 0, NULL, count(*)
          FROM {schema}.job WHERE status = 'running' GROUP BY queue, type) AS counted
    GROUP BY GROUPING SETS ((queue), (type))
), heads AS (
    SELECT count(*) AS head_rows, max(run_at) AS newest FROM head
)
SELECT coalesce(g.kind, c.kind) AS kind, coalesce(g.name, c.name) AS name,
       coalesce(g.ready, 0)::bigint AS ready, coalesce(g.due, 0)::bigint AS due,
       coalesce(g.running, 0)::bigint AS running,
       extract(epoch FROM now() - g.oldest)::float8 AS oldest_age,
       c.max_running, c.paused_at, c.paused_by,
       c.rate_per_second AS rate, CASE WHEN c.ramp_until > now() THEN c.ramp_until END AS ramp_until,
       {schema}.control_rate(c.rate_per_second, c.ramp_from, c.ramp_until, now()) AS rate_now,
       h.head_rows,
       extract(epoch FROM now() - h.newest)::float8 AS newest_age
FROM grouped AS g
FULL JOIN {schema}.queue_control AS c ON c.kind = g.kind AND c.name = g.name
CROSS JOIN heads AS h
WHERE g.name IS NOT NULL OR c.paused_at IS NOT NULL OR c.max_running IS NOT NULL
   OR c.rate_per_second IS NOT NULL OR c.ramp_until > now()
ORDER BY 1, 2;

-- name: overview_done
-- The jobs done in the last minute per queue and per job type, for the Queues pane, `jobtui
-- queue list`, `stats` and Prometheus (the header's done/min is the snapshot's, from
-- done_tally): at most the newest %(sample)s + 1 done rows, a page each at worst;
-- `done_span` says the seconds they span. Jobs deleted at completion are counted by type
-- only, in done_tally, and not here.
WITH recent AS MATERIALIZED (
    SELECT queue, type, finished_at FROM {schema}.job
    WHERE status = 'done' AND finished_at > now() - interval '1 minute'
    ORDER BY finished_at DESC
    LIMIT %(sample)s + 1
)
SELECT CASE WHEN GROUPING(queue) = 0 THEN 'queue' ELSE 'type' END AS kind,
       CASE WHEN GROUPING(queue) = 0 THEN queue ELSE type END AS name,
       count(*)::bigint AS done_last_minute,
       extract(epoch FROM now() - min(finished_at))::float8 AS done_span
FROM recent
GROUP BY GROUPING SETS ((queue), (type))
ORDER BY 1, 2;

-- name: overview_estimate
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
