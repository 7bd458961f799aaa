-- Idempotency keys kept after their job leaves the queue table: a key returns its job's id
-- for `--key-retention` (7 days by default) after the job finished, whether it was archived,
-- deleted by --delete-done, pruned dead or failed, or discarded.
--
-- job_key holds one row per key: every key enqueued by this release, from its enqueue on,
-- and the key of every keyed job that left `job`. Its primary key is what decides between
-- enqueues of one key: an enqueue claims the key here first and inserts the job only if the
-- key was free (kernel/sql/jobs.sql, enqueue_keyed). A key's row never goes while its job is
-- in `job`, and goes only once its window has passed (the archiver's job_key_prune), so two
-- enqueues of one key, one of them racing the archiver moving the job out, cannot both find
-- it free. `job`'s own unique index on the key stays: the previous release enqueues through
-- it.
--
-- finished_at: set when the job left `job`, to the job's finish (or the time it left, for
-- a job that never finished). NULL while the job is in `job`. The window counts from it.
CREATE TABLE {schema}.job_key (
    key         text PRIMARY KEY,
    job_id      bigint NOT NULL,
    finished_at timestamptz
);
CREATE INDEX job_key_finished_idx ON {schema}.job_key (finished_at) WHERE finished_at IS NOT NULL;

-- Every keyed job that leaves `job`, by any path (the archiver of this release or of the
-- previous one, pruning, a bulk discard, a DELETE by hand), leaves its key here, in the same
-- transaction. A job the previous release enqueued has no row yet: it gets one. Row by row,
-- only for keyed jobs (WHEN): a keyless delete, --delete-on-complete's, fires nothing.
CREATE FUNCTION {schema}.job_key_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.job_key AS k (key, job_id, finished_at)
    VALUES (OLD.idempotency_key, OLD.id, coalesce(OLD.finished_at, now()))
    ON CONFLICT (key) DO UPDATE SET job_id = excluded.job_id, finished_at = excluded.finished_at;
    RETURN NULL;
END;
$$;

-- A TRUNCATE of `job` (a test suite's reset) fires no delete trigger: the keys of the jobs it
-- removed go with them, rather than point at jobs that never finished; keys of jobs that left
-- before stay for their window.
CREATE FUNCTION {schema}.job_key_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.job_key WHERE finished_at IS NULL;
    RETURN NULL;
END;
$$;

-- Whoever could use `job` can use job_key alike: enqueuers insert into it, the archiver's
-- deletes write to it through the trigger and prune it, readers read it.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT a.privilege_type, a.is_grantable,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
             FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
             LEFT JOIN pg_roles r ON r.oid = a.grantee
             WHERE c.oid = '{schema}.job'::regclass AND a.grantee <> c.relowner
               AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
    LOOP
        EXECUTE format('GRANT %s ON {schema}.job_key TO %s%s', g.privilege_type, g.who,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END;
$$;

-- Last: the triggers take a lock on `job` that enqueues and claims wait for, held from here
-- to the commit, an instant.
CREATE TRIGGER job_key_kept AFTER DELETE ON {schema}.job
    FOR EACH ROW WHEN (OLD.idempotency_key IS NOT NULL) EXECUTE FUNCTION {schema}.job_key_keep();
CREATE TRIGGER job_key_truncated AFTER TRUNCATE ON {schema}.job
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.job_key_truncated();
