-- The console's job lists (reads/joblists.py).
-- noun: joblist
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().
--
-- Status fences in lookups by id are written `(j.status = ...) IS TRUE`: claims.sql says why.

-- name: joblist_running
-- Running jobs for the console: oldest lease first, expired leases included; a page at a
-- time, each after the (locked_until, id) of the previous page's last job (NULL: the first).
-- `runner` is what the worker's heartbeat said runs the job, only when it describes this attempt
-- (its token is the row's): compared as jsonb, so that no text in it can fail a cast.
-- `lease_token` names the attempt, so that a kill asked of it spares the attempt after it.
-- With a `worker`, only the jobs it holds (the Workers pane's enter): still a walk of the
-- running jobs' index, whose size the fleet's slots bound, not the backlog.
SELECT id, type, locked_by AS worker, attempts AS attempt, max_attempts,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age, extract(epoch FROM locked_until - now()) AS lease_left,
       extract(epoch FROM now() - started_at) AS running_for, locked_until, lease_token,
       CASE WHEN runner -> 'token' = to_jsonb(lease_token) THEN runner END AS runner
FROM {schema}.job
WHERE status = 'running'
  AND (%(worker)s::text IS NULL OR locked_by = %(worker)s::text)
  AND (%(after_until)s::timestamptz IS NULL
       OR locked_until > %(after_until)s::timestamptz
       OR (locked_until = %(after_until)s::timestamptz AND id > %(after_id)s::bigint))
ORDER BY locked_until, id
LIMIT %(limit)s;

-- name: joblist_ready
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
LEFT JOIN LATERAL (SELECT * FROM {schema}.job WHERE id IN (SELECT id FROM picked) AND (status = 'ready') IS TRUE) AS j ON true
ORDER BY j.run_at, j.id;

-- name: joblist_dead_group
-- The jobs of one dead-letter group, newest first.
SELECT id, type, status, attempts, max_attempts, finished_at, locked_by AS worker,
       coalesce(split_part(last_error, E'\n', 1), '') AS last_error
FROM {schema}.job
WHERE status = %(status)s AND type = %(type)s AND error_fingerprint IS NOT DISTINCT FROM %(fingerprint)s
ORDER BY finished_at DESC, id DESC
LIMIT %(limit)s;
