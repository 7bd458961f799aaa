-- `jobtui bench` (core/bench.py).
-- noun: bench
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: bench_drain_window
-- `jobtui bench`: jobs finished and seconds from the first start to the last finish, from the
-- done rows and from the tallies of jobs deleted at completion.
SELECT coalesce(sum(jobs), 0)::bigint, extract(epoch FROM max(last) - min(first))::float8
FROM (SELECT count(*) AS jobs, min(started_at) AS first, max(finished_at) AS last
      FROM {schema}.job WHERE status = 'done'
      UNION ALL
      SELECT sum(jobs), min(first_started_at), max(last_finished_at) FROM {schema}.done_tally) AS finished;

-- name: bench_queue_busy
-- Whether any job is ready or running, asked of the ready and running indexes: a count over
-- the table would take a CPU away from the drain it is watching.
SELECT EXISTS (SELECT FROM {schema}.job WHERE status = 'ready')
       OR EXISTS (SELECT FROM {schema}.job WHERE status = 'running');

-- name: bench_schema_mark
-- The comment on a schema: `jobtui bench` marks the schemas it makes, and drops only those.
SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %(schema_name)s;

-- name: bench_schema_set_mark
COMMENT ON SCHEMA {schema} IS 'jobtui bench: dropped when the benchmark ends';

-- name: bench_vacuum
VACUUM ANALYZE {schema}.job;

-- name: bench_latency_left
SELECT count(*) FROM {schema}.job WHERE id >= %(first)s AND status <> 'done';

-- name: bench_latencies
-- Milliseconds from enqueue to start of the latency jobs (ids from `first` on).
SELECT extract(epoch FROM started_at - created_at) * 1000 FROM {schema}.job WHERE id >= %(first)s;
