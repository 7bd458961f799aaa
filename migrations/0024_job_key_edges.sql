-- Three edges of the keys kept after their jobs (migration 0017).
--
-- A TRUNCATE of `job` with RESTART IDENTITY (a test suite's reset) starts the job ids again
-- from 1: a key kept for a job that left before would return the id of whichever new job
-- draws it. After a restart the sequence has not been drawn from (its last value reads NULL):
-- every key goes then. Only a sequence's owner can restart it, and only a role that may read
-- it is asked; a TRUNCATE by another role keeps, as before, the keys of the jobs that had left.
CREATE OR REPLACE FUNCTION {schema}.job_key_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids regclass := pg_get_serial_sequence('{schema}.job', 'id')::regclass;
BEGIN
    IF has_sequence_privilege(ids, 'SELECT, USAGE') AND pg_sequence_last_value(ids) IS NULL THEN
        DELETE FROM {schema}.job_key;
    ELSE
        DELETE FROM {schema}.job_key WHERE finished_at IS NULL;
    END IF;
    RETURN NULL;
END;
$$;

-- A keyed enqueue draws its job's id from the sequence itself (it claims the key first, in
-- job_key), which takes USAGE on the sequence where the table's identity default did not. A
-- role granted INSERT on `job` by hand before migration 0017 enqueued keyed jobs then; it
-- keeps doing so.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
             FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
             LEFT JOIN pg_roles r ON r.oid = a.grantee
             WHERE c.oid = '{schema}.job'::regclass AND a.grantee <> c.relowner AND a.privilege_type = 'INSERT'
    LOOP
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %s', pg_get_serial_sequence('{schema}.job', 'id'), g.who);
    END LOOP;
END;
$$;

-- The archiver's schedule carries the key window in its payload (`--key-retention`), written
-- by each worker as it starts. A worker of the previous release writes a payload without it,
-- which would put the window back to its default (7 days) until a worker of this release
-- starts again: keys the operator meant to keep longer would be forgotten. An update that
-- leaves the window out keeps the one the row had.
CREATE FUNCTION {schema}.schedule_key_window_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.payload := NEW.payload || jsonb_build_object('key', OLD.payload -> 'key');
    RETURN NEW;
END;
$$;

CREATE TRIGGER schedule_key_window_kept BEFORE UPDATE ON {schema}.schedule
    FOR EACH ROW WHEN (NEW.job_type = 'jobtui.archive' AND OLD.payload ? 'key' AND NOT NEW.payload ? 'key')
    EXECUTE FUNCTION {schema}.schedule_key_window_kept();
