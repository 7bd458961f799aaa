-- A claim under one token bucket charges it without computing its tokens again. Migration
-- 0022's claim_pick read the bucket's tokens, refilled to now, without a lock, walked that
-- far and charged the bucket with an update that refilled it to now once more, twice over
-- (to write the tokens and to check that they held), whoever wrote the row in between. Each
-- refill is an expression of a dozen steps that PostgreSQL builds at every execution of the
-- update; with a claim of 10 jobs under a rate they were a third of what the rate added to
-- the server's CPU. Now the update is fenced by the row as it was read, its tokens and its
-- refill time: while they are unchanged, the tokens now are the ones read, written less the
-- jobs taken. Only when the row was written in between (by another claim, or an operator's
-- rate or resume) does the update of 0022 run.
-- claim_pick is replaced in place, its signature unchanged: its grants stay, and a claim
-- under way when this migration commits finds the function it calls.

-- As in migration 0022, the bucket's charge fenced by its row as read. The ids a claim
-- takes: the claim statement's whole walk. One read of the levers in the claim's reach, with
-- their buckets' tokens (read without a lock, to set a spent bucket aside before any walk);
-- no lever: the plain walk of the ready index. Every statement here
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
    one_raw float8;
    one_refilled timestamptz;
    fresh boolean := false;
BEGIN
    -- Each lever in reach (a few rows at most), with its bucket's tokens refilled to now. A
    -- rated queue or type whose bucket holds no token is spent; the others are rated. For a
    -- claim under one bucket, that bucket's tokens, rate and ramp bound its walk below.
    FOR c IN SELECT qc.kind, qc.name, qc.paused_at IS NOT NULL AS paused, qc.max_running,
                    qc.rate_per_second IS NOT NULL OR coalesce(qc.ramp_until > now(), false) AS rated,
                    qc.rate_per_second, qc.ramp_from, qc.ramp_until, b.kind IS NULL AS no_bucket,
                    b.tokens AS raw_tokens, b.refilled_at AS raw_refilled,
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
                one_raw := c.raw_tokens;
                one_refilled := c.raw_refilled;
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
    -- from the next claim, as one changed during a claim always has). While the bucket's row
    -- is as read (its tokens and refill time), its tokens now are the ones read: the update
    -- writes them less the jobs, fenced by that row. Written since (by another claim, or an
    -- operator's rate or resume): the update refills it to now again and charges it if it
    -- holds enough. Neither: claims since the read took the tokens (or the row is gone):
    -- claim_paced below takes the bucket's lock and as many jobs as it holds now; the ones
    -- locked here and not taken stay locked until commit.
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
        SET tokens = one_tokens - cardinality(got), refilled_at = greatest(b.refilled_at, now())
        WHERE b.kind = CASE WHEN cardinality(rated_queues) = 1 THEN 'queue' ELSE 'type' END
          AND b.name = coalesce(rated_queues[1], rated_types[1])
          AND b.tokens = one_raw AND b.refilled_at = one_refilled;
        IF FOUND THEN
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
