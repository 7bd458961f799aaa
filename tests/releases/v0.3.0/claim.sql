-- The claim statement of release 0.3.0 (commit 6985ab2, jobtui/kernel/sql/claims.sql),
-- recorded for tests/integration/test_lever_paths.py: a worker of that release claims beside
-- this code. {schema} is the quoted schema name.
-- Up to `limit` ready jobs of the given types, oldest run_at first, from `queue` (NULL: from
-- every queue). SKIP LOCKED lets any number of workers claim at once without waiting on each
-- other or taking the same row.
-- The ids come from an ARRAY(...) subquery rather than a join (UPDATE ... FROM picked):
-- a joined relation costs a whole-row copy of each of its rows, kept for rechecks, and
-- the join. The rows come back in id order; the caller sorts them by run_at. The payload
-- comes as text, which the worker decodes with one JSON decoder, cheaper per row than
-- psycopg's jsonb loader.
-- Pauses and limits are read here, in queue_control, in this statement: paused queues and
-- types are left out (two one-time subqueries of that small table), and the jobs of queues
-- with a limit come from claim_limited (migration 0008), which counts what runs under a lock.
-- Without a limit set, that function finds no row and takes no lock. The jobs of queues and
-- types with a rate (or a ramp) come from claim_rated (migration 0013), which takes a token
-- of their buckets per job; without a rate set, one small subquery finds none and the function
-- is not called. The queue and the type
-- are compared as expressions (`queue || ''`), which the planner estimates by default rather
-- than from the columns' statistics: with a single queue or type in the table, those say
-- that almost no row differs from a value not known yet, and a generic plan would sort every
-- ready row instead of walking the ready index.
-- The walk for the jobs no lever holds back does not start at all when the claim's queue, or
-- each of its types, is paused, limited or rated (`aside`, a one-time filter): a worker that
-- serves only a rated queue whose bucket is spent would otherwise read that queue's whole
-- backlog at every claim, looking for jobs that cannot be there.
WITH limited AS MATERIALIZED (
    SELECT r.ids || {schema}.claim_limited(%(queue)s::text, %(types)s::text[], %(limit)s::int - cardinality(r.ids), r.ids)
           AS ids
    FROM (SELECT CASE WHEN EXISTS (SELECT 1 FROM {schema}.queue_control
                                   WHERE rate_per_second IS NOT NULL OR ramp_until > now())
                      THEN {schema}.claim_rated(%(queue)s::text, %(types)s::text[], %(limit)s::int)
                      ELSE ARRAY[]::bigint[] END AS ids) AS r
), aside AS MATERIALIZED (
    SELECT ARRAY(SELECT name FROM {schema}.queue_control
                 WHERE kind = 'queue' AND (paused_at IS NOT NULL OR max_running IS NOT NULL
                       OR rate_per_second IS NOT NULL OR ramp_until > now())) AS queues,
           ARRAY(SELECT name FROM {schema}.queue_control
                 WHERE kind = 'type' AND (paused_at IS NOT NULL
                       OR rate_per_second IS NOT NULL OR ramp_until > now())) AS types
)
UPDATE {schema}.job AS j
SET status = 'running',
    attempts = j.attempts + 1,
    lease_token = j.lease_token + 1,
    -- A job enqueued without a limit takes its handler's (or the default) at first claim.
    max_attempts = coalesce(
        j.max_attempts,
        (%(max_attempts)s::int[])[array_position(%(types)s::text[], j.type)],
        %(default_max_attempts)s),
    locked_by = %(worker)s,
    locked_until = now() + make_interval(secs => %(lease)s),
    heartbeat_at = now(),
    started_at = now()
WHERE j.id = ANY((SELECT ids FROM limited) || ARRAY(
        SELECT id FROM {schema}.job
        WHERE status = 'ready' AND run_at <= now() AND type = ANY(%(types)s::text[])
          AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
          AND (queue || '') <> ALL((SELECT queues FROM aside)::text[])
          AND (type || '') <> ALL((SELECT types FROM aside)::text[])
          AND (SELECT (%(queue)s::text IS NULL OR %(queue)s::text <> ALL(a.queues))
                      AND EXISTS (SELECT 1 FROM unnest(%(types)s::text[]) AS t(name) WHERE t.name <> ALL(a.types))
               FROM aside AS a)
        ORDER BY run_at, id
        LIMIT greatest(0, %(limit)s::int - cardinality((SELECT ids FROM limited)))
        FOR UPDATE SKIP LOCKED))
  AND j.status = 'ready'
RETURNING j.id, j.type, j.payload::text, j.attempts, j.max_attempts, j.lease_token,
          j.locked_until, j.created_at, j.run_at, j.uncounted, j.meta::text, j.queue;
