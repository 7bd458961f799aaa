-- The claim's levered walk as a function (sql/claims.sql, claim): the claim statement that
-- PostgreSQL plans at every call (its custom plans) holds only the plain walk and this call,
-- so a claim that no lever can hold back pays for neither the planning nor the execution of
-- the lever work. NULL when no pause, limit or rate (or ramp) applies to the claim's queue
-- (every queue's, for p_queue NULL) or to one of its types: the caller then walks the ready
-- index itself. Otherwise the jobs the claim may take, as the claim statement of the release
-- before took them: those of rated queues and types from claim_rated (only when a rate is in
-- the claim's reach), those of limited queues from claim_limited (only when a limit is), and
-- the others from a walk that leaves out paused, limited and rated queues and types, which
-- does not start when the claim's queue or every one of its types is among them. Each
-- statement here takes a fresh snapshot, as claim_limited's do: a lever set just before is
-- seen. Additive: the claim statement of the release before does not call it.
CREATE FUNCTION {schema}.claim_levered(p_queue text, p_types text[], p_want integer)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    got bigint[] := ARRAY[]::bigint[];
    aside_queues text[];
    aside_types text[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {schema}.queue_control
                   WHERE (kind = 'queue' AND (p_queue IS NULL OR name = p_queue)
                          AND (paused_at IS NOT NULL OR max_running IS NOT NULL
                               OR rate_per_second IS NOT NULL OR ramp_until > now()))
                      OR (kind = 'type' AND name = ANY(p_types)
                          AND (paused_at IS NOT NULL OR rate_per_second IS NOT NULL OR ramp_until > now()))) THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.queue_control
               WHERE (rate_per_second IS NOT NULL OR ramp_until > now())
                 AND (kind = 'queue' AND (p_queue IS NULL OR name = p_queue)
                      OR kind = 'type' AND name = ANY(p_types))) THEN
        got := {schema}.claim_rated(p_queue, p_types, p_want);
    END IF;
    IF cardinality(got) < p_want AND EXISTS (
            SELECT 1 FROM {schema}.queue_control
            WHERE kind = 'queue' AND max_running IS NOT NULL AND paused_at IS NULL
              AND (p_queue IS NULL OR name = p_queue)) THEN
        got := got || {schema}.claim_limited(p_queue, p_types, p_want - cardinality(got), got);
    END IF;
    aside_queues := ARRAY(SELECT name FROM {schema}.queue_control
                          WHERE kind = 'queue' AND (paused_at IS NOT NULL OR max_running IS NOT NULL
                                OR rate_per_second IS NOT NULL OR ramp_until > now()));
    aside_types := ARRAY(SELECT name FROM {schema}.queue_control
                         WHERE kind = 'type' AND (paused_at IS NOT NULL
                               OR rate_per_second IS NOT NULL OR ramp_until > now()));
    IF cardinality(got) < p_want AND (p_queue IS NULL OR p_queue <> ALL(aside_queues))
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
