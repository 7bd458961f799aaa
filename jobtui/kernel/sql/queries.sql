-- Every runtime statement of jobtui, as named blocks (`-- name: NAME`).
--
-- {schema} is the quoted schema name (filled in with psycopg.sql.Identifier); values are
-- always bound parameters. Every transition a worker makes names the status and lease token
-- it expects: zero rows updated means the lease was lost and the write must not be retried.
-- Time is always the database's now().

-- name: schema_versions
-- Every applied migration (numbers may land out of order: the newest alone does not say).
SELECT version FROM {schema}.migration;

-- name: server_read_only
-- Whether this session may write: false on a hot standby or a read-only default.
SELECT current_setting('transaction_read_only') = 'on' OR pg_is_in_recovery() AS read_only;

-- name: enqueue
-- One job. With an idempotency key that already exists, inserts nothing and returns nothing;
-- the caller then reads the existing job with enqueue_existing.
INSERT INTO {schema}.job (type, payload, idempotency_key, run_at, max_attempts, meta, queue)
VALUES (%(type)s, %(payload)s, %(key)s,
        coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s),
        %(max_attempts)s, %(meta)s::jsonb, %(queue)s)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: enqueue_existing
SELECT id FROM {schema}.job WHERE idempotency_key = %(key)s;

-- name: enqueue_many
-- Many jobs in one statement; rows whose key already exists are skipped. Returns the new
-- ids with their position in the input (ord, 1-based).
INSERT INTO {schema}.job (type, payload, idempotency_key, run_at, max_attempts, meta, queue)
SELECT t.type, t.payload::jsonb, t.key, now() + make_interval(secs => t.delay), t.max_attempts, t.meta::jsonb, t.queue
FROM unnest(%(types)s::text[], %(payloads)s::text[], %(keys)s::text[],
            %(delays)s::float8[], %(max_attempts)s::int[], %(metas)s::text[], %(queues)s::text[])
     WITH ORDINALITY AS t(type, payload, key, delay, max_attempts, meta, queue, ord)
ORDER BY t.ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, idempotency_key;

-- name: enqueue_existing_many
SELECT id, idempotency_key FROM {schema}.job WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: reserve_ids
-- Ids for a COPY of many jobs, drawn from the table's own sequence. The sequence is looked
-- up once (an InitPlan), not once per id, which would cost more than the COPY's own parsing.
SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id')::regclass)) FROM generate_series(1, %(n)s);

-- name: copy_jobs
-- Bulk insert without keys or delays: run_at takes its default, the database's now().
COPY {schema}.job (id, type, payload, max_attempts, meta, queue) FROM STDIN;

-- name: claim
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

-- name: claim_builtin
-- jobtui's own jobs (the archiver's), claimed by the slot every worker keeps for them
-- whatever queues it serves. They are in the queue 'jobtui.builtin', found through its own
-- small partial index (migration 0015): that queue named here as a constant, so the planner
-- can use it. The claim of the ready index would step over every other ready job to find them,
-- once a poll on every worker: a read that grows with the backlog. A pause of the queue or of
-- a type holds them back as it holds any job.
UPDATE {schema}.job AS j
SET status = 'running',
    attempts = j.attempts + 1,
    lease_token = j.lease_token + 1,
    max_attempts = coalesce(
        j.max_attempts,
        (%(max_attempts)s::int[])[array_position(%(types)s::text[], j.type)],
        %(default_max_attempts)s),
    locked_by = %(worker)s,
    locked_until = now() + make_interval(secs => %(lease)s),
    heartbeat_at = now(),
    started_at = now()
WHERE j.id = ANY(ARRAY(
        SELECT id FROM {schema}.job
        WHERE status = 'ready' AND queue = 'jobtui.builtin' AND run_at <= now()
          AND type = ANY(%(types)s::text[])
          AND type <> ALL(ARRAY(SELECT name FROM {schema}.queue_control WHERE kind = 'type' AND paused_at IS NOT NULL))
          AND NOT EXISTS (SELECT 1 FROM {schema}.queue_control
                          WHERE kind = 'queue' AND name = 'jobtui.builtin' AND paused_at IS NOT NULL)
        ORDER BY run_at, id
        LIMIT %(limit)s::int
        FOR UPDATE SKIP LOCKED))
  AND j.status = 'ready'
RETURNING j.id, j.type, j.payload::text, j.attempts, j.max_attempts, j.lease_token,
          j.locked_until, j.created_at, j.run_at, j.uncounted, j.meta::text, j.queue;

-- name: heartbeat
-- Extends many leases at once; the ids returned as 'held' still hold their lease, the others
-- lost it. Each id's token is found by its position in the arrays (see complete). A lease
-- that has already expired is not extended, even when no reaper took it yet: by the
-- database's clock it was lost, and its worker gives the attempt up (another worker may have
-- started it). The exception is `keep`: jobs whose sync handler's thread runs on after its
-- attempt was given up, whose row stays running under the same token until the thread
-- returns (no one else took the job while the token is the same). A lost lease whose job an
-- operator cancelled under that very lease comes back as 'cancelled' (the backstop of a lost
-- cancel notification); that lookup runs only when some lease was not extended.
-- `runners` (a jsonb object by job id; a job missing from it keeps the row's) says what runs
-- each job, for the console: the executor and a child's pid and resident memory, tagged with
-- the lease token.
WITH held AS (
    UPDATE {schema}.job AS j
    SET locked_until = now() + make_interval(secs => %(lease)s), heartbeat_at = now(),
        runner = coalesce(%(runners)s::jsonb -> j.id::text, j.runner)
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'running'
      AND (j.locked_until > now() OR j.id = ANY(%(keep)s::bigint[]))
      AND j.lease_token = (%(tokens)s::bigint[])[array_position(%(ids)s::bigint[], j.id)]
    RETURNING j.id
)
SELECT id, 'held' AS lease FROM held
UNION ALL
SELECT j.id, 'cancelled' FROM {schema}.job AS j
WHERE (SELECT count(*) FROM held) < cardinality(%(ids)s::bigint[])
  AND j.id = ANY(%(ids)s::bigint[]) AND j.status = 'failed'
  AND j.lease_token = (%(tokens)s::bigint[])[array_position(%(ids)s::bigint[], j.id)]
  AND j.errors -> -1 ->> 'kind' = 'cancelled';

-- name: complete
-- Fenced by status and lease token, like every transition. The ids are matched with
-- = ANY and each one's token looked up by position, not by joining unnest(ids, tokens):
-- that join (a whole-row copy per row, kept for rechecks) would be most of this statement.
UPDATE {schema}.job AS j
SET status = 'done', locked_until = NULL, finished_at = now()
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'running'
  AND j.lease_token = (%(tokens)s::bigint[])[array_position(%(ids)s::bigint[], j.id)]
RETURNING j.id;

-- name: complete_deleting
-- Complete by deleting: for workers started with --delete-on-complete. Only jobs without a
-- key are deleted (a keyed job stays as a done row, so its key keeps refusing duplicates until
-- the archiver's retention); the caller completes the ids missing from the result with
-- `complete`, which also tells a keyed job from a lost lease. Each deleted job is counted into
-- done_tally in the same statement, in the finishing worker's own row (see migration 0004).
WITH gone AS (
    DELETE FROM {schema}.job AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'running' AND j.idempotency_key IS NULL
      AND j.lease_token = (%(tokens)s::bigint[])[array_position(%(ids)s::bigint[], j.id)]
    RETURNING j.id, j.type, j.attempts, j.locked_by, j.started_at
), counted AS (
    INSERT INTO {schema}.done_tally AS t
        (minute, type, attempts, worker, jobs, first_started_at, last_finished_at)
    SELECT date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00'), type, attempts,
           coalesce(locked_by, ''), count(*), min(started_at), now()
    FROM gone
    GROUP BY type, attempts, locked_by
    ON CONFLICT (minute, type, attempts, worker) DO UPDATE
    SET jobs = t.jobs + excluded.jobs,
        first_started_at = least(t.first_started_at, excluded.first_started_at),
        last_finished_at = greatest(t.last_finished_at, excluded.last_finished_at)
)
SELECT id FROM gone;

-- name: fail
-- A counted failure: back to ready after the given delay, or dead once attempts are spent.
-- The error joins the row's history (the newest 50 entries are kept).
UPDATE {schema}.job AS j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
    run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at
                  ELSE now() + make_interval(secs => t.delay) END,
    finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
    locked_until = NULL,
    uncounted = 0,
    last_error = t.error,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                 'kind', 'error', 'error', t.error)))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[], %(errors)s::text[])
     AS t(id, token, delay, error)
WHERE j.id = t.id AND j.status = 'running' AND j.lease_token = t.token
RETURNING j.id, j.status, j.type, j.attempts, j.max_attempts, j.locked_by, j.queue;

-- name: fail_permanently
-- The handler decided the job can never succeed: failed at once, whatever attempts remain.
UPDATE {schema}.job AS j
SET status = 'failed', locked_until = NULL, finished_at = now(), last_error = t.error,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                 'kind', 'permanent', 'error', t.error)))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(errors)s::text[]) AS t(id, token, error)
WHERE j.id = t.id AND j.status = 'running' AND j.lease_token = t.token
RETURNING j.id;

-- name: release
-- Back to ready without counting the attempt, with an entry in the history saying why:
--   retry      the handler raised Retry;
--   db_error   the handler's own database work failed on the connection, not on the job;
--   abandoned  the worker could not extend the lease before it expired (the database was
--              unreachable), and gave the attempt up;
--   shutdown   the worker stopped before the handler finished.
-- The first two are the job's own doing and are counted in `uncounted` (in a row), which the
-- worker bounds; the last two are the infrastructure's and count nowhere.
UPDATE {schema}.job AS j
SET status = 'ready', attempts = j.attempts - 1, locked_until = NULL,
    run_at = now() + make_interval(secs => t.delay),
    uncounted = j.uncounted + CASE WHEN t.kind IN ('retry', 'db_error') THEN 1 ELSE 0 END,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                 'kind', t.kind, 'error', t.reason)))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[], %(kinds)s::text[],
            %(reasons)s::text[]) AS t(id, token, delay, kind, reason)
