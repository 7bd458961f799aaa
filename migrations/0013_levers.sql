-- The second round of incident levers: fleet-wide rate limits of queues and job types, a
-- resume that ramps up, the flows behind the drain forecast, and bulk actions that can be
-- resumed. Every change is additive: new nullable columns of the small queue_control table,
-- new tables and new functions. Nothing touches the job table, so a worker of the previous
-- release keeps working (it does not know the rates, and claims rated jobs at full speed).

-- A rate is jobs per second, counted across every worker; a ramp makes the rate rise from
-- ramp_from to ramp_until (control_rate below). Both apply to queues and to job types.
ALTER TABLE {schema}.queue_control
    ADD COLUMN rate_per_second float8 CHECK (rate_per_second > 0 AND rate_per_second <= 1000000),
    ADD COLUMN ramp_from timestamptz,
    ADD COLUMN ramp_until timestamptz,
    ADD CONSTRAINT queue_control_ramp_check CHECK ((ramp_from IS NULL) = (ramp_until IS NULL) AND ramp_until > ramp_from);

-- The rate a queue or type may claim at `p_at`: its rate, or while a ramp runs a rate that
-- rises tenfold in equal steps from 1 job/s (or the rate, when lower) to the rate, or to
-- 10,000 jobs/s for one without a rate, at the end of the ramp. NULL: no rate.
CREATE FUNCTION {schema}.control_rate(p_rate float8, p_from timestamptz, p_until timestamptz, p_at timestamptz)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_until IS NULL OR p_at >= p_until THEN p_rate
        ELSE power(least(1.0, coalesce(p_rate, 10000.0)), 1 - f) * power(coalesce(p_rate, 10000.0), f)
    END
    FROM (SELECT greatest(0.0, least(1.0, extract(epoch FROM p_at - p_from)::float8
                                           / greatest(extract(epoch FROM p_until - p_from)::float8, 0.001))) AS f) AS ramp
$$;

-- How many jobs a bucket may hold: two seconds' worth, and at least one job. Tokens refill
-- only up to it, so when no claim comes for longer (a worker claims at least once per poll,
-- a second by default, and later on a loaded machine) the time past it is lost. Two seconds
-- keep a fleet's long-run rate at the rate; the price is that after a quiet spell up to twice
-- the rate may start within one second.
CREATE FUNCTION {schema}.rate_burst(p_rate float8) RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(1.0, 2.0 * coalesce(p_rate, 1.0))
$$;

-- The token bucket of each rated queue or type: the jobs it may still claim (`tokens`) as of
-- `refilled_at`. The claim locks the row, refills it at the rate for the time since, takes a
-- token per job and writes it back: the claims of one rated queue or type take turns here.
-- Kept apart from queue_control, which every claim reads and only operators change.
CREATE TABLE {schema}.rate_bucket (
    kind        text        NOT NULL CHECK (kind IN ('queue', 'type')),
    name        text        NOT NULL CHECK (name <> ''),
    tokens      float8      NOT NULL CHECK (tokens >= 0),
    refilled_at timestamptz NOT NULL,
    PRIMARY KEY (kind, name)
);

