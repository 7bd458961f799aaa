-- Every runtime statement of jobtui, as named blocks (`-- name: NAME`).
--
-- {schema} is the quoted schema name (filled in with psycopg.sql.Identifier); values are
-- always bound parameters. Every transition a worker makes names the status and lease token
-- it expects: zero rows updated means the lease was lost and the write must not be retried.
-- Time is always the database's now().

-- name: schema_version
-- The newest applied migration, or NULL when the schema has none.
SELECT max(version) FROM {schema}.migration;

-- name: enqueue
-- One job. With an idempotency key that already exists, inserts nothing and returns nothing;
-- the caller then reads the existing job with enqueue_existing.
INSERT INTO {schema}.job (type, payload, idempotency_key, run_at, max_attempts)
VALUES (%(type)s, %(payload)s, %(key)s,
        coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s),
        %(max_attempts)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id;

-- name: enqueue_existing
SELECT id FROM {schema}.job WHERE idempotency_key = %(key)s;

-- name: enqueue_many
-- Many jobs in one statement; rows whose key already exists are skipped. Returns the new
-- ids with their position in the input (ord, 1-based).
INSERT INTO {schema}.job (type, payload, idempotency_key, run_at, max_attempts)
SELECT t.type, t.payload::jsonb, t.key, now() + make_interval(secs => t.delay), t.max_attempts
FROM unnest(%(types)s::text[], %(payloads)s::text[], %(keys)s::text[],
            %(delays)s::float8[], %(max_attempts)s::int[])
     WITH ORDINALITY AS t(type, payload, key, delay, max_attempts, ord)
ORDER BY t.ord
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, idempotency_key;

-- name: enqueue_existing_many
SELECT id, idempotency_key FROM {schema}.job WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: reserve_ids
-- Ids for a COPY of many jobs, drawn from the table's own sequence.
SELECT nextval(pg_get_serial_sequence(%(table)s, 'id')) FROM generate_series(1, %(n)s);

-- name: copy_jobs
-- Bulk insert without keys or delays: run_at takes its default, the database's now().
COPY {schema}.job (id, type, payload, max_attempts) FROM STDIN;

-- name: claim
-- Up to `limit` ready jobs of the given types, oldest run_at first. SKIP LOCKED lets any
-- number of workers claim at once without waiting on each other or taking the same row.
WITH picked AS (
    SELECT id FROM {schema}.job
    WHERE status = 'ready' AND run_at <= now() AND type = ANY(%(types)s::text[])
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.job AS j
SET status = 'running',
    attempts = j.attempts + 1,
    lease_token = j.lease_token + 1,
    locked_by = %(worker)s,
    locked_until = now() + make_interval(secs => %(lease)s),
    heartbeat_at = now(),
    started_at = now()
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.type, j.payload, j.attempts, j.max_attempts, j.lease_token,
          j.locked_until, j.created_at, j.run_at;

-- name: heartbeat
-- Extends many leases at once; the ids returned still hold their lease, the others lost it.
UPDATE {schema}.job AS j
SET locked_until = now() + make_interval(secs => %(lease)s), heartbeat_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS t(id, token)
WHERE j.id = t.id AND j.status = 'running' AND j.lease_token = t.token
RETURNING j.id;

-- name: complete
UPDATE {schema}.job AS j
SET status = 'done', locked_until = NULL, finished_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS t(id, token)
WHERE j.id = t.id AND j.status = 'running' AND j.lease_token = t.token
RETURNING j.id;

-- name: fail
-- A counted failure: back to ready after the given delay, or dead once attempts are spent.
-- The error joins the row's history (the newest 50 entries are kept).
UPDATE {schema}.job AS j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
    run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at
                  ELSE now() + make_interval(secs => t.delay) END,
    finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
    locked_until = NULL,
    last_error = t.error,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'attempt', j.attempts, 'worker', j.locked_by,
                 'kind', 'error', 'error', t.error)))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[], %(errors)s::text[])
     AS t(id, token, delay, error)
WHERE j.id = t.id AND j.status = 'running' AND j.lease_token = t.token
RETURNING j.id, j.status, j.type, j.attempts, j.max_attempts, j.locked_by;

-- name: fail_permanently
-- The handler decided the job can never succeed: failed at once, whatever attempts remain.
UPDATE {schema}.job AS j
SET status = 'failed', locked_until = NULL, finished_at = now(), last_error = t.error,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'attempt', j.attempts, 'worker', j.locked_by,
                 'kind', 'permanent', 'error', t.error)))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(errors)s::text[]) AS t(id, token, error)
WHERE j.id = t.id AND j.status = 'running' AND j.lease_token = t.token
RETURNING j.id;

-- name: release
-- Back to ready without counting the attempt: shutdown, an unreachable dependency of the
-- worker itself, or a handler asking to run again later.
UPDATE {schema}.job AS j
SET status = 'ready', attempts = j.attempts - 1, locked_until = NULL,
    run_at = now() + make_interval(secs => t.delay)
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(delays)s::float8[]) AS t(id, token, delay)
WHERE j.id = t.id AND j.status = 'running' AND j.lease_token = t.token
RETURNING j.id;