WHERE j.id = t.id AND j.status = 'running' AND j.lease_token = t.token
RETURNING j.id;

-- name: release_unanswered
-- After a claim whose answer never came (its connection broke during it; a failover, a
-- restart): the jobs it may have taken run under this worker's name with tokens the worker
-- never saw, and would wait for their leases to expire and be counted. They go back to ready
-- now, the attempt not counted (the outage's, not the job's). Fenced by status and worker
-- name (unique per process, host:pid); the jobs the worker holds (`held`) are left alone.
UPDATE {schema}.job AS j
SET status = 'ready', attempts = j.attempts - 1, locked_until = NULL,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by, 'kind', 'abandoned',
                 'error', 'the claim''s answer was lost with its connection')))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
WHERE j.status = 'running' AND j.locked_by = %(worker)s AND NOT (j.id = ANY(%(held)s::bigint[]))
RETURNING j.id;

-- name: reap
-- Running jobs whose lease expired go back to ready (their lease was their delay), or dead
-- when the attempt that expired was the last one: a job that keeps crashing its worker
-- ends dead instead of taking workers down forever. Each expiry is recorded.
--
-- A worker's reaper passes the database time of its previous round (`previous`) and how
-- recent it must be (`continuity`, seconds): when this statement runs later than that after
-- the previous one (the reaper was cut off, its statement waited out a partition, the server
-- restarted), it reaps nothing this round. Every lease that expired meanwhile may belong to a
-- worker that was cut off just as long and is coming back to extend or give back its lease;
-- an outage must not count against their jobs. Without `continuity`, the gate is open. The
-- first row returned is the round itself: no job, status 'open' or 'closed', at now().
WITH gate AS (
    SELECT %(continuity)s::float8 IS NULL
           OR (%(previous)s::timestamptz IS NOT NULL
               AND now() - %(previous)s::timestamptz < make_interval(secs => %(continuity)s::float8)) AS open
), expired AS (
    SELECT id, locked_until FROM {schema}.job
    WHERE status = 'running' AND locked_until < now()
      -- The reaping worker's own jobs: it is still running them, or giving them up itself.
      AND NOT (id = ANY(%(own)s::bigint[]))
      AND (SELECT open FROM gate)
    ORDER BY locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE {schema}.job AS j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
        run_at = now(),
        finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
        locked_until = NULL,
        uncounted = 0,
        lease_expirations = j.lease_expirations + 1,
        last_error = format('lease expired: worker %%s stopped heartbeating during attempt %%s of %%s%%s',
                            coalesce(j.locked_by, '?'), j.attempts, j.max_attempts,
                            CASE WHEN j.attempts >= j.max_attempts
                                 THEN ' (attempts exhausted: the job may be crashing its worker)'
                                 ELSE '' END),
        errors = (j.errors || jsonb_build_array(jsonb_build_object(
                     'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                     'kind', 'lease_expired',
                     'error', format('lease expired at %%s', expired.locked_until))))
                 - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
    FROM expired
    WHERE j.id = expired.id
    RETURNING j.id, j.type, j.locked_by, j.attempts, j.status, expired.locked_until AS expired_at, j.queue
), logged AS (
    INSERT INTO {schema}.lease_expiry (job_id, job_type, worker, attempt, expired_at, outcome)
    SELECT id, type, locked_by, attempts, expired_at, status FROM reaped
)
SELECT NULL::bigint AS job_id, NULL::text AS type, NULL::text AS worker, NULL::integer AS attempt,
       CASE WHEN open THEN 'open' ELSE 'closed' END AS status, now() AS at, NULL::text AS queue
FROM gate
UNION ALL
SELECT id, type, locked_by, attempts, status, expired_at, queue FROM reaped;

-- name: requeue_by_id
-- Operator: dead or failed jobs back to ready now with a fresh set of attempts.
UPDATE {schema}.job AS j
SET status = 'ready', attempts = 0, run_at = now(), finished_at = NULL,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', %(actor)s::text,
                 'kind', 'requeued', 'error', format('requeued from %%s by %%s', j.status, %(actor)s::text))))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status IN ('dead', 'failed')
RETURNING j.id;

-- name: check_regex
-- Compiles the pattern once, so a bad one is an error even when no row would be compared.
SELECT '' ~* %(pattern)s;

-- name: dead_matching
-- The one definition of the dead and failed jobs an operator names by type and error:
-- `jobtui dead`, `jobtui requeue --type/--error/--all` (its dry run counts the same rows),
-- the console's dead groups and their filter. Read by column name. Grouped like the dead
-- pane (status, type, error fingerprint), each group with its ids when %(with_ids)s.
-- The error pattern is a case-insensitive PostgreSQL regular expression, matched against the
-- error's first line (the exception and its message, as `jobtui job` shows it) or its
-- fingerprint (that line with numbers, hex ids and UUIDs masked, as `jobtui dead` shows
-- it); never against the traceback below it, whose file and module names would match by
-- accident. With %(in_group)s, only the group of %(fingerprint)s (NULL: no error).
SELECT g.status, g.type, g.fingerprint, g.jobs, g.first_seen, g.last_seen, g.latest_id AS latest_job_id,
       j.attempts AS latest_attempts, coalesce(g.ids, ARRAY[]::bigint[]) AS job_ids
FROM (SELECT status, type, coalesce(error_fingerprint, '') AS fingerprint, count(*) AS jobs,
             min(finished_at) AS first_seen, max(finished_at) AS last_seen, max(id) AS latest_id,
             array_agg(id ORDER BY id) FILTER (WHERE %(with_ids)s) AS ids
      FROM {schema}.job
      WHERE status IN ('dead', 'failed')
        AND (%(status)s::text IS NULL OR status = %(status)s::text)
        AND (%(type)s::text IS NULL OR type = %(type)s::text)
        AND (NOT %(in_group)s OR error_fingerprint IS NOT DISTINCT FROM %(fingerprint)s::text)
        AND (%(error)s::text IS NULL
             OR split_part(last_error, E'\n', 1) ~* %(error)s::text
             OR error_fingerprint ~* %(error)s::text)
      GROUP BY status, type, error_fingerprint) AS g
JOIN {schema}.job AS j ON j.id = g.latest_id
ORDER BY g.jobs DESC, g.status, g.type, g.fingerprint;

-- name: dead_group_requeue
-- Operator: the given jobs of one dead-letter group (those the console counted and the
-- operator confirmed) back to ready with a fresh set of attempts; a job that left the group
-- since (requeued, cancelled, or dead again with another error) is left alone.
UPDATE {schema}.job AS j
SET status = 'ready', attempts = 0, run_at = now(), finished_at = NULL,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', %(actor)s::text,
                 'kind', 'requeued', 'error', format('requeued from %%s by %%s', j.status, %(actor)s::text))))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = %(status)s AND j.type = %(type)s
  AND j.error_fingerprint IS NOT DISTINCT FROM %(fingerprint)s
RETURNING j.id;

-- name: bulk_count
-- A bulk action's dry run, one window of ids at a time (bulk.py): how many jobs of the filter
-- the action would change now (%(scope)s: the statuses it applies to).
SELECT count(*) AS jobs FROM {schema}.job AS j
WHERE j.id < %(below)s AND j.id >= %(floor)s AND j.status = ANY(%(scope)s::text[])
      AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(matcher)s::text IS NULL OR split_part(j.last_error, E'\n', 1) ~* %(matcher)s::text
           OR j.error_fingerprint ~* %(matcher)s::text)
      AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
      AND (%(older_than)s::float8 IS NULL OR j.created_at < coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(older_than)s::float8))
      AND (%(newer_than)s::float8 IS NULL OR j.created_at >= coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(newer_than)s::float8))
      AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s::timestamptz);

-- name: bulk_run_find
-- The newest run of this action and filter that did not end: a second run resumes it.
SELECT id, action, filter, cutoff, last_id, next_id, changed, busy_ids, state, started_by, started_at
FROM {schema}.bulk_run
WHERE action = %(action)s AND filter = %(filter)s::jsonb AND state <> 'done'
ORDER BY id DESC LIMIT 1;

-- name: bulk_run_start
-- A new run: its cutoff is now, and it walks down from the newest job there is.
INSERT INTO {schema}.bulk_run (action, filter, cutoff, last_id, next_id, started_by)
SELECT %(action)s, %(filter)s::jsonb, now(), m.last_id, m.last_id + 1, %(actor)s
FROM (SELECT coalesce(max(id), 0) AS last_id FROM {schema}.job) AS m
RETURNING id, action, filter, cutoff, last_id, next_id, changed, busy_ids, state, started_by, started_at;

-- name: bulk_run_state
-- A run goes on (running), was stopped by its operator (stopped: a second run resumes it) or
-- is done.
UPDATE {schema}.bulk_run
SET state = %(state)s, updated_at = now(), finished_at = CASE WHEN %(state)s = 'done' THEN now() END
WHERE id = %(run)s
RETURNING changed;

