-- Why a backlog grows: what the diagnosis reads besides the snapshot, the queue overview and
-- the fleet (reads/why.py reads, reads/diagnosis.py decides). Each runs on a timer (the
-- console's Why pane and header, `jobtui why`), so each reads a bounded number of rows however
-- big the backlog: a head of the ready index, the running jobs, a sample of done jobs, the
-- recent lease expiries, the paused controls, the database's sessions.
-- noun: why
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: why_waiting
-- The first %(scan)s due jobs in claim order, and the first %(scan)s ready jobs not due yet,
-- by queue and type (the ready index holds the type, not the queue: the rows behind the
-- entries are read, so the heads are short). Due: how long the first and the last of them
-- have waited. Not due: when the first and the last come due, apart for jobs that failed an
-- attempt before (retrying after a back-off) and those that did not (delayed). `seen` says how
-- many of its part were read: %(scan)s means there may be more behind them.
WITH due AS MATERIALIZED (
    SELECT queue, type, run_at FROM {schema}.job
    WHERE status = 'ready' AND run_at <= now()
    ORDER BY run_at, id
    LIMIT %(scan)s
), later AS MATERIALIZED (
    SELECT queue, type, run_at, attempts > 0 AS retrying FROM {schema}.job
    WHERE status = 'ready' AND run_at > now()
    ORDER BY run_at, id
    LIMIT %(scan)s
)
SELECT 'due' AS part, queue, type, false AS retrying, count(*) AS jobs,
       extract(epoch FROM now() - min(run_at))::float8 AS first_at, extract(epoch FROM now() - max(run_at))::float8 AS last_at,
       (SELECT count(*) FROM due) AS seen
FROM due GROUP BY queue, type
UNION ALL
SELECT 'later', queue, type, retrying, count(*),
       extract(epoch FROM min(run_at) - now())::float8, extract(epoch FROM max(run_at) - now())::float8,
       (SELECT count(*) FROM later)
FROM later GROUP BY queue, type, retrying;

-- name: why_running
-- The running jobs by worker, queue and type: how many, how many past their lease, and how
-- long the longest and the average have run. As many rows as the fleet has slots busy.
SELECT locked_by AS worker, queue, type, count(*) AS jobs, count(*) FILTER (WHERE locked_until < now()) AS expired,
       extract(epoch FROM now() - min(started_at))::float8 AS longest,
       extract(epoch FROM avg(now() - started_at))::float8 AS average
FROM {schema}.job WHERE status = 'running'
GROUP BY locked_by, queue, type;

-- name: why_run_times
-- How long done jobs ran (finished_at - started_at), by queue and type: the newest
-- %(sample)s done in the last 5 minutes (now), and up to %(per_slice)s of each 5 minutes of
-- the 55 before (the last hour). Read through job_finished_idx, newest first in each range,
-- and the rows behind those entries; jobs deleted at completion leave no row to read.
WITH recent AS MATERIALIZED (
    SELECT queue, type, finished_at - started_at AS took FROM {schema}.job
    WHERE status = 'done' AND finished_at > now() - interval '5 minutes'
    ORDER BY finished_at DESC
    LIMIT %(sample)s
), earlier AS MATERIALIZED (
    SELECT j.queue, j.type, j.took
    FROM generate_series(1, 11) AS s (i)
    CROSS JOIN LATERAL (SELECT queue, type, finished_at - started_at AS took FROM {schema}.job
                        WHERE status = 'done' AND finished_at > now() - (s.i + 1) * interval '5 minutes'
                          AND finished_at <= now() - s.i * interval '5 minutes'
                        ORDER BY finished_at DESC
                        LIMIT %(per_slice)s) AS j
)
SELECT 'now' AS part, queue, type, count(*) AS jobs, extract(epoch FROM avg(took))::float8 AS average,
       extract(epoch FROM max(took))::float8 AS longest
FROM recent WHERE took IS NOT NULL GROUP BY queue, type
UNION ALL
SELECT 'hour', queue, type, count(*), extract(epoch FROM avg(took))::float8, extract(epoch FROM max(took))::float8
FROM earlier WHERE took IS NOT NULL GROUP BY queue, type;

-- name: why_expiries
-- The lease expiries of the last %(window)s seconds (at most the newest %(most)s), by job
-- type: how many, of how many jobs, on how many workers (the first five named), how long ago
-- the latest and the first, how many made their job dead. A type whose jobs expire again and
-- again, or on several workers at moments far apart, kills the workers that run it.
SELECT job_type AS type, count(*) AS expiries, count(DISTINCT job_id) AS jobs, count(DISTINCT worker) AS workers,
       (array_agg(DISTINCT worker ORDER BY worker) FILTER (WHERE worker IS NOT NULL))[1:5] AS worker_names,
       extract(epoch FROM now() - max(reaped_at))::float8 AS latest_ago,
       extract(epoch FROM now() - min(reaped_at))::float8 AS first_ago,
       count(*) FILTER (WHERE outcome = 'dead') AS dead
FROM (SELECT job_id, job_type, worker, reaped_at, outcome FROM {schema}.lease_expiry
      WHERE reaped_at > now() - make_interval(secs => %(window)s)
      ORDER BY reaped_at DESC
      LIMIT %(most)s) AS e
GROUP BY job_type;

-- name: why_pauses
-- Every paused queue and type, with who paused it and how long ago, and the audit row the
-- pause wrote (same transaction, so the same now(): one lookup of the audit's time index).
SELECT c.kind, c.name, c.paused_by, extract(epoch FROM now() - c.paused_at)::float8 AS paused_ago,
       a.id AS audit_id, a.actor AS audit_actor
FROM {schema}.queue_control AS c
LEFT JOIN LATERAL (SELECT id, actor FROM {schema}.audit
                   WHERE at = c.paused_at AND action = c.kind || '-pause' AND target = c.kind || ' ' || c.name
                   ORDER BY id DESC
                   LIMIT 1) AS a ON true
WHERE c.paused_at IS NOT NULL
ORDER BY c.kind, c.name;

-- name: why_claims
-- The claims the database runs now, for this schema's job table (%(table)s in their text):
-- how many, how many wait for a lock, how long the longest has run. And how many sessions of
-- this database this role may not see the statements of (without pg_read_all_stats, another
-- role's show as '<insufficient privilege>'): their claims are not counted.
-- A claim is known by its first line, its statement's name: claim_take or claim_take_builtin,
-- or claim and claim_builtin as workers of releases before these names sent them.
SELECT count(*) FILTER (WHERE claim) AS claims,
       count(*) FILTER (WHERE claim AND wait_event_type = 'Lock') AS waiting,
       coalesce(max(extract(epoch FROM clock_timestamp() - query_start)) FILTER (WHERE claim), 0)::float8 AS longest,
       count(*) FILTER (WHERE query = '<insufficient privilege>') AS hidden
FROM (SELECT query, query_start, wait_event_type,
             state = 'active' AND split_part(query, E'\n', 1) IN ('-- jobtui: claim_take', '-- jobtui: claim_take_builtin',
                                                           '-- jobtui: claim', '-- jobtui: claim_builtin')
             AND strpos(query, %(table)s) > 0 AS claim
      FROM pg_stat_activity
      WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend') AS a;
