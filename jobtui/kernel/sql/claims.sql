-- Claims, leases and outcomes: what a worker runs (core/claims.py). Every transition
-- names the status and lease token it expects: zero rows updated means the lease was lost
-- and the write must not be retried.
-- noun: claim
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().
--
-- A lookup by id of ready, dead or failed jobs writes its status fence as
-- `(j.status = 'ready') IS TRUE`: the same test (status is never NULL) in a form that no
-- partial index's predicate answers. Written plainly, statistics from before a burst make the
-- planner take that status's index for a few rows, and read all of it filtering by id, where
-- the primary key finds each row. Running jobs' index is bounded by the fleet's slots, so the
-- outcomes' fences on `running` stay plain.

-- fragment: claim_started
-- What a claim sets on each job it takes (claim_take, claim_take_builtin): running, its next
-- attempt, under a new lease token held by %(worker)s for %(lease)s seconds.
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

-- name: claim_take
-- Up to `limit` ready jobs of the given types, oldest run_at first, from `queue` (NULL: from
-- every queue). SKIP LOCKED lets any number of workers claim at once without waiting on each
-- other or taking the same row.
-- The ids come from claim_pick (migration 0021), which reads the levers in the claim's reach
-- once (queue_control, with the tokens of rated queues' and types' buckets) and walks the
-- ready index: the plain walk when no pause, limit or rate (or ramp) applies to the claim's
-- queue (every queue's, for a claim of every queue) or to one of its types; otherwise one
-- walk that sets paused, limited and spent queues and types aside and takes a token per
-- rated job (claim_pick itself under one bucket, else claim_paced; claim_limited for limited
-- queues). The walk lives in the function, whose plans PL/pgSQL keeps: written here, it was
-- planned anew at every claim (a generic plan, estimated with an unknown LIMIT, never won);
-- here is left only the call and the update by id. The levers are read at every claim, in
-- the claim's transaction, so each holds from every worker's next claim. An array rather
-- than a join (UPDATE ... FROM picked): a joined relation costs a whole-row copy of each of
-- its rows, kept for rechecks, and the join. The rows come back in id order; the caller
-- sorts them by run_at. The payload comes as text, which the worker decodes with one JSON
-- decoder, cheaper per row than psycopg's jsonb loader.
UPDATE {schema}.job AS j
{claim_started}
WHERE j.id = ANY((SELECT {schema}.claim_pick(%(queue)s::text, %(types)s::text[], %(limit)s::int))::bigint[])
  AND (j.status = 'ready') IS TRUE
RETURNING j.id, j.type, j.payload::text, j.attempts, j.max_attempts, j.lease_token,
          j.locked_until, j.created_at, j.run_at, j.uncounted, j.meta::text, j.queue;

-- name: claim_take_builtin
-- jobtui's own jobs (the archiver's), claimed by the slot every worker keeps for them
-- whatever queues it serves. They are in the queue 'jobtui.builtin', found through its own
-- small partial index (migration 0015): that queue named here as a constant, so the planner
-- can use it. The claim of the ready index would step over every other ready job to find them,
-- once a poll on every worker: a read that grows with the backlog. A pause of the queue or of
-- a type holds them back as it holds any job.
UPDATE {schema}.job AS j
{claim_started}
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
  AND (j.status = 'ready') IS TRUE
RETURNING j.id, j.type, j.payload::text, j.attempts, j.max_attempts, j.lease_token,
          j.locked_until, j.created_at, j.run_at, j.uncounted, j.meta::text, j.queue;

-- name: claim_heartbeat
-- Extends many leases at once; the ids returned as 'held' still hold their lease, the others
-- lost it. Each id's token is looked up in `leases` (see claim_complete). A lease
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
      AND j.lease_token = (%(leases)s::jsonb ->> j.id::text)::bigint
    RETURNING j.id
)
SELECT id, 'held' AS lease FROM held
UNION ALL
SELECT j.id, 'cancelled' FROM {schema}.job AS j
WHERE (SELECT count(*) FROM held) < cardinality(%(ids)s::bigint[])
  AND j.id = ANY(%(ids)s::bigint[]) AND (j.status = 'failed') IS TRUE
  AND j.lease_token = (%(leases)s::jsonb ->> j.id::text)::bigint
  AND j.errors -> -1 ->> 'kind' = 'cancelled';

-- name: claim_complete
-- Fenced by status and lease token, like every transition. The ids are matched with
-- = ANY (the primary key's index), and each one's token looked up in `leases`, a jsonb object
-- of id -> token: a binary search of its keys per row. Not array_position in an array of
-- tokens, which scans the ids for every row (a batch of 200 costs 200 x 100 comparisons), and
-- not a join with unnest(ids, tokens), whose whole-row copy per row, kept for rechecks,
-- would be most of this statement.
UPDATE {schema}.job AS j
SET status = 'done', locked_until = NULL, finished_at = now()
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'running'
  AND j.lease_token = (%(leases)s::jsonb ->> j.id::text)::bigint
RETURNING j.id;

-- name: claim_complete_deleting
-- Complete by deleting: for workers started with --delete-on-complete. Only jobs without a
-- key are deleted (a keyed job stays as a done row, so its key keeps refusing duplicates until
-- the archiver's retention); the caller completes the ids missing from the result with
-- `claim_complete`, which also tells a keyed job from a lost lease. Each deleted job is counted into
-- done_tally in the same statement, in the finishing worker's own row (see migration 0004).
WITH gone AS (
    DELETE FROM {schema}.job AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'running' AND j.idempotency_key IS NULL
      AND j.lease_token = (%(leases)s::jsonb ->> j.id::text)::bigint
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

-- name: claim_fail
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

-- name: claim_fail_permanently
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

-- name: claim_release
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

-- name: claim_release_unanswered
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

-- name: claim_reap
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

-- name: claim_session
-- Settings of a worker's claiming connection: the claim must walk the
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

-- name: claim_listen
-- A worker's wake-ups: every insert into the job table notifies this channel.
LISTEN {channel};