-- The tokens a bucket holds at now(): refilled at the rate of the middle of the time since
-- its last refill (a ramp's rate moves meanwhile), up to two seconds' worth (rate_burst).
CREATE FUNCTION {schema}.bucket_tokens(p_tokens float8, p_since timestamptz, p_rate float8,
                                       p_from timestamptz, p_until timestamptz)
RETURNS float8 LANGUAGE sql STABLE AS $$
    SELECT least({schema}.rate_burst({schema}.control_rate(p_rate, p_from, p_until, now())),
                 p_tokens + coalesce({schema}.control_rate(p_rate, p_from, p_until, p_since + (now() - p_since) / 2), 0)
                            * greatest(0.0, extract(epoch FROM now() - p_since)::float8))
$$;

-- The jobs of rated queues and types a claim may take: ready, due jobs of p_types in p_queue
-- (every queue when NULL) whose queue or type has a rate, in claim order, each taking a token
-- of its queue's bucket and of its type's, up to p_want. A limited queue's jobs also take
-- its room, counted as claim_limited counts it. It looks among the first p_want + 20 due jobs
-- in claim order (the horizon), whatever the backlog: a rated queue or type with no job due
-- must not make every claim read the backlog of the others, and a rated job further back
-- waits its turn, as it would without a rate. Jobs that cannot be taken now are not in the
-- horizon: those of paused queues and types, and those of rated ones whose bucket (read
-- without a lock) holds no token, so that neither a paused backlog nor a throttled one holds
-- back the rated jobs behind it; when no rated queue or type in reach has a token, it reads
-- no job at all. When the horizon holds no rated job, it takes no lock. Else locks are taken in one order by every claim: the limits of the queues in
-- scope (in name order, as claim_limited takes them), then the buckets the horizon needs (in
-- kind and name order), so claims wait on each other but never deadlock. A round reads the
-- horizon's jobs still wanted; a job whose bucket or limit is spent is passed over, and the
-- next round leaves that bucket out, so the rounds end. The rows are locked here and updated
-- by the claim.
CREATE FUNCTION {schema}.claim_rated(p_queue text, p_types text[], p_want integer)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c record;
    j record;
    horizon bigint[];
    rated_queues text[];
    rated_types text[];
    paused_queues text[];
    paused_types text[];
    needed text[];
    b_kind text[] := ARRAY[]::text[];
    b_name text[] := ARRAY[]::text[];
    b_key text[] := ARRAY[]::text[];
    b_tokens float8[] := ARRAY[]::float8[];
    b_taken boolean[] := ARRAY[]::boolean[];
    limited text[] := ARRAY[]::text[];
    room bigint[] := ARRAY[]::bigint[];
    spent_queues text[] := ARRAY[]::text[];
    spent_types text[] := ARRAY[]::text[];
    live_queues text[];
    live_types text[];
    got bigint[] := ARRAY[]::bigint[];
    have float8;
    since timestamptz;
    qi integer;
    ti integer;
    li integer;
    passed boolean;
BEGIN
    IF p_want <= 0 THEN
        RETURN got;
    END IF;
    rated_queues := ARRAY(SELECT name FROM {schema}.queue_control
                          WHERE kind = 'queue' AND (rate_per_second IS NOT NULL OR ramp_until > now())
                            AND paused_at IS NULL AND (p_queue IS NULL OR name = p_queue));
    rated_types := ARRAY(SELECT name FROM {schema}.queue_control
                         WHERE kind = 'type' AND (rate_per_second IS NOT NULL OR ramp_until > now())
                           AND paused_at IS NULL AND name = ANY(p_types));
    IF cardinality(rated_queues) = 0 AND cardinality(rated_types) = 0 THEN
        RETURN got;
    END IF;
    -- Buckets without a token now, by an unlocked read (the locked one below decides).
    spent_queues := ARRAY(SELECT b.name FROM {schema}.rate_bucket AS b JOIN {schema}.queue_control AS qc USING (kind, name)
                          WHERE b.kind = 'queue' AND b.name = ANY(rated_queues) AND {schema}.bucket_tokens(
                              b.tokens, b.refilled_at, qc.rate_per_second, qc.ramp_from, qc.ramp_until) < 1);
    spent_types := ARRAY(SELECT b.name FROM {schema}.rate_bucket AS b JOIN {schema}.queue_control AS qc USING (kind, name)
                         WHERE b.kind = 'type' AND b.name = ANY(rated_types) AND {schema}.bucket_tokens(
                             b.tokens, b.refilled_at, qc.rate_per_second, qc.ramp_from, qc.ramp_until) < 1);
    IF rated_queues <@ spent_queues AND rated_types <@ spent_types THEN
        RETURN ARRAY[]::bigint[];
    END IF;
    paused_queues := ARRAY(SELECT name FROM {schema}.queue_control WHERE kind = 'queue' AND paused_at IS NOT NULL);
    paused_types := ARRAY(SELECT name FROM {schema}.queue_control WHERE kind = 'type' AND paused_at IS NOT NULL);
    horizon := ARRAY(SELECT id FROM {schema}.job
                     WHERE status = 'ready' AND run_at <= now() AND type = ANY(p_types)
                       AND (p_queue IS NULL OR queue = p_queue)
                       AND queue <> ALL(paused_queues) AND type <> ALL(paused_types)
                       AND queue <> ALL(spent_queues) AND type <> ALL(spent_types)
                     ORDER BY run_at, id
                     LIMIT p_want + 20);
    spent_queues := ARRAY[]::text[];
    spent_types := ARRAY[]::text[];
    -- The buckets of the rated jobs in the horizon, read without a lock.
    needed := ARRAY(SELECT DISTINCT k FROM {schema}.job AS h,
                    LATERAL (VALUES ('queue:' || h.queue), ('type:' || h.type)) AS keys(k)
                    WHERE h.id = ANY(horizon) AND h.status = 'ready'
                      AND (h.queue = ANY(rated_queues) OR h.type = ANY(rated_types))
                      AND h.queue <> ALL(paused_queues) AND h.type <> ALL(paused_types)
                      AND (k = 'queue:' || h.queue AND h.queue = ANY(rated_queues)
                           OR k = 'type:' || h.type AND h.type = ANY(rated_types)));
    IF cardinality(needed) = 0 THEN
        RETURN got;
    END IF;
    FOR c IN SELECT name, max_running FROM {schema}.queue_control
             WHERE kind = 'queue' AND max_running IS NOT NULL AND paused_at IS NULL
               AND (p_queue IS NULL OR name = p_queue)
             ORDER BY name
    LOOP
        -- The key of claim_limited's lock ({schema} is the quoted schema name, inside the literal).
        PERFORM pg_advisory_xact_lock(hashtextextended('{schema}.queue_limit.' || c.name, 0));
        limited := limited || c.name;
        room := room || (SELECT c.max_running - count(*) FROM {schema}.job WHERE status = 'running' AND queue = c.name);
    END LOOP;
    FOR c IN SELECT kind, name, rate_per_second, ramp_from, ramp_until FROM {schema}.queue_control
             WHERE (kind || ':' || name) = ANY(needed)
             ORDER BY kind, name
    LOOP
        SELECT tokens, refilled_at INTO have, since FROM {schema}.rate_bucket
        WHERE kind = c.kind AND name = c.name FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO {schema}.rate_bucket (kind, name, tokens, refilled_at) VALUES (c.kind, c.name, 0, now())
            ON CONFLICT (kind, name) DO NOTHING;
            SELECT tokens, refilled_at INTO have, since FROM {schema}.rate_bucket
            WHERE kind = c.kind AND name = c.name FOR UPDATE;
        END IF;
        -- A claim that waited for this lock may have started before the last refill: it adds
        -- nothing for that time.
        have := {schema}.bucket_tokens(have, since, c.rate_per_second, c.ramp_from, c.ramp_until);
        b_kind := b_kind || c.kind;
        b_name := b_name || c.name;
        b_key := b_key || (c.kind || ':' || c.name);
        b_tokens := b_tokens || have;
        b_taken := b_taken || false;
    END LOOP;
    live_queues := ARRAY(SELECT b_name[i] FROM generate_subscripts(b_key, 1) AS i WHERE b_kind[i] = 'queue');
    live_types := ARRAY(SELECT b_name[i] FROM generate_subscripts(b_key, 1) AS i WHERE b_kind[i] = 'type');
    LOOP
        EXIT WHEN cardinality(got) >= p_want;
        live_queues := ARRAY(SELECT q FROM unnest(live_queues) AS q WHERE q <> ALL(spent_queues));
        live_types := ARRAY(SELECT t FROM unnest(live_types) AS t WHERE t <> ALL(spent_types));
        EXIT WHEN cardinality(live_queues) = 0 AND cardinality(live_types) = 0;
        passed := false;
        FOR j IN SELECT id, queue, type FROM {schema}.job
                 WHERE id = ANY(horizon) AND status = 'ready'
                   AND (queue = ANY(live_queues) OR type = ANY(live_types))
                   AND queue <> ALL(spent_queues) AND type <> ALL(spent_types)
                   AND queue <> ALL(paused_queues) AND type <> ALL(paused_types)
                   AND NOT (id = ANY(got))
                 ORDER BY run_at, id
                 LIMIT p_want - cardinality(got)
                 FOR UPDATE SKIP LOCKED
        LOOP
            qi := array_position(b_key, 'queue:' || j.queue);
            ti := array_position(b_key, 'type:' || j.type);
            li := array_position(limited, j.queue);
            IF j.queue = ANY(spent_queues) OR j.type = ANY(spent_types)
               -- a rated queue or type whose bucket was not locked (changed since the horizon)
               OR (qi IS NULL AND j.queue = ANY(rated_queues)) OR (ti IS NULL AND j.type = ANY(rated_types)) THEN
                passed := true;
                CONTINUE;
            END IF;
            IF qi IS NOT NULL AND b_tokens[qi] < 1 THEN
                spent_queues := spent_queues || j.queue;
                passed := true;
                CONTINUE;
            END IF;
            IF ti IS NOT NULL AND b_tokens[ti] < 1 THEN
                spent_types := spent_types || j.type;
                passed := true;
                CONTINUE;
            END IF;
            IF li IS NOT NULL AND room[li] < 1 THEN
                spent_queues := spent_queues || j.queue;
                passed := true;
                CONTINUE;
            END IF;
            got := got || j.id;
            IF qi IS NOT NULL THEN
                b_tokens[qi] := b_tokens[qi] - 1;
                b_taken[qi] := true;
            END IF;
            IF ti IS NOT NULL THEN
                b_tokens[ti] := b_tokens[ti] - 1;
                b_taken[ti] := true;
            END IF;
            IF li IS NOT NULL THEN
                room[li] := room[li] - 1;
            END IF;
        END LOOP;
        -- No job passed over: this round took every candidate there was.
        EXIT WHEN NOT passed;
    END LOOP;
    -- Only the buckets that gave tokens are written: an untouched bucket refills the same
    -- from its old row at the next claim.
    FOR qi IN 1 .. cardinality(b_key) LOOP
        IF b_taken[qi] THEN
            UPDATE {schema}.rate_bucket
            SET tokens = greatest(0.0, b_tokens[qi]), refilled_at = greatest(refilled_at, now())
            WHERE kind = b_kind[qi] AND name = b_name[qi];
        END IF;
    END LOOP;
    RETURN got;
END;
$$;

-- claim_limited (migration 0008) for a claim that also takes rated jobs: the jobs of rated
-- queues and types are claim_rated's, and the room of a limited queue counts the jobs
-- claim_rated took in it (p_taken: locked by this claim, not running yet). The version with
-- three arguments stays, for the workers of the previous release.
CREATE FUNCTION {schema}.claim_limited(p_queue text, p_types text[], p_want integer, p_taken bigint[])
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c record;
    room bigint;
    got bigint[] := ARRAY[]::bigint[];
BEGIN
    FOR c IN SELECT name, max_running FROM {schema}.queue_control
             WHERE kind = 'queue' AND max_running IS NOT NULL AND paused_at IS NULL
               AND rate_per_second IS NULL AND (ramp_until IS NULL OR ramp_until <= now())
               AND (p_queue IS NULL OR name = p_queue)
             ORDER BY name
    LOOP
        EXIT WHEN cardinality(got) >= p_want;
        PERFORM pg_advisory_xact_lock(hashtextextended('{schema}.queue_limit.' || c.name, 0));
        SELECT c.max_running - count(*) INTO room FROM {schema}.job
        WHERE (status = 'running' OR id = ANY(p_taken)) AND queue = c.name;
        room := least(room, p_want - cardinality(got));
        IF room > 0 THEN
            got := got || ARRAY(
                SELECT id FROM {schema}.job
                WHERE status = 'ready' AND run_at <= now() AND queue = c.name
                  AND type = ANY(p_types) AND NOT (id = ANY(p_taken))
                  AND (type || '') <> ALL(ARRAY(SELECT name FROM {schema}.queue_control
                                                WHERE kind = 'type' AND (paused_at IS NOT NULL
                                                      OR rate_per_second IS NOT NULL OR ramp_until > now())))
                ORDER BY run_at, id
                LIMIT room
                FOR UPDATE SKIP LOCKED);
        END IF;
    END LOOP;
    RETURN got;
END;
$$;

-- What flowed through each queue and type, span by span, for the drain forecast: the
-- archiver (once a minute, whichever worker runs it) counts the jobs enqueued since the last
-- span (the ids above its last_id) and those finished within the span (done, dead, failed),
-- by queue and type. Readers then read a few rows, whatever the backlog. Rows older than a
-- day are pruned with it, so the table stays at 1,440 rows.
CREATE TABLE {schema}.queue_flow (
    span_end        timestamptz PRIMARY KEY,
    span_start      timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    -- The newest job id when the row was written; the next span's enqueues are the ids above.
    last_id         bigint      NOT NULL,
    -- False for the first span after none (or after a long gap): its enqueues are not known.
    enqueues_known  boolean     NOT NULL,
    -- [[queue, type, enqueued, finished], ...]
    pairs           jsonb       NOT NULL DEFAULT '[]'::jsonb,
    CHECK (span_end > span_start)
);

-- A bulk action over a filter (jobtui bulk): the filter, how far it got, what it changed. It
-- walks the ids down from last_id in short transactions, writing its progress with each
-- batch, so that a run that was stopped or killed is resumed by a second one with the same
-- action and filter: the same cutoff, from where it stopped, changing nothing twice.
CREATE TABLE {schema}.bulk_run (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action      text        NOT NULL CHECK (action IN ('requeue', 'discard', 'cancel')),
    filter      jsonb       NOT NULL,
    -- Only jobs that finished (requeue, discard) or were enqueued (cancel) before it.
    cutoff      timestamptz NOT NULL,
    last_id     bigint      NOT NULL,
    -- The ids from here up to last_id are done with.
    next_id     bigint      NOT NULL,
    changed     bigint      NOT NULL DEFAULT 0,
    -- Jobs passed over because another transaction held them (a worker's outcome, an effect).
    busy_ids    bigint[]    NOT NULL DEFAULT ARRAY[]::bigint[],
    state       text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'stopped', 'done')),
    started_by  text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
