-- Three edges of the keys kept after their jobs (migration 0017).

-- A TRUNCATE of `job` with RESTART IDENTITY (a test suite's reset) starts the job ids again:
-- a key kept for a job that left before would return the id of whichever new job draws it.
-- The truncate now also forgets every kept key whose id the sequence will give out again (all
-- of them after a restart; none otherwise, the ids drawn so far being below the next). It
-- runs with its owner's rights, so that a role that may truncate `job` need not read the
-- sequence or delete from job_key itself (it could not truncate without that before). A
-- trigger function cannot be called but as a trigger, yet a role that may execute it could
-- make it the trigger of a table of its own: it refuses any table but `job`, and PUBLIC may
-- not execute it (a trigger fires whoever truncates).
CREATE OR REPLACE FUNCTION {schema}.job_key_truncated() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ids regclass := pg_get_serial_sequence('{schema}.job', 'id')::regclass;
    next_id bigint;
BEGIN
    IF TG_RELID <> '{schema}.job'::regclass THEN
        RAISE EXCEPTION 'job_key_truncated is the trigger of {schema}.job only';
    END IF;
    SELECT coalesce(pg_sequence_last_value(ids) + s.seqincrement, s.seqstart) INTO next_id
    FROM pg_catalog.pg_sequence AS s WHERE s.seqrelid = ids;
    DELETE FROM {schema}.job_key WHERE finished_at IS NULL OR job_id >= next_id;
    RETURN NULL;
END;
$$;
REVOKE EXECUTE ON FUNCTION {schema}.job_key_truncated() FROM PUBLIC;

-- A keyed enqueue draws its job's id from the sequence itself (it claims the key first, in
-- job_key), which takes USAGE on the sequence where the table's identity default did not. A
-- role granted INSERT on `job` by hand before migration 0017 enqueued keyed jobs then; it
-- keeps doing so, and may grant it on as it may grant INSERT.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who,
                    bool_or(a.is_grantable) AS grantable
             FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
             LEFT JOIN pg_roles r ON r.oid = a.grantee
             WHERE c.oid = '{schema}.job'::regclass AND a.grantee <> c.relowner AND a.privilege_type = 'INSERT'
             GROUP BY 1
    LOOP
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %s%s', pg_get_serial_sequence('{schema}.job', 'id'), g.who,
                       CASE WHEN g.grantable THEN ' WITH GRANT OPTION' ELSE '' END);
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
