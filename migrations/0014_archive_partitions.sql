-- job_archive partitioned by day (UTC), so that pruning a day of archived jobs is dropping
-- one table, whatever it holds, instead of deleting its rows one by one (each delete a WAL
-- record, a dead tuple for vacuum, and a scan for the next batch).
--
-- jobtui makes its partitions itself (archive_partitions_add, called by the archiver), rather
-- than through an extension such as pg_partman: managed databases, the embedded server and
-- many installs cannot add one, and the work is a CREATE TABLE a day and a DROP TABLE a day.
--
-- Existing installs: the archive as it was becomes job_archive_legacy, renamed in place (a
-- catalog change: no rewrite, no scan, however many rows it holds). It is not attached as a
-- partition, which would scan it under an exclusive lock to check its rows' range. The
-- archiver prunes it by DELETE as before, oldest first, and drops it once it is empty. Until
-- then, queries of old archived rows read it beside job_archive. A migration that adds a
-- column to job_archive adds it to job_archive_legacy too, while that exists.
--
-- A worker of the previous release keeps working: its archiver inserts into job_archive by
-- name (rows go to their day's partition, or to the default partition when none exists yet)
-- and deletes from it by archived_at.

ALTER TABLE {schema}.job_archive RENAME TO job_archive_legacy;
ALTER INDEX {schema}.job_archive_pkey RENAME TO job_archive_legacy_pkey;
ALTER INDEX {schema}.job_archive_finished_idx RENAME TO job_archive_legacy_finished_idx;

CREATE TABLE {schema}.job_archive (LIKE {schema}.job_archive_legacy INCLUDING DEFAULTS)
    PARTITION BY RANGE (archived_at);
-- A key of a partitioned table holds its partition key; id comes first, for look-ups by id.
ALTER TABLE {schema}.job_archive ADD PRIMARY KEY (id, archived_at);
CREATE INDEX job_archive_finished_idx ON {schema}.job_archive (finished_at);
-- Rows of a day that has no partition (a worker of the previous release archiving while no
-- archiver of this one made the day's partition): kept, and pruned by DELETE like the legacy
-- rows. Normally empty, so that making a new day's partition, which checks this one for rows
-- of that day, finds nothing to read.
CREATE TABLE {schema}.job_archive_default PARTITION OF {schema}.job_archive DEFAULT;

-- Makes the partitions of today and the next p_days days (UTC) that are missing; returns how
-- many it made. Run with its owner's rights, so that the worker role, which may insert into
-- and delete from the archive but owns nothing, can keep it partitioned. Every lock it takes
-- waits a second at most (a long query of the archive must not queue every insert behind a
-- waiting CREATE): a day it could not make is made by a later run, days ahead of its use.
CREATE FUNCTION {schema}.archive_partitions_add(p_days integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '1s' AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    day date;
    made integer := 0;
BEGIN
    FOR i IN 0 .. least(greatest(p_days, 0), 31) LOOP
        day := today + i;
        CONTINUE WHEN to_regclass(format('{schema}.%I', 'job_archive_' || to_char(day, 'YYYYMMDD'))) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE {schema}.%I PARTITION OF {schema}.job_archive FOR VALUES FROM (%L) TO (%L)',
                           'job_archive_' || to_char(day, 'YYYYMMDD'),
                           day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
            made := made + 1;
        EXCEPTION
            -- Busy; made by another archiver meanwhile; or the default partition holds rows of
            -- that day (they stay there, and the day's rows with them).
            WHEN lock_not_available OR duplicate_table OR check_violation THEN NULL;
        END;
    END LOOP;
    RETURN made;
END;
$$;

-- Prunes archived jobs older than p_retention: drops each day partition whose whole day is
-- past it (so a row stays up to a day beyond its retention), and deletes up to p_batch such
-- rows from the default partition and job_archive_legacy, oldest finished first, reading no
-- more than p_batch rows of each; drops job_archive_legacy once it is empty. Returns the
-- partitions dropped and the rows deleted. Run with its owner's rights, as above.
CREATE FUNCTION {schema}.archive_prune(p_retention interval, p_batch integer)
RETURNS TABLE (dropped integer, deleted integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '1s' AS $$
DECLARE
    cutoff timestamptz := now() - p_retention;
    part record;
    n integer;
BEGIN
    dropped := 0;
    deleted := 0;
    FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = '{schema}.job_archive'::regclass AND c.relname ~ '^job_archive_[0-9]{8}$'
                  AND (to_date(substr(c.relname, 13), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' <= cutoff
                ORDER BY c.relname
    LOOP
        BEGIN
            EXECUTE format('DROP TABLE {schema}.%I', part.relname);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN NULL;  -- busy: the next run drops it
        END;
    END LOOP;
    -- Each batch reads the oldest finished rows only, and deletes those past the retention:
    -- a bounded read whether or not any row is due.
    DELETE FROM {schema}.job_archive_default
    WHERE id IN (SELECT w.id FROM (SELECT id, archived_at FROM {schema}.job_archive_default
                                   ORDER BY finished_at LIMIT p_batch) AS w
                 WHERE w.archived_at < cutoff);
    GET DIAGNOSTICS n = ROW_COUNT;
    deleted := deleted + n;
    IF deleted < p_batch AND to_regclass('{schema}.job_archive_legacy') IS NOT NULL THEN
        DELETE FROM {schema}.job_archive_legacy
        WHERE id IN (SELECT w.id FROM (SELECT id, archived_at FROM {schema}.job_archive_legacy
                                       ORDER BY finished_at LIMIT p_batch - deleted) AS w
                     WHERE w.archived_at < cutoff);
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
        IF n = 0 THEN
            PERFORM FROM {schema}.job_archive_legacy ORDER BY finished_at LIMIT 1;
            IF NOT FOUND THEN
                BEGIN
                    DROP TABLE {schema}.job_archive_legacy;
                EXCEPTION WHEN lock_not_available THEN NULL;
                END;
            END IF;
        END IF;
    END IF;
    RETURN NEXT;
END;
$$;

-- Whoever could use the archive before can use it now: the roles granted privileges on the
-- old table get the same on the new one (so a worker role that docs/grants.sql set up keeps
-- archiving, in either release), and those that could delete from it may run the two
-- functions. Nobody else may: they run with their owner's rights.
REVOKE EXECUTE ON FUNCTION {schema}.archive_partitions_add(integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {schema}.archive_prune(interval, integer) FROM PUBLIC;
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT a.privilege_type, a.is_grantable,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
             FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
             LEFT JOIN pg_roles r ON r.oid = a.grantee
             WHERE c.oid = '{schema}.job_archive_legacy'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON {schema}.job_archive TO %s%s', g.privilege_type, g.who,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        IF g.privilege_type = 'DELETE' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.archive_partitions_add(integer), '
                           '{schema}.archive_prune(interval, integer) TO %s', g.who);
        END IF;
    END LOOP;
    -- A new install's archive (or an old one that is empty) has nothing to keep.
    IF NOT EXISTS (SELECT FROM {schema}.job_archive_legacy) THEN
        DROP TABLE {schema}.job_archive_legacy;
    END IF;
END;
$$;

SELECT {schema}.archive_partitions_add(2);
