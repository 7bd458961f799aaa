-- Dropping the schema and the roles made for it: `jobtui uninstall`, and the schema of
-- `jobtui demo --reset` and `jobtui bench` (core/uninstall.py).
-- noun: uninstall
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: uninstall_schema_drop
-- `jobtui demo --reset` and `jobtui bench`: a schema of their own, dropped whole.
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- name: uninstall_contents
-- `jobtui uninstall`, before it asks: what the schema holds. Rows are counted up to %(cap)s
-- only, so that the question comes at once however long the backlog; leases still live say
-- that workers run.
SELECT current_database() AS database, pg_get_userbyid(n.nspowner) AS owner,
       (SELECT count(*) FROM (SELECT FROM {schema}.job LIMIT %(cap)s) AS j) AS jobs,
       (SELECT count(*) FROM (SELECT FROM {schema}.job_archive LIMIT %(cap)s) AS a) AS archived,
       (SELECT count(*) FROM (SELECT FROM {schema}.schedule LIMIT %(cap)s) AS s) AS schedules,
       (SELECT count(*) FROM (SELECT FROM {schema}.audit LIMIT %(cap)s) AS u) AS audit_rows,
       (SELECT count(*) FROM {schema}.job WHERE status = 'running' AND locked_until > now()) AS live_leases,
       (SELECT coalesce(array_agg(DISTINCT locked_by), '{{}}') FROM {schema}.job
        WHERE status = 'running' AND locked_until > now()) AS workers,
       (SELECT count(*) FROM pg_class AS c WHERE c.relnamespace = n.oid AND c.relkind IN ('r', 'p')) AS tables,
       (SELECT count(*) FROM pg_class AS c WHERE c.relnamespace = n.oid AND c.relkind = 'S') AS sequences,
       (SELECT count(*) FROM pg_class AS c WHERE c.relnamespace = n.oid AND c.relkind IN ('v', 'm')) AS views,
       (SELECT count(*) FROM pg_proc AS p WHERE p.pronamespace = n.oid) AS functions,
       pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on' AS read_only
FROM pg_namespace AS n WHERE n.nspname = %(schema_name)s;

-- name: uninstall_roles
-- The roles that hold privileges in the schema (on it, or on its tables and sequences), and
-- those docs/grants.sql created for it: their comment is the mark the file leaves, `mark`
-- filled with the schema and this database. `jobtui uninstall` drops the marked ones; the
-- others (the schema's owner, roles that existed before) keep existing.
WITH ns AS (
    SELECT oid, nspowner, nspacl FROM pg_namespace WHERE nspname = %(schema_name)s
), granted AS (
    SELECT (aclexplode(nspacl)).grantee AS oid FROM ns WHERE nspacl IS NOT NULL
    UNION
    SELECT (aclexplode(c.relacl)).grantee FROM pg_class AS c
    WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relacl IS NOT NULL
)
SELECT r.rolname AS role,
       coalesce(shobj_description(r.oid, 'pg_authid') = format(%(mark)s::text, %(schema_name)s::text,
                                                                current_database()), false) AS made_by_grants
FROM pg_roles AS r
WHERE (r.oid IN (SELECT oid FROM granted)
       OR shobj_description(r.oid, 'pg_authid') = format(%(mark)s::text, %(schema_name)s::text, current_database()))
  AND r.oid <> (SELECT nspowner FROM ns)
ORDER BY r.rolname;

-- name: uninstall_lock_timeout
-- `jobtui uninstall` waits this long at most for the schema's tables, in its transaction.
SELECT set_config('lock_timeout', %(lock_timeout)s, true);

-- name: uninstall_role_to_drop
-- `jobtui uninstall`: the role uninstall_role_drop drops, as a setting of this transaction only.
SELECT set_config('jobtui.role_to_drop', %(role)s, true);

-- name: uninstall_role_drop
-- DO takes no parameters: the role's name comes from the setting uninstall_role_to_drop made, quoted.
DO $$ BEGIN EXECUTE format('DROP ROLE %%I', current_setting('jobtui.role_to_drop')); END $$;