-- name: bulk_requeue_batch
-- A batch of a bulk requeue (bulk.py): at most %(batch)s dead or failed jobs of the filter
-- among the ids from %(floor)s up to below %(below)s (or among %(ids)s, the jobs passed over
-- as busy), newest first, back to ready with a fresh set of attempts, and the run's progress,
-- in one statement: its own short transaction, holding at most a batch of row locks, taken
-- SKIP LOCKED (a job another transaction holds is passed over and tried again at the end).
-- Only jobs that finished before the run's cutoff: a job the run requeued that failed again
-- since is not requeued twice, by this run or by its resumption. Wakes the workers.
WITH run AS (
    SELECT id, cutoff FROM {schema}.bulk_run WHERE id = %(run)s AND state = 'running' FOR UPDATE
), candidates AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id < %(below)s AND j.id >= %(floor)s AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
      AND j.status IN ('dead', 'failed') AND j.finished_at < (SELECT cutoff FROM run)
      AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(matcher)s::text IS NULL OR split_part(j.last_error, E'\n', 1) ~* %(matcher)s::text
           OR j.error_fingerprint ~* %(matcher)s::text)
      AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
      AND (%(older_than)s::float8 IS NULL OR j.created_at < coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(older_than)s::float8))
      AND (%(newer_than)s::float8 IS NULL OR j.created_at >= coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(newer_than)s::float8))
      AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s::timestamptz)
    ORDER BY j.id DESC
    LIMIT %(batch)s
), picked AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id IN (SELECT id FROM candidates) AND j.status IN ('dead', 'failed')
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE {schema}.job AS j
    SET status = 'ready', attempts = 0, run_at = now(), finished_at = NULL,
        errors = (j.errors || jsonb_build_array(jsonb_build_object(
                     'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', %(actor)s::text,
                     'kind', 'requeued',
                     'error', format('requeued from %%s by %%s (bulk run %%s)', j.status, %(actor)s::text, %(run)s))))
                 - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
    WHERE j.id IN (SELECT id FROM picked) AND j.status IN ('dead', 'failed')
    RETURNING j.id
), progress AS (
    UPDATE {schema}.bulk_run AS r
    SET changed = r.changed + (SELECT count(*) FROM moved),
        next_id = CASE WHEN %(ids)s::bigint[] IS NOT NULL THEN r.next_id
                       WHEN (SELECT count(*) FROM candidates) >= %(batch)s THEN (SELECT min(id) FROM candidates)
                       ELSE %(floor)s END,
        busy_ids = CASE WHEN %(ids)s::bigint[] IS NOT NULL THEN ARRAY[]::bigint[] ELSE r.busy_ids END
                   || ARRAY(SELECT id FROM candidates EXCEPT SELECT id FROM moved),
        updated_at = now()
    WHERE r.id = (SELECT id FROM run)
    RETURNING r.next_id
)
SELECT (SELECT count(*) FROM moved) AS changed, (SELECT count(*) FROM candidates) AS candidates,
       (SELECT next_id FROM progress) AS next_id, EXISTS (SELECT 1 FROM run) AS running,
       ARRAY(SELECT id FROM candidates EXCEPT SELECT id FROM moved ORDER BY 1) AS busy,
       CASE WHEN EXISTS (SELECT 1 FROM moved) THEN pg_notify(%(channel)s::text, '') END AS woken;

-- name: bulk_discard_batch
-- A batch of a bulk discard: as bulk_requeue_batch, the dead or failed jobs deleted. Their
-- recorded effects go with the archiver's pruning.
WITH run AS (
    SELECT id, cutoff FROM {schema}.bulk_run WHERE id = %(run)s AND state = 'running' FOR UPDATE
), candidates AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id < %(below)s AND j.id >= %(floor)s AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
      AND j.status IN ('dead', 'failed') AND j.finished_at < (SELECT cutoff FROM run)
      AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(matcher)s::text IS NULL OR split_part(j.last_error, E'\n', 1) ~* %(matcher)s::text
           OR j.error_fingerprint ~* %(matcher)s::text)
      AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
      AND (%(older_than)s::float8 IS NULL OR j.created_at < coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(older_than)s::float8))
      AND (%(newer_than)s::float8 IS NULL OR j.created_at >= coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(newer_than)s::float8))
      AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s::timestamptz)
    ORDER BY j.id DESC
    LIMIT %(batch)s
), picked AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id IN (SELECT id FROM candidates) AND j.status IN ('dead', 'failed')
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM {schema}.job AS j
    WHERE j.id IN (SELECT id FROM picked) AND j.status IN ('dead', 'failed')
    RETURNING j.id
), progress AS (
    UPDATE {schema}.bulk_run AS r
    SET changed = r.changed + (SELECT count(*) FROM moved),
        next_id = CASE WHEN %(ids)s::bigint[] IS NOT NULL THEN r.next_id
                       WHEN (SELECT count(*) FROM candidates) >= %(batch)s THEN (SELECT min(id) FROM candidates)
                       ELSE %(floor)s END,
        busy_ids = CASE WHEN %(ids)s::bigint[] IS NOT NULL THEN ARRAY[]::bigint[] ELSE r.busy_ids END
                   || ARRAY(SELECT id FROM candidates EXCEPT SELECT id FROM moved),
        updated_at = now()
    WHERE r.id = (SELECT id FROM run)
    RETURNING r.next_id
)
SELECT (SELECT count(*) FROM moved) AS changed, (SELECT count(*) FROM candidates) AS candidates,
       (SELECT next_id FROM progress) AS next_id, EXISTS (SELECT 1 FROM run) AS running,
       ARRAY(SELECT id FROM candidates EXCEPT SELECT id FROM moved ORDER BY 1) AS busy;

-- name: bulk_cancel_batch
-- A batch of a bulk cancel: as bulk_requeue_batch, ready and running jobs enqueued before
-- the run's cutoff become failed, as `cancel` makes them; a running job's worker hears of it
-- on the schema's channel ('cancel <id>'), and its heartbeat's answer says so too. A job
-- whose handler is inside job.once()'s transaction holds its row: it is passed over as busy.
WITH run AS (
    SELECT id, cutoff FROM {schema}.bulk_run WHERE id = %(run)s AND state = 'running' FOR UPDATE
), candidates AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id < %(below)s AND j.id >= %(floor)s AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
      AND j.status IN ('ready', 'running') AND j.created_at < (SELECT cutoff FROM run)
      AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(matcher)s::text IS NULL OR split_part(j.last_error, E'\n', 1) ~* %(matcher)s::text
           OR j.error_fingerprint ~* %(matcher)s::text)
      AND (%(payload)s::jsonb IS NULL OR j.payload @> %(payload)s::jsonb)
      AND (%(older_than)s::float8 IS NULL OR j.created_at < coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(older_than)s::float8))
      AND (%(newer_than)s::float8 IS NULL OR j.created_at >= coalesce(%(at)s::timestamptz, now()) - make_interval(secs => %(newer_than)s::float8))
      AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s::timestamptz)
    ORDER BY j.id DESC
    LIMIT %(batch)s
), picked AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id IN (SELECT id FROM candidates) AND j.status IN ('ready', 'running')
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE {schema}.job AS j
    SET status = 'failed', locked_until = NULL, finished_at = now(),
        last_error = format('cancelled by %%s (bulk run %%s)', %(actor)s::text, %(run)s),
        errors = (j.errors || jsonb_build_array(jsonb_build_object(
                     'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                     'kind', 'cancelled', 'error', format('cancelled by %%s (bulk run %%s)', %(actor)s::text, %(run)s))))
                 - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
    WHERE j.id IN (SELECT id FROM picked) AND j.status IN ('ready', 'running')
    RETURNING j.id, CASE WHEN j.locked_by IS NOT NULL THEN pg_notify(%(channel)s::text, 'cancel ' || j.id) END AS told
), progress AS (
    UPDATE {schema}.bulk_run AS r
    SET changed = r.changed + (SELECT count(*) FROM moved),
        next_id = CASE WHEN %(ids)s::bigint[] IS NOT NULL THEN r.next_id
                       WHEN (SELECT count(*) FROM candidates) >= %(batch)s THEN (SELECT min(id) FROM candidates)
                       ELSE %(floor)s END,
        busy_ids = CASE WHEN %(ids)s::bigint[] IS NOT NULL THEN ARRAY[]::bigint[] ELSE r.busy_ids END
                   || ARRAY(SELECT id FROM candidates EXCEPT SELECT id FROM moved),
        updated_at = now()
    WHERE r.id = (SELECT id FROM run)
    RETURNING r.next_id
)
SELECT (SELECT count(*) FROM moved) AS changed, (SELECT count(*) FROM candidates) AS candidates,
       (SELECT next_id FROM progress) AS next_id, EXISTS (SELECT 1 FROM run) AS running,
       ARRAY(SELECT id FROM candidates EXCEPT SELECT id FROM moved ORDER BY 1) AS busy;

-- name: kill_lease
-- Operator: a running job returns to ready now, or goes dead when the killed attempt was its
-- last: a killed attempt counts, as an expired one does. Its worker's late outcome is
-- rejected because the status (and later the lease token) no longer match. The row lock is
-- taken first and skips a job whose handler is inside `job.once()`'s transaction (which
-- holds the row): its effect commits under the lease it was checked against, and the kill
-- is refused for now.
UPDATE {schema}.job AS j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
    run_at = now(), locked_until = NULL,
    finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
    uncounted = 0,
    last_error = format('lease killed by %%s during attempt %%s of %%s%%s', %(actor)s::text, j.attempts,
                        j.max_attempts,
                        CASE WHEN j.attempts >= j.max_attempts THEN ' (its last attempt: dead)' ELSE '' END),
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                 'kind', 'lease_killed', 'error', format('lease killed by %%s', %(actor)s::text))))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
WHERE j.id IN (SELECT id FROM {schema}.job
               WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running'
               FOR UPDATE SKIP LOCKED)
  AND j.status = 'running'
RETURNING j.id;

