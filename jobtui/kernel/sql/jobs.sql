-- Enqueueing jobs, reading one job, and the effects a job records (core/jobs.py).
-- noun: job
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: job_enqueue
-- One job without an idempotency key.
INSERT INTO {schema}.job (type, payload, idempotency_key, run_at, max_attempts, meta, queue)
VALUES (%(type)s, %(payload)s, %(key)s,
        coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s),
        %(max_attempts)s, %(meta)s::jsonb, %(queue)s)
RETURNING id;

-- fragment: job_key_claim
-- The `live` and `keyed` of an enqueue of one key (%(key)s), job_enqueue_keyed's and the
-- scheduler's (schedule_enqueue): `live`, the job of the queue table holding the key; `keyed`,
-- the id drawn for the new job, when this statement claimed the key in job_key (none when a
-- job holds it, in the table or within the key's window).
live AS (
    SELECT id FROM {schema}.job WHERE idempotency_key = %(key)s
), keyed AS (
    INSERT INTO {schema}.job_key (key, job_id)
    SELECT %(key)s, nextval('{schema}.job_id_seq') WHERE NOT EXISTS (SELECT FROM live)
    ON CONFLICT (key) DO NOTHING
    RETURNING job_id
)

-- name: job_enqueue_keyed
-- One job with an idempotency key; returns its id, or the id of the job already in the queue
-- table with that key. Returns nothing when the key belongs to a job that left the table
-- within the key's window (or to one being enqueued at this moment, which this statement
-- waited for): the caller then reads it with job_enqueue_existing.
--
-- The key is claimed in job_key first, and the job inserted only with the key claimed: its
-- primary key decides between enqueues of one key, and a key's row outlives its job (migration
-- 0017), so an enqueue racing the archiver as it moves the job out still finds the key taken.
-- A job the snapshot sees holding the key is returned without claiming it: a job of the
-- previous release (no job_key row yet) being archived would otherwise have this statement
-- wait for the archiver while the archiver's trigger waits for this key.
WITH {job_key_claim}, inserted AS (
    INSERT INTO {schema}.job (id, type, payload, idempotency_key, run_at, max_attempts, meta, queue)
    SELECT keyed.job_id, %(type)s::text, %(payload)s::jsonb, %(key)s::text,
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s),
           %(max_attempts)s::integer, %(meta)s::jsonb, %(queue)s::text
    FROM keyed
    -- A job of the previous release holding the key, not yet committed when this began.
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT id FROM inserted UNION ALL SELECT id FROM live;

-- name: job_enqueue_existing
-- The job holding `key`: the one in the queue table, else the one job_key remembers.
SELECT id FROM (SELECT id, 0 AS rank FROM {schema}.job WHERE idempotency_key = %(key)s
                UNION ALL
                SELECT job_id, 1 FROM {schema}.job_key WHERE key = %(key)s) AS held
ORDER BY rank LIMIT 1;

-- name: job_enqueue_many
-- Many jobs without keys in one statement. Returns the new ids in the input's order.
INSERT INTO {schema}.job (type, payload, idempotency_key, run_at, max_attempts, meta, queue)
SELECT t.type, t.payload::jsonb, t.key, now() + make_interval(secs => t.delay), t.max_attempts, t.meta::jsonb, t.queue
FROM unnest(%(types)s::text[], %(payloads)s::text[], %(keys)s::text[],
            %(delays)s::float8[], %(max_attempts)s::int[], %(metas)s::text[], %(queues)s::text[])
     WITH ORDINALITY AS t(type, payload, key, delay, max_attempts, meta, queue, ord)
ORDER BY t.ord
RETURNING id, idempotency_key;

