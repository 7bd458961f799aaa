-- Named queues, fleet-wide pauses and global concurrency limits.
--
-- Every job belongs to a queue ('default' unless enqueued with another). A constant default
-- adds the column to the catalog only: the table is not rewritten, and no index is built.
-- The check is added NOT VALID, so that no scan of the existing rows (which all hold the
-- default) runs under the table's lock; new and updated rows are checked all the same.
-- The claim keeps walking job_ready_idx in run_at order and reads the queue from the row it
-- is about to lock anyway, so a claim for one queue steps over due rows of other queues that
-- are older than its own (docs/operations.md, "Queues, pauses and limits").
ALTER TABLE {schema}.job
    ADD COLUMN queue text NOT NULL DEFAULT 'default',
    ADD CONSTRAINT job_queue_check CHECK (queue <> '' AND length(queue) <= 200) NOT VALID;
ALTER TABLE {schema}.job_archive ADD COLUMN queue text NOT NULL DEFAULT 'default';

-- One row per queue or job type an operator paused or limited. Every claim reads this small
-- table in its own statement, so a pause or a limit holds on every worker from its next
-- claim, and across restarts. A type is only ever paused; a queue may also be limited.
CREATE TABLE {schema}.queue_control (
    kind        text        NOT NULL CHECK (kind IN ('queue', 'type')),
    name        text        NOT NULL CHECK (name <> ''),
    paused_at   timestamptz,
    paused_by   text,
    max_running integer     CHECK (max_running >= 0 AND max_running <= 1000000),
    changed_at  timestamptz NOT NULL DEFAULT now(),
    changed_by  text        NOT NULL,
    PRIMARY KEY (kind, name),
    CHECK (kind = 'queue' OR max_running IS NULL),
    CHECK ((paused_at IS NULL) = (paused_by IS NULL))
);

-- The jobs of limited queues a claim may take: for each limited, unpaused queue it may claim
-- (p_queue, or every one when NULL), in name order, up to p_want in all, never more than the
-- queue's max_running minus its jobs running now. Each queue's count runs under a
-- transaction-scoped advisory lock held until the claim commits, and in a snapshot of its
-- own taken after the lock (a volatile function's statements each take a fresh one): the
-- next claim of that queue waits, then counts the jobs this one took. Claims of queues
-- without a limit never take the lock. The rows are locked here and updated by the claim.
CREATE FUNCTION {schema}.claim_limited(p_queue text, p_types text[], p_want integer)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c record;
    room bigint;
    got bigint[] := ARRAY[]::bigint[];
BEGIN
    FOR c IN SELECT name, max_running FROM {schema}.queue_control
             WHERE kind = 'queue' AND max_running IS NOT NULL AND paused_at IS NULL
               AND (p_queue IS NULL OR name = p_queue)
             ORDER BY name
    LOOP
        EXIT WHEN cardinality(got) >= p_want;
        -- Keyed by schema and queue ({schema} is the quoted schema name, inside the literal).
        PERFORM pg_advisory_xact_lock(hashtextextended('{schema}.queue_limit.' || c.name, 0));
        SELECT c.max_running - count(*) INTO room FROM {schema}.job
        WHERE status = 'running' AND queue = c.name;
        room := least(room, p_want - cardinality(got));
        IF room > 0 THEN
            got := got || ARRAY(
                SELECT id FROM {schema}.job
                WHERE status = 'ready' AND run_at <= now() AND queue = c.name
                  AND type = ANY(p_types)
                  -- An expression, estimated by default, as in the claim (queries.sql).
                  AND (type || '') <> ALL(ARRAY(SELECT name FROM {schema}.queue_control
                                                WHERE kind = 'type' AND paused_at IS NOT NULL))
                ORDER BY run_at, id
                LIMIT room
                FOR UPDATE SKIP LOCKED);
        END IF;
    END LOOP;
    RETURN got;
END;
$$;