-- name: reap
-- Running jobs whose lease expired go back to ready (their lease was their delay), or dead
-- when the attempt that expired was the last one: a job that keeps crashing its worker
-- ends dead instead of taking workers down forever. Each expiry is recorded.
WITH expired AS (
    SELECT id, locked_until FROM {schema}.job
    WHERE status = 'running' AND locked_until < now()
    ORDER BY locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE {schema}.job AS j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
        run_at = now(),
        finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
        locked_until = NULL,
        lease_expirations = j.lease_expirations + 1,
        last_error = format('lease expired: worker %%s stopped heartbeating during attempt %%s of %%s%%s',
                            coalesce(j.locked_by, '?'), j.attempts, j.max_attempts,
                            CASE WHEN j.attempts >= j.max_attempts
                                 THEN ' (attempts exhausted: the job may be crashing its worker)'
                                 ELSE '' END),
        errors = (j.errors || jsonb_build_array(jsonb_build_object(
                     'at', now(), 'attempt', j.attempts, 'worker', j.locked_by,
                     'kind', 'lease_expired',
                     'error', format('lease expired at %%s', expired.locked_until))))
                 - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
    FROM expired
    WHERE j.id = expired.id
    RETURNING j.id, j.type, j.locked_by, j.attempts, j.status, expired.locked_until AS expired_at
), logged AS (
    INSERT INTO {schema}.lease_expiry (job_id, job_type, worker, attempt, expired_at, outcome)
    SELECT id, type, locked_by, attempts, expired_at, status FROM reaped
)
SELECT id, type, locked_by, attempts, status FROM reaped;

-- name: requeue_by_id
-- Operator: dead or failed jobs back to ready now with a fresh set of attempts.
UPDATE {schema}.job AS j
SET status = 'ready', attempts = 0, run_at = now(), finished_at = NULL,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'attempt', j.attempts, 'worker', %(actor)s,
                 'kind', 'requeued', 'error', format('requeued from %%s by %%s', j.status, %(actor)s))))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status IN ('dead', 'failed')
RETURNING j.id;

-- name: requeue_matching_count
SELECT count(*) FROM {schema}.job
WHERE status IN ('dead', 'failed')
  AND (%(type)s::text IS NULL OR type = %(type)s)
  AND (%(error)s::text IS NULL OR last_error ~* %(error)s);

-- name: requeue_matching
UPDATE {schema}.job AS j
SET status = 'ready', attempts = 0, run_at = now(), finished_at = NULL,
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'attempt', j.attempts, 'worker', %(actor)s,
                 'kind', 'requeued', 'error', format('requeued from %%s by %%s', j.status, %(actor)s))))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
WHERE j.status IN ('dead', 'failed')
  AND (%(type)s::text IS NULL OR j.type = %(type)s)
  AND (%(error)s::text IS NULL OR j.last_error ~* %(error)s)
RETURNING j.id;

-- name: kill_lease
-- Operator: a running job returns to ready now. Its worker's late outcome is rejected
-- because the status (and later the lease token) no longer match.
UPDATE {schema}.job AS j
SET status = 'ready', run_at = now(), locked_until = NULL,
    last_error = format('lease killed by %%s during attempt %%s', %(actor)s, j.attempts),
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'attempt', j.attempts, 'worker', j.locked_by,
                 'kind', 'lease_killed', 'error', format('lease killed by %%s', %(actor)s))))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'running'
RETURNING j.id;

-- name: cancel
-- Operator: a ready or running job becomes failed; it will not run again unless requeued.
UPDATE {schema}.job AS j
SET status = 'failed', locked_until = NULL, finished_at = now(),
    last_error = format('cancelled by %%s', %(actor)s),
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'attempt', j.attempts, 'worker', j.locked_by,
                 'kind', 'cancelled', 'error', format('cancelled by %%s', %(actor)s))))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status IN ('ready', 'running')
RETURNING j.id;

-- name: job_statuses
SELECT id, status FROM {schema}.job WHERE id = ANY(%(ids)s::bigint[]);

-- name: get_job
SELECT id, type, payload, idempotency_key, status, run_at, attempts, max_attempts,
       locked_by, locked_until, lease_token, heartbeat_at, last_error, errors,
       lease_expirations, created_at, started_at, finished_at, now() AS db_now
FROM {schema}.job WHERE id = %(id)s;

-- name: notify_ready
SELECT pg_notify(%(channel)s, '');

-- name: effect_record
-- Records effect `key` as done; inserts nothing when an earlier attempt already did.
INSERT INTO {schema}.effect (key, job_id) VALUES (%(key)s, %(job_id)s)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: effect_exists
SELECT EXISTS (SELECT 1 FROM {schema}.effect WHERE key = %(key)s);