-- name: job_enqueue_many_keyed
-- Many jobs, some with keys, as job_enqueue_keyed does one: each key claimed in job_key (in the
-- order of the keys, so that two batches sharing keys never wait for each other in a circle),
-- a job inserted for each key claimed (the first of the batch's jobs with that key) and for
-- each job without one. Ids are drawn in the input's order first, so that jobs due at once
-- are claimed in that order (a job not inserted leaves a gap). Returns the new ids with their
-- keys, in the input's order, then the jobs of the queue table that hold keys of the batch;
-- keys in neither are read with job_enqueue_existing_many.
WITH t AS (
    SELECT u.*, nextval('{schema}.job_id_seq') AS id
    FROM unnest(%(types)s::text[], %(payloads)s::text[], %(keys)s::text[],
                %(delays)s::float8[], %(max_attempts)s::int[], %(metas)s::text[], %(queues)s::text[])
         WITH ORDINALITY AS u(type, payload, key, delay, max_attempts, meta, queue, ord)
), live AS (
    SELECT id, idempotency_key FROM {schema}.job WHERE idempotency_key = ANY(%(keys)s::text[])
), firsts AS (
    SELECT DISTINCT ON (t.key) t.key, t.id FROM t
    WHERE t.key IS NOT NULL AND t.key NOT IN (SELECT idempotency_key FROM live)
    ORDER BY t.key, t.ord
), keyed AS (
    INSERT INTO {schema}.job_key (key, job_id)
    SELECT key, id FROM firsts ORDER BY key
    ON CONFLICT (key) DO NOTHING
    RETURNING job_id
), inserted AS (
    INSERT INTO {schema}.job (id, type, payload, idempotency_key, run_at, max_attempts, meta, queue)
    SELECT t.id, t.type, t.payload::jsonb, t.key, now() + make_interval(secs => t.delay), t.max_attempts,
           t.meta::jsonb, t.queue
    FROM t
    WHERE t.key IS NULL OR t.id IN (SELECT job_id FROM keyed)
    ORDER BY t.ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, idempotency_key
)
SELECT id, idempotency_key FROM inserted UNION ALL SELECT id, idempotency_key FROM live;

-- name: job_enqueue_existing_many
-- The jobs holding `keys`, as job_enqueue_existing reads one.
SELECT DISTINCT ON (held.key) held.id, held.key AS idempotency_key
FROM (SELECT id, idempotency_key AS key, 0 AS rank FROM {schema}.job WHERE idempotency_key = ANY(%(keys)s::text[])
      UNION ALL
      SELECT job_id, key, 1 FROM {schema}.job_key WHERE key = ANY(%(keys)s::text[])) AS held
ORDER BY held.key, held.rank;

-- name: job_ids_reserve
-- Ids for a COPY of many jobs, drawn from the table's own sequence. The sequence is looked
-- up once (an InitPlan), not once per id, which would cost more than the COPY's own parsing.
SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id')::regclass)) FROM generate_series(1, %(n)s);

-- name: job_copy
-- Bulk insert without keys or delays: run_at takes its default, the database's now().
COPY {schema}.job (id, type, payload, max_attempts, meta, queue) FROM STDIN;

-- name: job_statuses
SELECT id, status FROM {schema}.job WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_get
SELECT id, type, queue, payload, idempotency_key, status, run_at, attempts, max_attempts,
       locked_by, locked_until, lease_token, heartbeat_at, last_error, errors,
       lease_expirations, created_at, started_at, finished_at, now() AS db_now,
       CASE WHEN status = 'running' AND runner -> 'token' = to_jsonb(lease_token) THEN runner END AS runner
FROM {schema}.job WHERE id = %(id)s;

-- name: job_notify_ready
SELECT pg_notify(%(channel)s, '');

-- name: job_effect_record
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
--
-- That lock lasts as long as the caller's session: a handler cut off by a network that drops
-- packets silently would leave it to the server's TCP keepalive (about two hours by default),
-- the job ready but skipped by every claim. So, for the rest of the transaction (set_config's
-- `true`), the server's end of the connection gives up within seconds of its client going
-- silent, as jobtui's own connections do from their end (db.tcp_bounds). Local to the
-- transaction, so a pooler's shared connection keeps its own settings afterwards.
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
SELECT (SELECT held FROM lease), EXISTS (SELECT 1 FROM recorded),
       set_config('tcp_keepalives_idle', %(keepalives_idle)s::text, true),
       set_config('tcp_keepalives_interval', %(keepalives_interval)s::text, true),
       set_config('tcp_keepalives_count', %(keepalives_count)s::text, true),
       set_config('tcp_user_timeout', %(tcp_user_timeout)s::text, true);

-- name: job_effect_exists
SELECT EXISTS (SELECT 1 FROM {schema}.effect WHERE key = %(key)s);

-- name: job_enqueued_matching
-- jobtui.testing: the jobs of a type whose payload holds the given keys and values, as the
-- caller's connection sees them (its own open transaction included).
SELECT id, type, payload, idempotency_key AS key, status, run_at, created_at
FROM {schema}.job
WHERE type = %(type)s AND (%(payload)s::jsonb IS NULL OR payload @> %(payload)s::jsonb)
ORDER BY id;
