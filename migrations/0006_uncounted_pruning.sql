-- Releases that do not count as attempts (a handler's Retry, its own database errors) are
-- bounded: the job row counts how many came in a row since an attempt last counted, and the
-- worker counts the next one once the bound is reached. A constant default adds the column
-- without rewriting the table.
ALTER TABLE {schema}.job ADD COLUMN uncounted integer NOT NULL DEFAULT 0;
ALTER TABLE {schema}.job_archive ADD COLUMN uncounted integer NOT NULL DEFAULT 0;

-- Effects are pruned by age (see prune_effect), oldest first.
CREATE INDEX effect_created_idx ON {schema}.effect (created_at);

-- Old audit rows are pruned by the archiver, which runs as the worker role; that role may
-- add to the audit log but not change or delete it. This function, run with its owner's
-- rights, deletes only rows older than the retention it is given, and never one younger than
-- 30 days, so the worker role still cannot erase recent history.
CREATE FUNCTION {schema}.prune_audit(retention interval, batch integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH gone AS (
        DELETE FROM {schema}.audit
        WHERE id IN (SELECT id FROM {schema}.audit
                     WHERE at < now() - greatest(retention, interval '30 days')
                     ORDER BY at LIMIT batch)
        RETURNING 1
    )
    SELECT count(*)::integer FROM gone;
$$;
REVOKE EXECUTE ON FUNCTION {schema}.prune_audit(interval, integer) FROM PUBLIC;
