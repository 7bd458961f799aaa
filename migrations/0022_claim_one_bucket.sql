-- A claim under one token bucket charges it without a second function. Migration 0021 handed
-- every claim with a rate in reach to claim_paced, which for a claim under one bucket (its
-- queue rated, or its one type) walked as far as the tokens claim_pick had read and charged
-- the bucket with one update: a call of a second PL/pgSQL function, with its thirteen
-- arguments and two dozen variables set up and a dozen conditions evaluated, for a walk and an
-- update that claim_pick can make itself. claim_pick now does; claim_paced, which it still
-- calls for every other claim with a rate or pause in reach, and when the bucket's tokens ran
-- out between the read and the update, no longer takes the tokens read: under the same
-- buckets throughout it locks them first. Both are replaced in place, signatures unchanged:
-- their grants stay, and a claim under way when this migration commits finds the functions
-- it calls. The claim statements of earlier releases call claim_pick (through
-- claim_levered) as they did.

-- The jobs of a claim with a rate or a pause in reach (and no rate where a limit is), but the
-- claim under one bucket whose tokens held (claim_pick's): ready, due jobs of p_types in
-- p_queue (every queue when NULL), in claim order, up to p_want, none of p_taken, none of the
-- queues and types set aside (paused, limited: claim_limited takes those; rated with a spent
-- bucket, by claim_pick's read without a lock). A job of a queue or type in p_rated_* takes a
-- token of its bucket.
-- - When every job the claim can take is under the same buckets (its queue is the rated one,
--   its one type the rated one, or both; queues set aside stay aside), it locks them first,
--   in kind and name order, and walks only as far as the emptiest allows.
-- - Otherwise it walks first, locking the jobs (SKIP LOCKED, as the plain claim does), and
--   locks only the buckets of the rated jobs among them, in kind and name order: a claim that
--   meets no rated job locks no bucket. A rated job whose bucket has no token left is passed
--   over and its queue or type set aside; the next round walks on for the rest. Each round
--   sets one aside at least, so the rounds end; a bucket a later round would need is not
--   locked then (it would break the order): its jobs wait for a claim whose first round
--   meets them.
-- Every claim waits on the buckets' rows in one order and on no job row, so claims never
-- deadlock; rows passed over stay locked (not taken) until the claim commits. Each bucket
-- that gave tokens is written once. p_fresh: a rated bucket has no row yet; it gets one
-- before any lock. p_tokens, p_rate, p_ramp_from and p_ramp_until are no longer read (the
-- signature of migration 0021, kept). Called by claim_pick, under its planner settings.
CREATE OR REPLACE FUNCTION {schema}.claim_paced(p_queue text, p_types text[], p_want integer, p_taken bigint[],
                                                p_aside_queues text[], p_aside_types text[],
                                                p_rated_queues text[], p_rated_types text[],
                                                p_tokens float8, p_rate float8, p_ramp_from timestamptz,
                                                p_ramp_until timestamptz, p_fresh boolean)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c record;
    got bigint[] := ARRAY[]::bigint[];
    aside_queues text[] := p_aside_queues;
    aside_types text[] := p_aside_types;
    live_types text[];
    w_id bigint[];
    w_queue text[];
    w_type text[];
    w_rated boolean;
    b_kind text[] := ARRAY[]::text[];
    b_name text[] := ARRAY[]::text[];
    b_key text[] := ARRAY[]::text[];
    b_tokens float8[] := ARRAY[]::float8[];
    b_taken boolean[] := ARRAY[]::boolean[];
    locked boolean := false;
    passed boolean;
    have float8;
    want integer;
    qi integer;
    ti integer;
    i integer;
BEGIN
    live_types := p_types;
    IF cardinality(aside_types) > 0 THEN
        live_types := ARRAY(SELECT t FROM unnest(p_types) AS t WHERE t <> ALL(aside_types));
    END IF;
    IF p_want <= 0 OR p_queue = ANY(aside_queues) OR cardinality(live_types) = 0 THEN
        RETURN got;
    END IF;
    IF p_fresh THEN
        INSERT INTO {schema}.rate_bucket (kind, name, tokens, refilled_at)
        SELECT kind, name, 0, now()
        FROM (SELECT 'queue' AS kind, q AS name FROM unnest(p_rated_queues) AS q
              UNION ALL SELECT 'type', t FROM unnest(p_rated_types) AS t) AS fresh
        ORDER BY kind, name
        ON CONFLICT (kind, name) DO NOTHING;
    END IF;
    -- Under the same buckets throughout: as many jobs as the emptiest allows.
    IF cardinality(p_rated_queues) + cardinality(p_rated_types) > 0
       AND (cardinality(p_rated_queues) = 0 OR p_rated_queues = ARRAY[p_queue])
       AND (cardinality(p_rated_types) = 0 OR live_types = p_rated_types) THEN
        have := p_want;
        FOR c IN SELECT b.kind, b.name,
                        {schema}.bucket_tokens(b.tokens, b.refilled_at, qc.rate_per_second, qc.ramp_from,
                                               qc.ramp_until) AS tokens
                 FROM {schema}.rate_bucket AS b JOIN {schema}.queue_control AS qc USING (kind, name)
                 WHERE b.kind = 'queue' AND b.name = ANY(p_rated_queues) OR b.kind = 'type' AND b.name = ANY(p_rated_types)
                 ORDER BY b.kind, b.name
                 FOR UPDATE OF b
        LOOP
            b_kind := b_kind || c.kind;
            b_name := b_name || c.name;
            b_tokens := b_tokens || c.tokens;
            have := least(have, floor(c.tokens));
        END LOOP;
        -- A rate cleared since claim_pick's read leaves its bucket out: the next claim sees it.
        IF cardinality(b_kind) < cardinality(p_rated_queues) + cardinality(p_rated_types) OR have < 1 THEN
            RETURN got;
        END IF;
        got := ARRAY(SELECT id FROM {schema}.job
                     WHERE status = 'ready' AND run_at <= now() AND type = ANY(live_types)
                       AND (p_queue IS NULL OR queue = p_queue)
                       AND (queue || '') <> ALL(aside_queues)
                       AND NOT (id = ANY(p_taken))
                     ORDER BY run_at, id
                     LIMIT have::integer
                     FOR UPDATE SKIP LOCKED);
        IF cardinality(got) = 0 THEN
            RETURN got;
        END IF;
        UPDATE {schema}.rate_bucket AS b
        SET tokens = greatest(0.0, t.tokens - cardinality(got)), refilled_at = greatest(b.refilled_at, now())
        FROM unnest(b_kind, b_name, b_tokens) AS t(kind, name, tokens)
        WHERE b.kind = t.kind AND b.name = t.name;
        RETURN got;
    END IF;
    LOOP
        want := p_want - cardinality(got);
        -- The aggregates take the walk's rows in the order its subquery gives them, claim order
        -- (the ready index, in order, under the lock); an ORDER BY in each would sort them
        -- three times over at every claim.
        SELECT coalesce(array_agg(w.id), ARRAY[]::bigint[]),
               coalesce(array_agg(w.queue), ARRAY[]::text[]),
               coalesce(array_agg(w.type), ARRAY[]::text[]),
               coalesce(bool_or(w.queue = ANY(p_rated_queues) OR w.type = ANY(p_rated_types)), false)
        INTO w_id, w_queue, w_type, w_rated
        FROM (SELECT id, queue, type, run_at FROM {schema}.job
              WHERE status = 'ready' AND run_at <= now() AND type = ANY(live_types)
                AND (p_queue IS NULL OR queue = p_queue)
                AND (queue || '') <> ALL(aside_queues) AND (type || '') <> ALL(aside_types)
                AND NOT (id = ANY(p_taken)) AND NOT (id = ANY(got))
              ORDER BY run_at, id
              LIMIT want
              FOR UPDATE SKIP LOCKED) AS w;
        IF NOT w_rated THEN
            got := got || w_id;
            EXIT;
        END IF;
        -- The buckets of the rated jobs found, once, in kind and name order.
        IF NOT locked THEN
            FOR c IN SELECT b.kind, b.name,
                            {schema}.bucket_tokens(b.tokens, b.refilled_at, qc.rate_per_second, qc.ramp_from,
                                                   qc.ramp_until) AS tokens
                     FROM {schema}.rate_bucket AS b JOIN {schema}.queue_control AS qc USING (kind, name)
                     WHERE b.kind = 'queue' AND b.name = ANY(p_rated_queues) AND b.name = ANY(w_queue)
                        OR b.kind = 'type' AND b.name = ANY(p_rated_types) AND b.name = ANY(w_type)
                     ORDER BY b.kind, b.name
                     FOR UPDATE OF b
            LOOP
                b_kind := b_kind || c.kind;
                b_name := b_name || c.name;
                b_key := b_key || (c.kind || ':' || c.name);
                b_tokens := b_tokens || c.tokens;
                b_taken := b_taken || false;
            END LOOP;
            locked := true;
        END IF;
        passed := false;
        FOR i IN 1 .. cardinality(w_id) LOOP
            qi := array_position(b_key, 'queue:' || w_queue[i]);
            ti := array_position(b_key, 'type:' || w_type[i]);
            IF w_queue[i] = ANY(aside_queues) OR w_type[i] = ANY(aside_types) THEN
                passed := true;
                CONTINUE;
            END IF;
            IF w_queue[i] = ANY(p_rated_queues) AND (qi IS NULL OR b_tokens[qi] < 1) THEN
                aside_queues := aside_queues || w_queue[i];
                passed := true;
                CONTINUE;
            END IF;
            IF w_type[i] = ANY(p_rated_types) AND (ti IS NULL OR b_tokens[ti] < 1) THEN
                aside_types := aside_types || w_type[i];
                passed := true;
                CONTINUE;
            END IF;
            got := got || w_id[i];
            IF qi IS NOT NULL THEN
                b_tokens[qi] := b_tokens[qi] - 1;
                b_taken[qi] := true;
            END IF;
            IF ti IS NOT NULL THEN
                b_tokens[ti] := b_tokens[ti] - 1;
                b_taken[ti] := true;
            END IF;
        END LOOP;
        -- Done when nothing was passed over (the walk took what there was) or the claim is full.
        EXIT WHEN NOT passed OR cardinality(w_id) < want OR cardinality(got) >= p_want;
    END LOOP;
    IF true = ANY(b_taken) THEN
        UPDATE {schema}.rate_bucket AS b
        SET tokens = greatest(0.0, t.tokens), refilled_at = greatest(b.refilled_at, now())
        FROM unnest(b_kind, b_name, b_tokens, b_taken) AS t(kind, name, tokens, taken)
        WHERE t.taken AND b.kind = t.kind AND b.name = t.name;
    END IF;
    RETURN got;
END;
$$;

-- As in migration 0021, but for a claim under one bucket, which claim_pick walks and charges
-- itself. The ids a claim takes: the claim statement's whole walk. One read of the levers in
-- the claim's reach, with their buckets' tokens (read without a lock, to set a spent bucket
-- aside before any walk); no lever: the plain walk of the ready index. Every statement here
-- and in the functions it calls keeps one plan (plan_cache_mode), with the planner settings
-- of the worker's claim session.
CREATE OR REPLACE FUNCTION {schema}.claim_pick(p_queue text, p_types text[], p_want integer)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off AS $$
DECLARE
    c record;
    got bigint[] := ARRAY[]::bigint[];
    paused_queues text[] := ARRAY[]::text[];
    paused_types text[] := ARRAY[]::text[];
    limited_queues text[] := ARRAY[]::text[];
    rated_queues text[] := ARRAY[]::text[];
    rated_types text[] := ARRAY[]::text[];
    spent_queues text[] := ARRAY[]::text[];
    spent_types text[] := ARRAY[]::text[];
    one_tokens float8;
    one_rate float8;
    one_from timestamptz;
    one_until timestamptz;
    fresh boolean := false;
BEGIN
    -- Each lever in reach (a few rows at most), with its bucket's tokens refilled to now. A
    -- rated queue or type whose bucket holds no token is spent; the others are rated. For a
    -- claim under one bucket, that bucket's tokens, rate and ramp bound its walk below.
    FOR c IN SELECT qc.kind, qc.name, qc.paused_at IS NOT NULL AS paused, qc.max_running,
                    qc.rate_per_second IS NOT NULL OR coalesce(qc.ramp_until > now(), false) AS rated,
                    qc.rate_per_second, qc.ramp_from, qc.ramp_until, b.kind IS NULL AS no_bucket,
                    {schema}.bucket_tokens(b.tokens, b.refilled_at, qc.rate_per_second, qc.ramp_from,
                                           qc.ramp_until) AS tokens
             FROM {schema}.queue_control AS qc LEFT JOIN {schema}.rate_bucket AS b USING (kind, name)
             WHERE qc.kind = 'queue' AND (p_queue IS NULL OR qc.name = p_queue)
                OR qc.kind = 'type' AND qc.name = ANY(p_types)
    LOOP
        IF c.paused THEN
            IF c.kind = 'queue' THEN
                paused_queues := paused_queues || c.name;
            ELSE
                paused_types := paused_types || c.name;
            END IF;
            CONTINUE;
        END IF;
        IF c.kind = 'queue' AND c.max_running IS NOT NULL THEN
            limited_queues := limited_queues || c.name;
        END IF;
        IF NOT c.rated THEN
            CONTINUE;
        ELSIF NOT c.no_bucket AND c.tokens < 1 THEN
            IF c.kind = 'queue' THEN
                spent_queues := spent_queues || c.name;
            ELSE
                spent_types := spent_types || c.name;
            END IF;
        ELSE
            IF c.kind = 'queue' THEN
                rated_queues := rated_queues || c.name;
            ELSE
                rated_types := rated_types || c.name;
            END IF;
            fresh := fresh OR c.no_bucket;
            IF one_tokens IS NULL OR c.tokens < one_tokens THEN
                one_tokens := c.tokens;
                one_rate := c.rate_per_second;
                one_from := c.ramp_from;
                one_until := c.ramp_until;
            END IF;
        END IF;
    END LOOP;
    IF cardinality(paused_queues) + cardinality(paused_types) + cardinality(limited_queues)
       + cardinality(rated_queues) + cardinality(rated_types) + cardinality(spent_queues) + cardinality(spent_types) = 0 THEN
        RETURN ARRAY(SELECT id FROM {schema}.job
                     WHERE status = 'ready' AND run_at <= now() AND type = ANY(p_types)
                       AND (p_queue IS NULL OR queue = p_queue)
                     ORDER BY run_at, id
                     LIMIT p_want
                     FOR UPDATE SKIP LOCKED);
    END IF;
    -- One rated queue or type, and every job the claim can take under its bucket: the walk
    -- goes only as far as the tokens read above, and one update charges the bucket if it
    -- still holds them (with the rate and ramp read above: a rate changed in between holds
    -- from the next claim, as one changed during a claim always has). Claims since the read
    -- took tokens (or the rate was cleared): claim_paced below takes the bucket's lock and as
    -- many jobs as it holds now; the ones locked here and not taken stay locked until commit.
    IF NOT fresh AND cardinality(rated_queues) + cardinality(rated_types) = 1
       AND (rated_queues = ARRAY[p_queue] OR rated_types = p_types)
       AND cardinality(paused_queues) + cardinality(paused_types) + cardinality(limited_queues)
           + cardinality(spent_queues) + cardinality(spent_types) = 0 THEN
        got := ARRAY(SELECT id FROM {schema}.job
                     WHERE status = 'ready' AND run_at <= now() AND type = ANY(p_types)
                       AND (p_queue IS NULL OR queue = p_queue)
                     ORDER BY run_at, id
                     LIMIT least(p_want, floor(one_tokens))::integer
                     FOR UPDATE SKIP LOCKED);
        IF cardinality(got) = 0 THEN
            RETURN got;
        END IF;
        UPDATE {schema}.rate_bucket AS b
        SET tokens = {schema}.bucket_tokens(b.tokens, b.refilled_at, one_rate, one_from, one_until) - cardinality(got),
            refilled_at = greatest(b.refilled_at, now())
        WHERE b.kind = CASE WHEN cardinality(rated_queues) = 1 THEN 'queue' ELSE 'type' END
          AND b.name = coalesce(rated_queues[1], rated_types[1])
          AND {schema}.bucket_tokens(b.tokens, b.refilled_at, one_rate, one_from, one_until) >= cardinality(got);
        IF FOUND THEN
            RETURN got;
        END IF;
        got := ARRAY[]::bigint[];
    END IF;
    IF cardinality(limited_queues) > 0
       AND cardinality(rated_queues) + cardinality(rated_types) + cardinality(spent_queues) + cardinality(spent_types) > 0 THEN
        got := {schema}.claim_rated(p_queue, p_types, p_want);
        IF cardinality(got) < p_want THEN
            got := got || {schema}.claim_limited(p_queue, p_types, p_want - cardinality(got), got);
        END IF;
        RETURN got || {schema}.claim_paced(p_queue, p_types, p_want - cardinality(got), got,
                                           paused_queues || limited_queues || rated_queues || spent_queues,
                                           paused_types || rated_types || spent_types,
                                           ARRAY[]::text[], ARRAY[]::text[], NULL, NULL, NULL, NULL, false);
    END IF;
    IF cardinality(limited_queues) > 0 THEN
        got := {schema}.claim_limited(p_queue, p_types, p_want, got);
    END IF;
    RETURN got || {schema}.claim_paced(p_queue, p_types, p_want - cardinality(got), got,
                                       paused_queues || limited_queues || spent_queues, paused_types || spent_types,
                                       rated_queues, rated_types, NULL, NULL, NULL, NULL, fresh);
END;
$$;
