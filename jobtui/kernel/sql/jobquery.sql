-- The job query API and the jobs search, window by window (reads/jobquery.py).
-- noun: jobquery
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: jobquery_page
-- The job query API's page: jobs matching every filter given (a NULL filter is off), newest
-- first, ids below %(before)s (keyset: the last id of the page before). Walks the primary key
-- backwards, or one of the partial status indexes when the planner finds that cheaper.
SELECT id, type, queue, status, attempts, max_attempts, idempotency_key AS key, run_at, created_at,
       started_at, finished_at, locked_by AS worker,
       coalesce(split_part(last_error, E'\n', 1), '') AS last_error
FROM {schema}.job
WHERE (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
  AND (%(error)s::text IS NULL OR last_error ~ %(error)s)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: jobquery_scan
-- A page of the jobs search (jobquery.search): the jobs of the filter (jobfilter.py) among
-- the ids from %(floor)s up to below %(below)s, newest first. The search walks the table
-- down in such windows of the primary key, each one short, so that it shows its progress,
-- can be cancelled between two of them, and no statement outlives its timeout; with the
-- payload's GIN index (`jobtui index payload`) one window covers every id. `error` is the
-- pattern of `jobtui jobs --error` (on the whole last error), `matcher` the error matcher of
-- `jobtui dead --error`.
SELECT id, type, queue, status, attempts, max_attempts, idempotency_key AS key, run_at, created_at,
       started_at, finished_at, locked_by AS worker,
       coalesce(split_part(last_error, E'\n', 1), '') AS last_error
FROM {schema}.job AS j
WHERE j.id < %(below)s AND j.id >= %(floor)s
  AND {jobfilter_predicate}
ORDER BY id DESC
LIMIT %(limit)s;

-- name: jobquery_scan_count
-- How many jobs of the filter there are among the ids of a window, by status and type (the
-- search's count, window by window, as jobquery_scan).
SELECT status, type, count(*) AS jobs
FROM {schema}.job AS j
WHERE j.id < %(below)s AND j.id >= %(floor)s
  AND {jobfilter_predicate}
GROUP BY status, type;

-- name: jobquery_bounds
-- The lowest and highest job id (two ends of the primary key), and whether the payload's GIN
-- index exists and is valid (an interrupted CREATE INDEX CONCURRENTLY leaves it invalid).
SELECT (SELECT min(id) FROM {schema}.job) AS lowest, (SELECT max(id) FROM {schema}.job) AS highest,
       EXISTS (SELECT 1 FROM pg_index i
               WHERE i.indexrelid = to_regclass(format('%%I.job_payload_idx', %(schema_name)s::text))
                 AND i.indisvalid) AS payload_index;

-- name: jobquery_timeout
-- For one statement of a search or a bulk action, in its own transaction: the server cancels
-- it after this long (a transaction's setting: nothing outlives it behind a pooler).
SELECT set_config('statement_timeout', %(timeout)s, true), set_config('jit', 'off', true);

-- name: jobquery_count
-- How many jobs there are, by status and type, among those matching the filters. One branch
-- per status, each with its status written out, so that each reads its own partial index
-- (ready, running, dead and failed: the live queue, whatever the history) even under a
-- generic plan; a status not asked for is a one-time filter that reads nothing. Done jobs are
-- the done rows still in the table (job_finished_idx, which carries the type).
SELECT 'ready' AS status, type, count(*) AS jobs FROM {schema}.job
WHERE status = 'ready' AND (%(statuses)s::text[] IS NULL OR 'ready' = ANY(%(statuses)s::text[])) AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY type
UNION ALL
SELECT 'running' AS status, type, count(*) AS jobs FROM {schema}.job
WHERE status = 'running' AND (%(statuses)s::text[] IS NULL OR 'running' = ANY(%(statuses)s::text[])) AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY type
UNION ALL
SELECT 'dead' AS status, type, count(*) AS jobs FROM {schema}.job
WHERE status = 'dead' AND (%(statuses)s::text[] IS NULL OR 'dead' = ANY(%(statuses)s::text[])) AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY type
UNION ALL
SELECT 'failed' AS status, type, count(*) AS jobs FROM {schema}.job
WHERE status = 'failed' AND (%(statuses)s::text[] IS NULL OR 'failed' = ANY(%(statuses)s::text[])) AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY type
UNION ALL
SELECT 'done' AS status, type, count(*) AS jobs FROM {schema}.job
WHERE status = 'done' AND (%(statuses)s::text[] IS NULL OR 'done' = ANY(%(statuses)s::text[])) AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
GROUP BY type
ORDER BY status, type;
