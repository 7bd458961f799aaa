-- Enqueueing jobs and reading one job (core/queue.py, clients/, testing/).
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

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

-- name: testing_enqueued
-- jobtui.testing: the jobs of a type whose payload holds the given keys and values, as the
-- caller's connection sees them (its own open transaction included).
SELECT id, type, payload, idempotency_key AS key, status, run_at, created_at
FROM {schema}.job
WHERE type = %(type)s AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
ORDER BY id;