-- name: cancel
-- Operator: a ready or running job becomes failed; it will not run again unless requeued.
-- A running job's worker hears of it at once on the schema's channel ('cancel <id>'), and
-- its heartbeat's answer says so too, should the notification be lost; its late outcome is
-- refused either way, since the status no longer matches.
WITH cancelled AS (
    UPDATE {schema}.job AS j
    SET status = 'failed', locked_until = NULL, finished_at = now(),
        last_error = format('cancelled by %%s', %(actor)s::text),
        errors = (j.errors || jsonb_build_array(jsonb_build_object(
                     'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                     'kind', 'cancelled', 'error', format('cancelled by %%s', %(actor)s::text))))
                 - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status IN ('ready', 'running')
    RETURNING j.id, j.locked_by
)
SELECT id, CASE WHEN locked_by IS NOT NULL
                THEN pg_notify(%(channel)s::text, 'cancel ' || id) END AS told
FROM cancelled;

-- name: job_statuses
SELECT id, status FROM {schema}.job WHERE id = ANY(%(ids)s::bigint[]);

-- name: get_job
SELECT id, type, queue, payload, idempotency_key, status, run_at, attempts, max_attempts,
       locked_by, locked_until, lease_token, heartbeat_at, last_error, errors,
       lease_expirations, created_at, started_at, finished_at, now() AS db_now,
       CASE WHEN status = 'running' AND runner -> 'token' = to_jsonb(lease_token) THEN runner END AS runner
FROM {schema}.job WHERE id = %(id)s;

-- name: notify_ready
SELECT pg_notify(%(channel)s, '');

-- name: effect_record
-- Records effect `key` as done; inserts nothing when an earlier attempt already did. With a
-- lease token, only while that lease is the job's current one: a worker that froze or was cut
-- off past its lease (the job reaped, re-claimed or finished meanwhile) must not do effects.
-- Returns (lease held, recorded by this call).
--
-- The check locks the job's row FOR KEY SHARE until the caller's transaction ends. Reaping
-- and claiming lock rows FOR UPDATE SKIP LOCKED, so while the effect's transaction is open
-- nobody can take the job back or claim it again: the effect commits under the lease it was
-- checked against, or (checked after a re-claim) is refused. Heartbeats and outcomes take a
-- weaker lock (FOR NO KEY UPDATE) that does not conflict, so they go on meanwhile. An expired
-- lease counts as lost, by the database's clock at the moment of the check.
WITH lease AS (
    SELECT %(token)s::bigint IS NULL
           OR EXISTS (SELECT 1 FROM {schema}.job
                      WHERE id = %(job_id)s::bigint AND lease_token = %(token)s::bigint
                        AND status = 'running' AND locked_until > clock_timestamp()
                      FOR KEY SHARE) AS held
), recorded AS (
    INSERT INTO {schema}.effect (key, job_id)
    SELECT %(key)s::text, %(job_id)s::bigint FROM lease WHERE lease.held
    ON CONFLICT (key) DO NOTHING
    RETURNING key
)
SELECT (SELECT held FROM lease), EXISTS (SELECT 1 FROM recorded);

-- name: effect_exists
SELECT EXISTS (SELECT 1 FROM {schema}.effect WHERE key = %(key)s);

-- name: db_now
SELECT now();

-- name: schedule_upsert
-- Declares a schedule (from code or the CLI). A changed cron line or timezone restarts the
-- slot sequence from now; otherwise the slots already handled are kept.
INSERT INTO {schema}.schedule AS s
    (name, job_type, cron, timezone, payload, max_attempts, offset_seconds, missed_policy,
     grace_seconds, next_run_at, last_slot, source, queue)
VALUES (%(name)s, %(job_type)s, %(cron)s, %(timezone)s, %(payload)s, %(max_attempts)s,
        %(offset)s, %(missed_policy)s, %(grace)s, %(next_run_at)s, now(), %(source)s, %(queue)s)
ON CONFLICT (name) DO UPDATE
SET job_type = excluded.job_type,
    queue = excluded.queue,
    payload = excluded.payload,
    max_attempts = excluded.max_attempts,
    offset_seconds = excluded.offset_seconds,
    missed_policy = excluded.missed_policy,
    grace_seconds = excluded.grace_seconds,
    source = excluded.source,
    next_run_at = CASE WHEN (s.cron, s.timezone) = (excluded.cron, excluded.timezone)
                       THEN s.next_run_at ELSE excluded.next_run_at END,
    last_slot = CASE WHEN (s.cron, s.timezone) = (excluded.cron, excluded.timezone)
                     THEN s.last_slot ELSE now() END,
    cron = excluded.cron,
    timezone = excluded.timezone,
    updated_at = now()
RETURNING id;

-- name: schedule_due
-- Due schedules, locked for this transaction; other instances skip them. Read by column name.
SELECT id, name, job_type, cron, timezone, payload, max_attempts, offset_seconds,
       missed_policy, grace_seconds, last_slot, now() AS now, queue
FROM {schema}.schedule
WHERE NOT paused AND next_run_at <= now()
ORDER BY next_run_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: schedule_enqueue
-- One slot's job, in the schedule's queue; the key makes a second enqueue of the same slot
-- do nothing.
INSERT INTO {schema}.job (type, payload, idempotency_key, run_at, max_attempts, queue)
VALUES (%(type)s, %(payload)s, %(key)s, %(run_at)s, %(max_attempts)s, %(queue)s)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: schedule_advance
-- missed_count counts every missed slot, backfilled_count those of them fired late by the
-- policy; `missed` lists only the newest of them.
UPDATE {schema}.schedule AS s
SET last_slot = %(last_slot)s,
    next_run_at = %(next_run_at)s,
    last_fired_slot = coalesce(%(fired_slot)s, s.last_fired_slot),
    last_job_id = coalesce(%(job_id)s, s.last_job_id),
    missed_count = s.missed_count + %(missed_count)s,
    backfilled_count = s.backfilled_count + %(backfilled)s,
    missed_slots = (SELECT coalesce(jsonb_agg(x ORDER BY x), '[]'::jsonb)
                    FROM (SELECT x FROM (SELECT jsonb_array_elements_text(s.missed_slots)::timestamptz AS x
                                         UNION ALL SELECT unnest(%(missed)s::timestamptz[])) AS a
                          ORDER BY x DESC LIMIT 20) AS newest),
    updated_at = now()
WHERE s.id = %(id)s;

-- name: schedule_defer
-- A schedule whose slots cannot be computed waits until `until` instead of being due at
-- every tick; its last_slot is kept.
UPDATE {schema}.schedule SET next_run_at = %(until)s, updated_at = now() WHERE id = %(id)s;

-- name: schedule_next_due
-- Seconds until the next schedule is due (NULL when none is active).
SELECT extract(epoch FROM min(next_run_at) - now()) FROM {schema}.schedule WHERE NOT paused;

-- name: schedule_list
-- Read by column name (ScheduleRow's fields).
SELECT id, name, job_type, cron, timezone, payload, max_attempts, offset_seconds, missed_policy,
       grace_seconds, paused, paused_at, next_run_at, last_slot, last_fired_slot, last_job_id,
       missed_count, backfilled_count, missed_slots, skipped_count, source, created_at,
       now() AS db_now, queue
FROM {schema}.schedule
ORDER BY name;

-- name: schedule_lock
SELECT id, cron, timezone, paused, last_slot, paused_at, now()
FROM {schema}.schedule WHERE name = %(name)s FOR UPDATE;

-- name: schedule_pause
UPDATE {schema}.schedule SET paused = true, paused_at = now(), updated_at = now()
WHERE name = %(name)s AND NOT paused
RETURNING id;

-- name: schedule_resume
-- Slots that passed while paused are counted as skipped; the sequence restarts from now.
UPDATE {schema}.schedule
SET paused = false, paused_at = NULL, last_slot = now(), next_run_at = %(next_run_at)s,
    skipped_count = skipped_count + %(skipped)s, updated_at = now()
WHERE name = %(name)s AND paused
RETURNING id;

-- name: schedule_remove
DELETE FROM {schema}.schedule WHERE name = %(name)s RETURNING id;

-- name: schedule_get
-- Read by column name.
SELECT id, job_type, payload, max_attempts, queue FROM {schema}.schedule WHERE name = %(name)s;

-- name: archive_done
-- Moves done jobs past their retention to job_archive, a bounded batch at a time; SKIP
-- LOCKED lets several archivers share the work.
WITH moved AS (
    DELETE FROM {schema}.job
    WHERE id IN (SELECT id FROM {schema}.job
                 WHERE status = 'done' AND finished_at < now() - make_interval(secs => %(retention)s)
                 ORDER BY finished_at
                 LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED)
    RETURNING *
), archived AS (
    INSERT INTO {schema}.job_archive
        (id, type, payload, idempotency_key, status, run_at, attempts, max_attempts, locked_by,
         locked_until, lease_token, heartbeat_at, last_error, errors, lease_expirations,
         created_at, started_at, finished_at, error_fingerprint, uncounted, meta, queue, runner)
    SELECT id, type, payload, idempotency_key, status, run_at, attempts, max_attempts, locked_by,
           locked_until, lease_token, heartbeat_at, last_error, errors, lease_expirations,
           created_at, started_at, finished_at, error_fingerprint, uncounted, meta, queue, runner
    FROM moved
    RETURNING 1
)
SELECT count(*) FROM archived;

-- name: delete_done
WITH gone AS (
    DELETE FROM {schema}.job
    WHERE id IN (SELECT id FROM {schema}.job
                 WHERE status = 'done' AND finished_at < now() - make_interval(secs => %(retention)s)
                 ORDER BY finished_at
                 LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: delete_dead
-- Dead and failed jobs nobody acted on within their (longer) retention.
WITH gone AS (
    DELETE FROM {schema}.job
    WHERE id IN (SELECT id FROM {schema}.job
                 WHERE status IN ('dead', 'failed')
                   AND finished_at < now() - make_interval(secs => %(retention)s)
                 ORDER BY finished_at
                 LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: archive_partitions_add
-- The archive's partitions for today and the next `days` days, made where missing (migration
-- 0014): before the archiver moves rows in, days ahead of their use.
SELECT {schema}.archive_partitions_add(%(days)s);

-- name: archive_prune
-- Archived jobs past their retention: whole days dropped as partitions, and up to `limit`
-- rows deleted from the default partition and the legacy archive (migration 0014).
SELECT dropped, deleted FROM {schema}.archive_prune(make_interval(secs => %(retention)s), %(limit)s);

-- name: metrics_lock_timeout
-- For the snapshot's own transaction: wait this long for a lock on a queue table, then fail
-- (a snapshot must not hang behind the lock it would report). No JIT: on a big table the
-- planner's row estimates make it compile the small aggregates, which costs more than it saves.
SELECT set_config('lock_timeout', %(timeout)s, true), set_config('jit', 'off', true);

-- name: metrics_ready
-- Ready jobs by type, counted exactly while there are at most %(cap)s of them (the probe reads
-- that many entries of the ready index and stops); above, nothing is counted here and the
-- snapshot estimates (metrics_ready_size, metrics_minutes). The age counts only jobs already
-- due (a delayed job is not late). Due and delayed jobs are two ranges of the ready index,
-- each counted by plain aggregates: no per-row FILTER.
SELECT type, sum(jobs)::bigint AS ready, coalesce(sum(jobs) FILTER (WHERE due), 0)::bigint AS due,
       extract(epoch FROM now() - min(oldest)) AS oldest_age
FROM (SELECT type, true AS due, count(*) AS jobs, min(run_at) AS oldest
      FROM {schema}.job WHERE status = 'ready' AND run_at <= now()
      GROUP BY type
      UNION ALL
      SELECT type, false, count(*), NULL
      FROM {schema}.job WHERE status = 'ready' AND run_at > now()
      GROUP BY type) AS ready
WHERE (SELECT count(*) FROM (SELECT 1 FROM {schema}.job WHERE status = 'ready' ORDER BY run_at, id LIMIT %(cap)s + 1) AS probe)
      <= %(cap)s
GROUP BY type;

-- name: metrics_ready_size
-- What is cheap about the ready jobs however many there are: how many, counted up to
-- %(cap)s + 1; the oldest due job's age (the first entry of the ready index); the planner's
-- estimate of the index's entries (pg_class.reltuples, set by VACUUM and ANALYZE); and each
-- type's share of the table's rows in the planner's statistics (pg_stats, every status).
SELECT (SELECT count(*) FROM (SELECT 1 FROM {schema}.job WHERE status = 'ready' ORDER BY run_at, id LIMIT %(cap)s + 1) AS probe)
           AS counted,
       (SELECT extract(epoch FROM now() - run_at) FROM {schema}.job
        WHERE status = 'ready' AND run_at <= now() ORDER BY run_at, id LIMIT 1)::float8 AS oldest_age,
       (SELECT greatest(reltuples, 0)::bigint FROM pg_class
        WHERE oid = to_regclass(format('%%I.job_ready_idx', %(schema_name)s::text))) AS index_estimate,
       (SELECT jsonb_build_object('values', to_jsonb(most_common_vals::text::text[]), 'shares', to_jsonb(most_common_freqs))
        FROM pg_stats WHERE schemaname = %(schema_name)s AND tablename = 'job' AND attname = 'type'
          AND most_common_vals IS NOT NULL) AS type_shares;

-- name: metrics_minutes
-- The queue's last hour, minute by minute (queue_minute, written by the archiver); the
-- ready jobs by type only of the newest minute.
SELECT minute, recorded_at, ready, ready_due, oldest_ready_age, done, dead, lease_expiries,
       CASE WHEN minute = max(minute) OVER () THEN by_type END AS by_type
FROM {schema}.queue_minute
WHERE minute >= date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00') - interval '60 minutes'
ORDER BY minute;

-- name: metrics_running
SELECT type, locked_by AS worker, count(*) AS jobs, count(*) FILTER (WHERE locked_until < now()) AS expired,
       extract(epoch FROM now() - min(heartbeat_at)) AS heartbeat_age
FROM {schema}.job WHERE status = 'running'
GROUP BY type, locked_by;

-- name: metrics_dead
-- Dead and failed jobs grouped by type and error fingerprint. Plain aggregates (hashed, no
-- sort of the error texts); the latest job's attempts are one primary-key lookup per group.
SELECT g.status, g.type, g.fingerprint, g.jobs, g.first_seen, g.last_seen, g.latest_id, j.attempts
FROM (SELECT status, type, coalesce(error_fingerprint, '') AS fingerprint, count(*) AS jobs,
             min(finished_at) AS first_seen, max(finished_at) AS last_seen, max(id) AS latest_id
      FROM {schema}.job WHERE status IN ('dead', 'failed')
      GROUP BY status, type, error_fingerprint) AS g
JOIN {schema}.job AS j ON j.id = g.latest_id
ORDER BY g.jobs DESC;

-- name: metrics_dead_attempts
-- Dead and failed jobs of the last hour by type and attempts used (job_dead_idx: by type and
-- finished_at, so each type's last hour is one range).
SELECT type, attempts, count(*) AS jobs FROM {schema}.job
WHERE status IN ('dead', 'failed') AND finished_at > now() - interval '1 hour'
GROUP BY type, attempts;

-- name: metrics_done_minutes
-- Done jobs by calendar minute, type and attempts used: the done rows, from job_finished_idx
-- alone, plus the jobs counted in done_tally (deleted at completion): the minutes of the last
-- hour from %(since)s on (NULL: the whole hour; a reader that keeps the settled minutes of
-- its previous snapshot asks for the last few only), and how many of them finished in the
-- last 60 seconds, for a jobs-per-minute figure that does not jump at minute starts. A tally
-- row knows when its jobs ran, not each job's second: its jobs count in the last 60 seconds
-- in proportion to the part of their span (from the first start, or the minute's start if
-- later, to the last finish) that lies within them.
-- date_bin is plain arithmetic on the timestamp, where date_trunc converts to a time zone.
WITH bounds AS (
    SELECT greatest(%(since)s::timestamptz,
                    date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00')
                    - interval '59 minutes') AS since
)
SELECT minute, type, attempts, sum(jobs)::bigint AS jobs, round(sum(recent))::bigint AS recent
FROM (
    SELECT date_bin('1 minute', finished_at, timestamptz '2000-01-01 00:00:00+00') AS minute,
           type, attempts, count(*) AS jobs,
           count(*) FILTER (WHERE finished_at > now() - interval '60 seconds')::numeric AS recent
    FROM {schema}.job
    WHERE status = 'done' AND finished_at >= (SELECT since FROM bounds)
    GROUP BY 1, 2, 3
    UNION ALL
    SELECT minute, type, attempts, sum(jobs),
           sum(jobs * CASE
               WHEN last_finished_at <= now() - interval '60 seconds' THEN 0
               WHEN greatest(first_started_at, minute) >= now() - interval '60 seconds' THEN 1
               ELSE extract(epoch FROM last_finished_at - (now() - interval '60 seconds'))
                    / extract(epoch FROM last_finished_at - greatest(first_started_at, minute))
           END)
    FROM {schema}.done_tally
    WHERE minute >= (SELECT since FROM bounds)
    GROUP BY 1, 2, 3
) AS done
GROUP BY 1, 2, 3;

-- name: metrics_day
-- The last 24 completed hours' summaries (filled by the archiver).
SELECT status, attempts, sum(jobs)::bigint AS jobs FROM {schema}.stats_hourly
WHERE hour >= date_trunc('hour', now()) - interval '24 hours'
GROUP BY status, attempts;

-- name: metrics_lease_expiries
-- Expirations per hour of the last 24 hours (hours ago, count): whole hours between the
-- truncated times, by a binary search of the 25 hour starts as above.
SELECT 25 - width_bucket(reaped_at,
                         (SELECT array_agg(h ORDER BY h)
                          FROM generate_series(date_trunc('hour', now()) - interval '24 hours',
                                               date_trunc('hour', now()), interval '1 hour') AS h)) AS hours_ago,
       count(*) AS expiries
FROM {schema}.lease_expiry WHERE reaped_at > now() - interval '24 hours'
GROUP BY 1;

-- name: metrics_recent_expiries
SELECT job_id, job_type AS type, worker, attempt, expired_at, reaped_at, outcome
FROM {schema}.lease_expiry ORDER BY reaped_at DESC, id DESC LIMIT %(limit)s;

-- name: metrics_schedules
-- Read by column name (ScheduleHealth's fields).
SELECT name, job_type, cron, paused, next_run_at, last_slot, missed_count AS missed,
       backfilled_count AS backfilled, skipped_count AS skipped, missed_slots, grace_seconds AS grace,
       coalesce(extract(epoch FROM next_run_at - now()), 0)::float8 AS next_in, queue
FROM {schema}.schedule ORDER BY name;

-- name: metrics_tables
-- Table health from the statistics collector, plus an estimate of all rows (no scan). The
-- partitions of a partitioned table (job_archive's days) count as that table: the partitioned
-- table itself holds no rows, and a row per day would come and go with the days.
SELECT coalesce(p.relname, s.relname) AS table, sum(s.n_live_tup)::bigint AS live_rows,
       sum(s.n_dead_tup)::bigint AS dead_rows, max(s.last_autovacuum) AS last_autovacuum,
       max(s.last_vacuum) AS last_vacuum, max(s.last_autoanalyze) AS last_autoanalyze,
       sum(greatest(c.reltuples, 0))::bigint AS rows_estimate
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
LEFT JOIN pg_inherits i ON i.inhrelid = s.relid AND c.relispartition
LEFT JOIN pg_class p ON p.oid = i.inhparent
WHERE s.schemaname = %(schema_name)s
GROUP BY 1;

-- name: metrics_lock_waits
-- Sessions of this database waiting for a lock while they work on jobtui's tables, by the
-- kind of lock they wait for, with the longest wait of each kind. A session waiting for a row
-- that another transaction holds (FOR UPDATE, an UPDATE) waits for that transaction's id, and
-- the sessions queued behind it for the row's tuple lock: the first names no table, so a wait
-- counts when it is for a table of the schema (or one of its indexes), for jobtui's
-- migration lock (advisory), or when the waiting session holds a lock on such a table (the
-- table lock its statement took before reaching the row). A claim waiting its turn under a
-- queue's global limit (claim_limited's lock, keyed by the schema and the queue, as in
-- migration 0008) is its own kind, queue_limit: that wait is the limit working, not a lock
-- held too long. So is a claim of a rated queue or type waiting for the claim before it to
-- commit its token bucket (claim_rated locks the bucket's row, migration 0013): rate_limit.
-- That wait is for the bucket's row: for its tuple lock (queued behind the first waiter), or
-- for the holder's transaction id while holding that tuple lock (the first waiter). An
-- advisory key of 64 bits is shown in pg_locks as classid (its high half) and objid (its low
-- half). Sessions are matched by pid, both views being per server; pg_locks shows every
-- role's locks and when each wait began.
WITH tables AS (
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema_name)s
), buckets AS (
    SELECT to_regclass(format('%%I.rate_bucket', %(schema_name)s::text)) AS oid
), limit_keys AS (
    SELECT hashtextextended('{schema}.queue_limit.' || name, 0) AS key FROM {schema}.queue_control
    WHERE kind = 'queue'
), waits AS (
    SELECT CASE WHEN l.locktype = 'advisory' AND l.objsubid = 1
                     AND ((l.classid::bigint << 32) | l.objid::bigint) IN (SELECT key FROM limit_keys)
                THEN 'queue_limit'
                WHEN l.locktype = 'tuple' AND l.relation = (SELECT oid FROM buckets)
                     OR l.locktype = 'transactionid'
                        AND EXISTS (SELECT 1 FROM pg_locks t
                                    WHERE t.pid = l.pid AND t.granted AND t.locktype = 'tuple'
                                      AND t.relation = (SELECT oid FROM buckets))
                THEN 'rate_limit'
                WHEN l.locktype IN ('relation', 'transactionid', 'tuple', 'advisory') THEN l.locktype
                ELSE 'other' END AS kind,
           coalesce(l.waitstart, a.query_start, clock_timestamp()) AS since
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE NOT l.granted AND a.datname = current_database()
      AND (l.relation IN (SELECT oid FROM tables)
           OR (l.locktype = 'advisory' AND l.classid = 0 AND l.objid = %(advisory_key)s::bigint::oid
               AND l.objsubid = 1)
           OR EXISTS (SELECT 1 FROM pg_locks h
                      WHERE h.pid = l.pid AND h.granted AND h.relation IN (SELECT oid FROM tables)))
)
SELECT kind, count(*) AS sessions, greatest(0, extract(epoch FROM clock_timestamp() - min(since)))::float8 AS longest
FROM waits GROUP BY kind;

-- name: metrics_oldest_xact
-- The oldest open transaction of a client session in this database: it holds back vacuum on
-- the queue table (by its snapshot or its transaction id; an idle one in READ COMMITTED has
-- neither between statements, but takes a snapshot again at its next one) and keeps its locks.
SELECT extract(epoch FROM now() - xact_start) AS age, pid, coalesce(application_name, '') AS application,
       coalesce(state, '') AS state
FROM pg_stat_activity
WHERE datname = current_database() AND xact_start IS NOT NULL AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
ORDER BY xact_start LIMIT 1;

-- name: metrics_recovery
-- Whether this server is a standby, and how far its figures are behind the primary's: 0 when
-- it streams and has replayed all it received, else the time since the last transaction it
-- replayed (that also grows while the primary commits nothing), null when it replayed none
-- yet. Null on a primary. Runs on a hot standby, as every statement of the snapshot does.
SELECT pg_is_in_recovery() AS standby,
       (CASE WHEN NOT pg_is_in_recovery() THEN NULL
             WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
                  AND (SELECT status FROM pg_stat_wal_receiver) = 'streaming' THEN 0
             WHEN pg_last_xact_replay_timestamp() IS NOT NULL
                  THEN greatest(0, extract(epoch FROM now() - pg_last_xact_replay_timestamp()))
        END)::float8 AS replay_lag;

-- name: stats_missing_hours
-- Completed hours of the last day that have no summary yet.
SELECT h FROM generate_series(date_trunc('hour', now()) - interval '24 hours',
                              date_trunc('hour', now()) - interval '1 hour', interval '1 hour') AS h
WHERE NOT EXISTS (SELECT 1 FROM {schema}.stats_hourly s WHERE s.hour = h);

-- name: stats_summarise_hour
-- One completed hour's finished jobs by type, status and attempts, plus a marker row so an
-- hour with no jobs is not summarised again.
INSERT INTO {schema}.stats_hourly (hour, type, status, attempts, jobs)
-- Done and dead/failed are read apart so each part uses its own partial index. Jobs deleted
-- at completion were counted by the minute in done_tally; the hour's minutes hold them all.
SELECT %(hour)s::timestamptz, type, 'done', attempts, sum(jobs)::bigint
FROM (SELECT type, attempts, count(*) AS jobs
      FROM {schema}.job
      WHERE status = 'done'
        AND finished_at >= %(hour)s::timestamptz AND finished_at < %(hour)s::timestamptz + interval '1 hour'
      GROUP BY type, attempts
      UNION ALL
      SELECT type, attempts, sum(jobs)
      FROM {schema}.done_tally
      WHERE minute >= %(hour)s::timestamptz AND minute < %(hour)s::timestamptz + interval '1 hour'
      GROUP BY type, attempts) AS done
GROUP BY type, attempts
UNION ALL
SELECT %(hour)s::timestamptz, type, status, attempts, count(*)
FROM {schema}.job
WHERE status IN ('dead', 'failed')
  AND finished_at >= %(hour)s::timestamptz AND finished_at < %(hour)s::timestamptz + interval '1 hour'
GROUP BY type, status, attempts
UNION ALL
SELECT %(hour)s::timestamptz, '', 'summarised', 0, 0
ON CONFLICT DO NOTHING;

-- name: stats_prune_hours
DELETE FROM {schema}.stats_hourly WHERE hour < now() - interval '8 days';

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

-- name: prune_done_tally
-- Minutes older than the day the hourly summaries cover, once their hours are summarised.
DELETE FROM {schema}.done_tally
WHERE minute < date_trunc('hour', now()) - interval '25 hours';

-- name: audit_insert
INSERT INTO {schema}.audit (actor, action, target, job_ids, rows, detail)
VALUES (%(actor)s, %(action)s, %(target)s, %(job_ids)s, %(rows)s, %(detail)s)
RETURNING id;

-- name: audit_list
SELECT id, at, actor, action, target, job_ids, rows, detail FROM {schema}.audit
ORDER BY id DESC LIMIT %(limit)s;

-- name: metrics_lease_expiry_total
-- Every expiry ever recorded: identity values only grow, even after old rows are pruned.
SELECT coalesce(max(id), 0) AS total FROM {schema}.lease_expiry;

-- name: prune_lease_expiry
DELETE FROM {schema}.lease_expiry WHERE reaped_at < now() - interval '8 days';

-- name: prune_audit
-- Through the schema owner's function (migration 0006): the worker role may not delete audit
-- rows itself, and the function keeps every row younger than 30 days whatever it is asked.
SELECT {schema}.prune_audit(make_interval(secs => %(retention)s), %(limit)s);

-- name: prune_effect
-- Effects older than their retention, unless their job may still run (it is in the queue
-- and not done): a requeued dead job must find the effects of its earlier attempts. No row
-- lock first (it would need UPDATE on the table): two archivers at once wait on each other's
-- deletes at worst, and a batch is small.
WITH gone AS (
    DELETE FROM {schema}.effect
    WHERE key IN (SELECT e.key FROM {schema}.effect AS e
                  WHERE e.created_at < now() - make_interval(secs => %(retention)s)
                    AND NOT EXISTS (SELECT 1 FROM {schema}.job AS j
                                    WHERE j.id = e.job_id AND j.status <> 'done')
                  ORDER BY e.created_at
                  LIMIT %(limit)s)
    RETURNING 1
)
SELECT count(*) FROM gone;

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
SELECT id, type, locked_by AS worker, attempts AS attempt, max_attempts,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age, extract(epoch FROM locked_until - now()) AS lease_left,
       extract(epoch FROM now() - started_at) AS running_for, locked_until,
       CASE WHEN runner -> 'token' = to_jsonb(lease_token) THEN runner END AS runner
FROM {schema}.job
WHERE status = 'running'
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

-- name: schedule_rewind
-- Moves a schedule's handled slots back in time, as if every scheduler had been down for
-- that long (used by the demo and by drills of the missed-slot policies).
UPDATE {schema}.schedule
SET last_slot = now() - make_interval(secs => %(seconds)s),
    next_run_at = now() - make_interval(secs => %(seconds)s),
    updated_at = now()
WHERE name = %(name)s
RETURNING id;

-- name: privileges_missing
-- Which of the given privileges the session's role lacks: table privileges as (table,
-- privilege) pairs, plus USAGE on the schema, USAGE on its sequences and EXECUTE on its
-- functions. Reads the catalog only. The schema's sequences are listed first (MATERIALIZED):
-- the privilege check fails on a relation that is not a sequence, wherever the planner put it.
WITH sequences AS MATERIALIZED (
    SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE %(sequences)s AND n.nspname = %(schema_name)s AND c.relkind = 'S'
)
SELECT format('%%s on %%I.%%I', t.privilege, %(schema_name)s::text, t.tbl)
FROM unnest(%(tables)s::text[], %(privileges)s::text[]) AS t(tbl, privilege)
WHERE NOT has_table_privilege(format('%%I.%%I', %(schema_name)s::text, t.tbl), t.privilege)
UNION ALL
SELECT format('USAGE on schema %%I', %(schema_name)s::text)
WHERE NOT has_schema_privilege(%(schema_name)s::text, 'USAGE')
UNION ALL
SELECT format('USAGE on sequence %%I.%%I', %(schema_name)s::text, s.relname)
FROM sequences s WHERE NOT has_sequence_privilege(s.oid, 'USAGE')
UNION ALL
SELECT format('EXECUTE on function %%s', p.oid::regprocedure)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE %(functions)s AND n.nspname = %(schema_name)s AND NOT has_function_privilege(p.oid, 'EXECUTE');

-- name: claim_session
-- Settings of a worker's claiming connection (worker/producer.py): the claim must walk the
-- ready index in order, so the plans that would sort every ready row (a bitmap scan after a
-- bulk enqueue, while statistics lag) are off; timestamps load faster in UTC than in a named
-- zone (the same instants, shown in another zone).
SELECT set_config('enable_bitmapscan', 'off', false), set_config('enable_seqscan', 'off', false),
       set_config('jit', 'off', false), set_config('TimeZone', 'UTC', false);

-- name: claim_transaction
-- The same planner settings for one claim's transaction, behind a transaction pooler (where
-- a session setting would outlive the transaction, on a server connection another client
-- gets next). The time zone stays the server's: a pooler such as PgBouncer tracks it.
SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true),
       set_config('jit', 'off', true);

-- name: listen
-- A worker's wake-ups: every insert into the job table notifies this channel.
LISTEN {channel};

-- name: schema_drop
-- `jobtui demo --reset` and `jobtui bench`: a schema of their own, dropped whole.
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- name: uninstall_contents
-- `jobtui uninstall`, before it asks: what the schema holds. Rows are counted up to %(cap)s
-- only, so that the question comes at once however long the backlog; leases still live say
-- that workers run.
SELECT current_database() AS database, pg_get_userbyid(n.nspowner) AS owner,
       (SELECT count(*) FROM (SELECT FROM {schema}.job LIMIT %(cap)s) AS j) AS jobs,
       (SELECT count(*) FROM (SELECT FROM {schema}.job_archive LIMIT %(cap)s) AS a) AS archived,
       (SELECT count(*) FROM (SELECT FROM {schema}.schedule LIMIT %(cap)s) AS s) AS schedules,
       (SELECT count(*) FROM (SELECT FROM {schema}.audit LIMIT %(cap)s) AS u) AS audit_rows,
       (SELECT count(*) FROM {schema}.job WHERE status = 'running' AND locked_until > now()) AS live_leases,
       (SELECT coalesce(array_agg(DISTINCT locked_by), '{{}}') FROM {schema}.job
        WHERE status = 'running' AND locked_until > now()) AS workers,
       (SELECT count(*) FROM pg_class AS c WHERE c.relnamespace = n.oid AND c.relkind IN ('r', 'p')) AS tables,
       (SELECT count(*) FROM pg_class AS c WHERE c.relnamespace = n.oid AND c.relkind = 'S') AS sequences,
       (SELECT count(*) FROM pg_class AS c WHERE c.relnamespace = n.oid AND c.relkind IN ('v', 'm')) AS views,
       (SELECT count(*) FROM pg_proc AS p WHERE p.pronamespace = n.oid) AS functions,
       pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on' AS read_only
FROM pg_namespace AS n WHERE n.nspname = %(schema_name)s;

-- name: uninstall_roles
-- The roles that hold privileges in the schema (on it, or on its tables and sequences), and
-- those docs/grants.sql created for it: their comment is the mark the file leaves, `mark`
-- filled with the schema and this database. `jobtui uninstall` drops the marked ones; the
-- others (the schema's owner, roles that existed before) keep existing.
WITH ns AS (
    SELECT oid, nspowner, nspacl FROM pg_namespace WHERE nspname = %(schema_name)s
), granted AS (
    SELECT (aclexplode(nspacl)).grantee AS oid FROM ns WHERE nspacl IS NOT NULL
    UNION
    SELECT (aclexplode(c.relacl)).grantee FROM pg_class AS c
    WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relacl IS NOT NULL
)
SELECT r.rolname AS role,
       coalesce(shobj_description(r.oid, 'pg_authid') = format(%(mark)s::text, %(schema_name)s::text,
                                                                current_database()), false) AS made_by_grants
FROM pg_roles AS r
WHERE (r.oid IN (SELECT oid FROM granted)
       OR shobj_description(r.oid, 'pg_authid') = format(%(mark)s::text, %(schema_name)s::text, current_database()))
  AND r.oid <> (SELECT nspowner FROM ns)
ORDER BY r.rolname;

-- name: uninstall_lock_timeout
-- `jobtui uninstall` waits this long at most for the schema's tables, in its transaction.
SELECT set_config('lock_timeout', %(lock_timeout)s, true);

-- name: role_to_drop
-- `jobtui uninstall`: the role role_drop drops, as a setting of this transaction only.
SELECT set_config('jobtui.role_to_drop', %(role)s, true);

-- name: role_drop
-- DO takes no parameters: the role's name comes from the setting role_to_drop made, quoted.
DO $$ BEGIN EXECUTE format('DROP ROLE %%I', current_setting('jobtui.role_to_drop')); END $$;

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

-- name: jobs_page
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

-- name: jobs_scan
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
FROM {schema}.job
WHERE id < %(below)s AND id >= %(floor)s
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(matcher)s::text IS NULL OR split_part(last_error, E'\n', 1) ~* %(matcher)s::text
       OR error_fingerprint ~* %(matcher)s::text)
  AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
  AND (%(older_than)s::float8 IS NULL OR created_at < now() - make_interval(secs => %(older_than)s::float8))
  AND (%(newer_than)s::float8 IS NULL OR created_at >= now() - make_interval(secs => %(newer_than)s::float8))
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(error)s::text IS NULL OR last_error ~ %(error)s::text)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: jobs_scan_count
-- How many jobs of the filter there are among the ids of a window, by status and type (the
-- search's count, window by window, as jobs_scan).
SELECT status, type, count(*) AS jobs
FROM {schema}.job
WHERE id < %(below)s AND id >= %(floor)s
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(matcher)s::text IS NULL OR split_part(last_error, E'\n', 1) ~* %(matcher)s::text
       OR error_fingerprint ~* %(matcher)s::text)
  AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
  AND (%(older_than)s::float8 IS NULL OR created_at < now() - make_interval(secs => %(older_than)s::float8))
  AND (%(newer_than)s::float8 IS NULL OR created_at >= now() - make_interval(secs => %(newer_than)s::float8))
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(error)s::text IS NULL OR last_error ~ %(error)s::text)
GROUP BY status, type;

-- name: jobs_bounds
-- The lowest and highest job id (two ends of the primary key), and whether the payload's GIN
-- index exists and is valid (an interrupted CREATE INDEX CONCURRENTLY leaves it invalid).
SELECT (SELECT min(id) FROM {schema}.job) AS lowest, (SELECT max(id) FROM {schema}.job) AS highest,
       EXISTS (SELECT 1 FROM pg_index i
               WHERE i.indexrelid = to_regclass(format('%%I.job_payload_idx', %(schema_name)s::text))
                 AND i.indisvalid) AS payload_index;

-- name: search_timeout
-- For one statement of a search or a bulk action, in its own transaction: the server cancels
-- it after this long (a transaction's setting: nothing outlives it behind a pooler).
SELECT set_config('statement_timeout', %(timeout)s, true), set_config('jit', 'off', true);

-- name: payload_index_state
-- The payload's GIN index: absent (no row), valid, or left invalid by an interrupted build.
SELECT i.indisvalid AS valid, pg_relation_size(i.indexrelid) AS bytes
FROM pg_index i
WHERE i.indexrelid = to_regclass(format('%%I.job_payload_idx', %(schema_name)s::text));

-- name: payload_index_create
-- `jobtui index payload`: outside a transaction, without blocking enqueues or claims.
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_payload_idx ON {schema}.job USING gin (payload jsonb_path_ops);

-- name: payload_index_drop
DROP INDEX CONCURRENTLY IF EXISTS {schema}.job_payload_idx;

-- name: payload_index_progress
-- How far a CREATE INDEX CONCURRENTLY of the job table is (from another session).
SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total
FROM pg_stat_progress_create_index
WHERE relid = to_regclass(format('%%I.job', %(schema_name)s::text));

-- name: jobs_count
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

-- name: testing_enqueued
-- jobtui.testing: the jobs of a type whose payload holds the given keys and values, as the
-- caller's connection sees them (its own open transaction included).
SELECT id, type, payload, idempotency_key AS key, status, run_at, created_at
FROM {schema}.job
WHERE type = %(type)s AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
ORDER BY id;

-- name: queue_overview
-- `jobtui queue list`, `stats`, Prometheus and the console's Queues pane: per queue and per job
-- type, the ready jobs (and how many are due), running ones, the oldest due job's age (a
-- pause makes it grow: that is what the pause costs), jobs done in the last minute, and the
-- queue's limit and pause. Queues and types with no job but a control row are listed too.
-- Read by column name; runs on a timer, so it reads a bounded number of rows however big the
-- backlog (jobtui/overview.py says what it makes of them):
-- * the ready jobs: all of them while there are at most %(cap)s (`head_rows`, counted in the
--   ready index up to %(cap)s + 1, as the snapshot's probe); above, the first %(cap)s + 1 in
--   claim order and the rows behind them (the index holds the type, not the queue). A
--   queue's oldest age is then still exact when one of its due jobs is among them (its first
--   one is its oldest), and so is every figure of the due jobs while the newest of them is
--   delayed (`newest_age` < 0);
-- * the done jobs of the last minute: at most the newest %(cap)s + 1 (`done_since` says the
--   seconds they span); jobs deleted at completion are counted by type only, in done_tally,
--   and not here;
-- * the running jobs, as many as the workers run.
WITH probe AS MATERIALIZED (
    SELECT count(*) AS n
    FROM (SELECT 1 FROM {schema}.job WHERE status = 'ready' ORDER BY run_at, id LIMIT %(cap)s + 1) AS p
), head AS MATERIALIZED (
    -- Two branches, one of them empty: counted in any order, or the first ones in claim order.
    SELECT queue, type, run_at FROM {schema}.job
    WHERE status = 'ready' AND (SELECT n FROM probe) <= %(cap)s
    UNION ALL
    (SELECT queue, type, run_at FROM {schema}.job
     WHERE status = 'ready' AND (SELECT n FROM probe) > %(cap)s
     ORDER BY run_at, id
     LIMIT %(cap)s + 1)
), recent AS MATERIALIZED (
    SELECT queue, type, finished_at FROM {schema}.job
    WHERE status = 'done' AND finished_at > now() - interval '1 minute'
    ORDER BY finished_at DESC
    LIMIT %(cap)s + 1
), pairs AS (
    SELECT queue, type, sum(ready) AS ready, sum(due) AS due, min(oldest) AS oldest, max(newest) AS newest,
           sum(running) AS running, sum(done) AS done, min(done_since) AS done_since
    FROM (SELECT queue, type, count(*) AS ready, count(*) FILTER (WHERE run_at <= now()) AS due,
                 min(run_at) FILTER (WHERE run_at <= now()) AS oldest, max(run_at) AS newest,
                 0 AS running, 0 AS done, NULL::timestamptz AS done_since
          FROM head GROUP BY queue, type
          UNION ALL
          SELECT queue, type, 0, 0, NULL, NULL, count(*), 0, NULL
          FROM {schema}.job WHERE status = 'running' GROUP BY queue, type
          UNION ALL
          SELECT queue, type, 0, 0, NULL, NULL, 0, count(*), min(finished_at)
          FROM recent GROUP BY queue, type) AS p
    GROUP BY queue, type
), grouped AS (
    SELECT 'queue' AS kind, queue AS name, sum(ready) AS ready, sum(due) AS due, min(oldest) AS oldest,
           max(newest) AS newest, sum(running) AS running, sum(done) AS done, min(done_since) AS done_since
    FROM pairs GROUP BY queue
    UNION ALL
    SELECT 'type', type, sum(ready), sum(due), min(oldest), max(newest), sum(running), sum(done), min(done_since)
    FROM pairs GROUP BY type
)
SELECT coalesce(g.kind, c.kind) AS kind, coalesce(g.name, c.name) AS name,
       coalesce(g.ready, 0)::bigint AS ready, coalesce(g.due, 0)::bigint AS due,
       coalesce(g.running, 0)::bigint AS running, coalesce(g.done, 0)::bigint AS done_last_minute,
       extract(epoch FROM now() - g.oldest)::float8 AS oldest_age,
       c.max_running, c.paused_at, c.paused_by,
       c.rate_per_second AS rate, CASE WHEN c.ramp_until > now() THEN c.ramp_until END AS ramp_until,
       {schema}.control_rate(c.rate_per_second, c.ramp_from, c.ramp_until, now()) AS rate_now,
       (SELECT n FROM probe) AS head_rows,
       extract(epoch FROM now() - g.newest)::float8 AS newest_age,
       extract(epoch FROM now() - g.done_since)::float8 AS done_span
FROM grouped AS g
FULL JOIN {schema}.queue_control AS c ON c.kind = g.kind AND c.name = g.name
WHERE g.name IS NOT NULL OR c.paused_at IS NOT NULL OR c.max_running IS NOT NULL
   OR c.rate_per_second IS NOT NULL OR c.ramp_until > now()
ORDER BY 1, 2;

-- name: queue_overview_estimate
-- What the queue overview estimates from when the ready jobs are too many to count: the
-- archiver's newest minute row (its ready jobs by queue and by type, counted once that
-- minute), the planner's estimate of the ready index's entries, and the share of each queue
-- and type among the table's rows in the planner's statistics (pg_stats: most common values,
-- over every status). Catalog and one small table only.
SELECT (SELECT greatest(reltuples, 0)::bigint FROM pg_class
        WHERE oid = to_regclass(format('%%I.job_ready_idx', %(schema_name)s::text))) AS index_estimate,
       m.recorded_at, extract(epoch FROM now() - m.recorded_at)::float8 AS minute_age, m.by_queue, m.by_type,
       (SELECT jsonb_object_agg(s.attname, jsonb_build_object('values', to_jsonb(s.most_common_vals::text::text[]),
                                                              'shares', to_jsonb(s.most_common_freqs)))
        FROM pg_stats AS s
        WHERE s.schemaname = %(schema_name)s AND s.tablename = 'job' AND s.attname IN ('queue', 'type')
          AND s.most_common_vals IS NOT NULL) AS planner
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT recorded_at, ready, by_queue, by_type FROM {schema}.queue_minute
                   ORDER BY minute DESC LIMIT 1) AS m ON true;

-- name: queue_pause
-- Operator: pause a queue or a job type on every worker, from each one's next claim. Fenced
-- by the state it expects: returns a row only when it was not paused.
INSERT INTO {schema}.queue_control AS c (kind, name, paused_at, paused_by, changed_by)
VALUES (%(kind)s, %(name)s, now(), %(actor)s, %(actor)s)
ON CONFLICT (kind, name) DO UPDATE
SET paused_at = now(), paused_by = excluded.paused_by, changed_at = now(), changed_by = excluded.changed_by
WHERE c.paused_at IS NULL
RETURNING c.name;

-- name: queue_resume
-- Operator: resume a paused queue or type; returns a row only when it was paused. Wakes the
-- workers, so that they claim at once rather than at their next poll. With a ramp of
-- %(ramp)s seconds the rate then rises over that time (control_rate, migration 0013), from an
-- empty bucket; without one any earlier ramp ends.
WITH resumed AS (
    UPDATE {schema}.queue_control AS c
    SET paused_at = NULL, paused_by = NULL, changed_at = now(), changed_by = %(actor)s,
        ramp_from = CASE WHEN %(ramp)s::float8 > 0 THEN now() END,
        ramp_until = CASE WHEN %(ramp)s::float8 > 0 THEN now() + make_interval(secs => %(ramp)s::float8) END
    WHERE c.kind = %(kind)s AND c.name = %(name)s AND c.paused_at IS NOT NULL
    RETURNING c.kind, c.name
), bucket AS (
    INSERT INTO {schema}.rate_bucket AS b (kind, name, tokens, refilled_at)
    SELECT kind, name, 0, now() FROM resumed WHERE %(ramp)s::float8 > 0
    ON CONFLICT (kind, name) DO UPDATE SET tokens = 0, refilled_at = now()
)
SELECT name, pg_notify(%(channel)s::text, '') AS woken FROM resumed;

-- name: queue_limit
-- Operator: set (or with NULL clear) how many jobs of a queue run at once across every
-- worker, from each one's next claim. Fenced by the limit the operator saw (`expected`,
-- compared with IS NOT DISTINCT FROM) when `fenced`; returns the limit it found and whether it
-- replaced it (not when it had changed meanwhile). Wakes the workers when it did, since a
-- higher limit leaves room now.
-- The limit before is read once, in `allowed`, which the insert reads first: read again after
-- the insert, the row it locked FOR UPDATE would be the one this statement just changed, and
-- come back empty.
WITH before AS MATERIALIZED (
    SELECT max_running FROM {schema}.queue_control
    WHERE kind = 'queue' AND name = %(name)s
    FOR UPDATE
), allowed AS MATERIALIZED (
    SELECT b.was, NOT %(fenced)s OR b.was IS NOT DISTINCT FROM %(expected)s::int AS ok
    FROM (SELECT (SELECT max_running FROM before) AS was) AS b
), changed AS (
    INSERT INTO {schema}.queue_control AS c (kind, name, max_running, changed_by)
    SELECT 'queue', %(name)s, %(limit)s::int, %(actor)s FROM allowed WHERE ok
    ON CONFLICT (kind, name) DO UPDATE
    SET max_running = excluded.max_running, changed_at = now(), changed_by = excluded.changed_by
    RETURNING c.name
)
SELECT a.was, c.name IS NOT NULL AS changed,
       CASE WHEN c.name IS NOT NULL THEN pg_notify(%(channel)s::text, '') END AS woken
FROM allowed AS a LEFT JOIN changed AS c ON true;

-- name: queue_rate
-- Operator: set (or with NULL clear) how many jobs of a queue or job type are claimed per
-- second across every worker, from each one's next claim. Fenced by the rate the operator
-- saw, as queue_limit is; returns the rate before, and whether it changed (not when the rate
-- had changed meanwhile: `was` then says what it is).
-- The bucket keeps what it held at the old rate (up to two seconds' worth of the new one), so
-- that a change takes effect at the next claim, without a burst. Wakes the workers.
-- The rate before is read once, in `allowed`, as in queue_limit.
WITH before AS MATERIALIZED (
    SELECT rate_per_second FROM {schema}.queue_control
    WHERE kind = %(kind)s AND name = %(name)s
    FOR UPDATE
), allowed AS MATERIALIZED (
    SELECT b.was, NOT %(fenced)s OR b.was IS NOT DISTINCT FROM %(expected)s::float8 AS ok
    FROM (SELECT (SELECT rate_per_second FROM before) AS was) AS b
), changed AS (
    INSERT INTO {schema}.queue_control AS c (kind, name, rate_per_second, changed_by)
    SELECT %(kind)s, %(name)s, %(rate)s::float8, %(actor)s FROM allowed WHERE ok
    ON CONFLICT (kind, name) DO UPDATE
    SET rate_per_second = excluded.rate_per_second, changed_at = now(), changed_by = excluded.changed_by
    RETURNING c.kind, c.name
), bucket AS (
    INSERT INTO {schema}.rate_bucket AS b (kind, name, tokens, refilled_at)
    SELECT kind, name, 1, now() FROM changed WHERE %(rate)s::float8 IS NOT NULL
    ON CONFLICT (kind, name) DO UPDATE
    SET tokens = least({schema}.rate_burst(%(rate)s::float8),
                       b.tokens + coalesce((SELECT was FROM allowed), 0)
                                  * greatest(0.0, extract(epoch FROM now() - b.refilled_at)::float8)),
        refilled_at = greatest(b.refilled_at, now())
)
SELECT a.was, c.name IS NOT NULL AS changed,
       CASE WHEN c.name IS NOT NULL THEN pg_notify(%(channel)s::text, '') END AS woken
FROM allowed AS a LEFT JOIN changed AS c ON true;
