-- A rated claim costs what its token bucket needs. claim_rated (migration 0013) read a
-- look-ahead of the ready jobs, read them again to find the buckets they need, then walked
-- them again under lock, whatever the claim: a claim whose every job is under the same
-- buckets (the claim's queue is rated, or its one type is, or both; no pause or limit in its
-- reach) now locks those buckets, takes as many jobs as their tokens allow with the plain
-- walk of the ready index, and writes each bucket once. Every other claim takes the general
-- path, unchanged. The lever functions also keep one plan per statement (plan_cache_mode):
-- left to choose, PostgreSQL planned most of their statements anew at every call (a generic
-- plan's estimate, with a LIMIT or a NULL test unknown, never wins), which cost a rated claim
-- more than all its statements' work. Every function keeps its signature and is replaced in
-- place: the claims of the release before call them as they did.

-- control_rate (migration 0013) as one expression, the same arithmetic: a SQL function whose
-- body reads FROM a subquery is planned at each call, and a claim's bucket refill calls it
-- twice per bucket; one without is inlined into the statement that calls it.
CREATE OR REPLACE FUNCTION {schema}.control_rate(p_rate float8, p_from timestamptz, p_until timestamptz, p_at timestamptz)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_until IS NULL OR p_at >= p_until THEN p_rate
        ELSE power(least(1.0, coalesce(p_rate, 10000.0)),
                   1 - greatest(0.0, least(1.0, extract(epoch FROM p_at - p_from)::float8
                                                / greatest(extract(epoch FROM p_until - p_from)::float8, 0.001))))
             * power(coalesce(p_rate, 10000.0),
                     greatest(0.0, least(1.0, extract(epoch FROM p_at - p_from)::float8
                                              / greatest(extract(epoch FROM p_until - p_from)::float8, 0.001))))
    END
$$;

-- The jobs of a rated claim whose every job is under the same token buckets: no pause or
-- limit in its reach, its queue rated (not every queue's), its one type rated, or both. Each
-- job takes a token of every one of those buckets, so the claim locks them (in kind and name
-- order, as claim_rated does), takes as many jobs as the emptiest allows with the plain walk
-- of the ready index and writes each bucket once. NULL for any other claim: claim_rated's
-- general path takes it. Each of its statements keeps one plan (plan_cache_mode): left to
-- choose, PostgreSQL would plan each anew at every call. They read small tables by key, and
-- the walk takes the ready index in order whatever the LIMIT, with the planner settings of
-- the worker's claim session (sql/claims.sql, claim_session) that keep it from a sort of
-- every ready row, set here for the function's own statements.
CREATE FUNCTION {schema}.claim_bucketed(p_queue text, p_types text[], p_want integer)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off AS $$
DECLARE
    c record;
    j record;
    held boolean;
    rated_queues text[];
    rated_types text[];
    b_kind text[] := ARRAY[]::text[];
    b_name text[] := ARRAY[]::text[];
    b_tokens float8[] := ARRAY[]::float8[];
    got bigint[] := ARRAY[]::bigint[];
    have float8;
    qi integer;
BEGIN
    have := p_want;
    -- One read of the levers in reach: when none pauses or limits, and every job the claim
    -- can take is under the same buckets (its queue's, and its only type's), the bucket alone
    -- decides how many it takes.
    SELECT coalesce(bool_or(paused_at IS NOT NULL OR (kind = 'queue' AND max_running IS NOT NULL)), false),
           coalesce(array_agg(name) FILTER (WHERE kind = 'queue' AND (rate_per_second IS NOT NULL OR ramp_until > now())), ARRAY[]::text[]),
           coalesce(array_agg(name) FILTER (WHERE kind = 'type' AND (rate_per_second IS NOT NULL OR ramp_until > now())), ARRAY[]::text[])
    INTO held, rated_queues, rated_types
    FROM {schema}.queue_control
    WHERE kind = 'queue' AND (p_queue IS NULL OR name = p_queue) OR kind = 'type' AND name = ANY(p_types);
    IF held OR (cardinality(rated_queues) = 0 AND cardinality(rated_types) = 0)
       OR (cardinality(rated_queues) > 0 AND p_queue IS NULL)
       OR (cardinality(rated_types) > 0 AND NOT (cardinality(rated_types) = 1 AND p_types <@ rated_types)) THEN
        RETURN NULL;
    END IF;
    -- A spent bucket (by a read without a lock): nothing to take, no turn to wait for.
    FOR c IN SELECT qc.kind, qc.name, qc.rate_per_second, qc.ramp_from, qc.ramp_until,
                    {schema}.bucket_tokens(b.tokens, b.refilled_at, qc.rate_per_second, qc.ramp_from,
                                           qc.ramp_until) AS tokens
             FROM {schema}.queue_control AS qc LEFT JOIN {schema}.rate_bucket AS b USING (kind, name)
             WHERE qc.kind = 'queue' AND qc.name = ANY(rated_queues) OR qc.kind = 'type' AND qc.name = ANY(rated_types)
             ORDER BY qc.kind, qc.name
    LOOP
        IF c.tokens < 1 THEN
            RETURN got;
        END IF;
        b_kind := b_kind || c.kind;
        b_name := b_name || c.name;
    END LOOP;
    -- The buckets under lock, in kind and name order, refilled.
    FOR qi IN 1 .. cardinality(b_kind) LOOP
        SELECT b.tokens, b.refilled_at, qc.rate_per_second, qc.ramp_from, qc.ramp_until INTO j
        FROM {schema}.rate_bucket AS b JOIN {schema}.queue_control AS qc USING (kind, name)
        WHERE b.kind = b_kind[qi] AND b.name = b_name[qi]
        FOR UPDATE OF b;
        IF NOT FOUND THEN
            INSERT INTO {schema}.rate_bucket (kind, name, tokens, refilled_at) VALUES (b_kind[qi], b_name[qi], 0, now())
            ON CONFLICT (kind, name) DO NOTHING;
            SELECT b.tokens, b.refilled_at, qc.rate_per_second, qc.ramp_from, qc.ramp_until INTO j
            FROM {schema}.rate_bucket AS b JOIN {schema}.queue_control AS qc USING (kind, name)
            WHERE b.kind = b_kind[qi] AND b.name = b_name[qi]
            FOR UPDATE OF b;
        END IF;
        b_tokens := b_tokens || {schema}.bucket_tokens(j.tokens, j.refilled_at, j.rate_per_second, j.ramp_from, j.ramp_until);
        have := least(have, floor(b_tokens[qi]));
    END LOOP;
    IF cardinality(b_kind) = 0 OR have < 1 THEN
        RETURN got;
    END IF;
    -- Every job in reach takes a token of each bucket: the walk of the plain claim.
    got := ARRAY(SELECT id FROM {schema}.job
                 WHERE status = 'ready' AND run_at <= now() AND type = ANY(p_types)
                   AND (p_queue IS NULL OR queue = p_queue)
                 ORDER BY run_at, id
                 LIMIT have::integer
                 FOR UPDATE SKIP LOCKED);
    IF cardinality(got) > 0 THEN
        FOR qi IN 1 .. cardinality(b_kind) LOOP
            UPDATE {schema}.rate_bucket
            SET tokens = greatest(0.0, b_tokens[qi] - cardinality(got)), refilled_at = greatest(refilled_at, now())
            WHERE kind = b_kind[qi] AND name = b_name[qi];
        END LOOP;
    END IF;
    RETURN got;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.claim_rated(p_queue text, p_types text[], p_want integer)
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
    -- A claim whose every job is under the same buckets takes them there.
    got := {schema}.claim_bucketed(p_queue, p_types, p_want);
    IF got IS NOT NULL THEN
        RETURN got;
    END IF;
    got := ARRAY[]::bigint[];
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

-- claim_levered (migration 0018) with one read of the levers in reach instead of two, and
-- the walk's aside lists read only when the jobs taken so far leave room for it: a claim
-- that its rated (or limited) jobs filled reads queue_control no further.
CREATE OR REPLACE FUNCTION {schema}.claim_levered(p_queue text, p_types text[], p_want integer)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    got bigint[] := ARRAY[]::bigint[];
    aside_queues text[];
    aside_types text[];
    levered boolean;
    rated boolean;
BEGIN
    SELECT coalesce(bool_or(paused_at IS NOT NULL OR rate_per_second IS NOT NULL OR ramp_until > now()
                            OR (kind = 'queue' AND max_running IS NOT NULL)), false),
           coalesce(bool_or(rate_per_second IS NOT NULL OR ramp_until > now()), false)
    INTO levered, rated
    FROM {schema}.queue_control
    WHERE kind = 'queue' AND (p_queue IS NULL OR name = p_queue) OR kind = 'type' AND name = ANY(p_types);
    IF NOT levered THEN
        RETURN NULL;
    END IF;
    -- A claim its rated jobs filled returns at once: a condition that holds a subquery is a
    -- statement of its own, planned at each call.
    IF rated THEN
        got := {schema}.claim_rated(p_queue, p_types, p_want);
        IF cardinality(got) >= p_want THEN
            RETURN got;
        END IF;
    END IF;
    IF EXISTS (
            SELECT 1 FROM {schema}.queue_control
            WHERE kind = 'queue' AND max_running IS NOT NULL AND paused_at IS NULL
              AND (p_queue IS NULL OR name = p_queue)) THEN
        got := got || {schema}.claim_limited(p_queue, p_types, p_want - cardinality(got), got);
    END IF;
    IF cardinality(got) >= p_want THEN
        RETURN got;
    END IF;
    aside_queues := ARRAY(SELECT name FROM {schema}.queue_control
                          WHERE kind = 'queue' AND (paused_at IS NOT NULL OR max_running IS NOT NULL
                                OR rate_per_second IS NOT NULL OR ramp_until > now()));
    aside_types := ARRAY(SELECT name FROM {schema}.queue_control
                         WHERE kind = 'type' AND (paused_at IS NOT NULL
                               OR rate_per_second IS NOT NULL OR ramp_until > now()));
    IF (p_queue IS NULL OR p_queue <> ALL(aside_queues))
       AND EXISTS (SELECT 1 FROM unnest(p_types) AS t(name) WHERE t.name <> ALL(aside_types)) THEN
        got := got || ARRAY(
            SELECT id FROM {schema}.job
            WHERE status = 'ready' AND run_at <= now() AND type = ANY(p_types)
              AND (p_queue IS NULL OR queue = p_queue)
              AND (queue || '') <> ALL(aside_queues)
              AND (type || '') <> ALL(aside_types)
            ORDER BY run_at, id
            LIMIT p_want - cardinality(got)
            FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN got;
END;
$$;
