-- The schema itself: its migrations, the server's state, privileges, dropping it (uninstall.py).
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: schema_versions
-- Every applied migration (numbers may land out of order: the newest alone does not say).
SELECT version FROM {schema}.migration;

-- name: server_read_only
-- Whether this session may write: false on a hot standby or a read-only default.
SELECT current_setting('transaction_read_only') = 'on' OR pg_is_in_recovery() AS read_only;

-- name: db_now
SELECT now();

-- name: privileges_missing
-- Which of the given privileges the session's role lacks: table privileges as (table,
-- privilege) pairs, plus USAGE on the schema, USAGE on its sequences and EXECUTE on its
-- functions. Reads the catalog only. The schema's sequences are listed first (MATERIALIZED):
-- the privilege check fails on a relation that is not a sequence, wherever the planner put it.
WITH sequences AS MATERIALIZED (
    SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE %(sequences)s AND n.nspname = %(schema_name)s AND c.relkind = 'S'
)
SELECT format('%%s on %%I.%%I', t.privilege, %(schema_name)s::text, t.tbl)
FROM unnest(%(tables)s::text[], %(privileges)s::text[]) AS t(tbl, privilege)
WHERE NOT has_table_privilege(format('%%I.%%I', %(schema_name)s::text, t.tbl), t.privilege)
UNION ALL
SELECT format('USAGE on schema %%I', %(schema_name)s::text)
WHERE NOT has_schema_privilege(%(schema_name)s::text, 'USAGE')
UNION ALL
SELECT format('USAGE on sequence %%I.%%I', %(schema_name)s::text, s.relname)
FROM sequences s WHERE NOT has_sequence_privilege(s.oid, 'USAGE')
UNION ALL
SELECT format('EXECUTE on function %%s', p.oid::regprocedure)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE %(functions)s AND n.nspname = %(schema_name)s AND NOT has_function_privilege(p.oid, 'EXECUTE');

-- name: schema_drop
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

-- name: role_to_drop
-- `jobtui uninstall`: the role role_drop drops, as a setting of this transaction only.
SELECT set_config('jobtui.role_to_drop', %(role)s, true);

-- name: role_drop
-- DO takes no parameters: the role's name comes from the setting role_to_drop made, quoted.
DO $$ BEGIN EXECUTE format('DROP ROLE %%I', current_setting('jobtui.role_to_drop')); END $$;

-- name: role_changes
-- What the session's role, or a role it may become with SET ROLE, may change in the schema:
-- one line each, 'INSERT on jobtui.audit', ' (as ROLE)' when through another role, inserts
-- first. A viewer's console (`jobtui serve --viewer-dsn`) needs none of it. Reads the catalog
-- only, so it answers on a standby too, whose grants a promotion would make good. The
-- sequence check goes behind CASE: it fails on a relation that is not a sequence.
WITH roles AS MATERIALIZED (
    SELECT oid, rolname FROM pg_roles WHERE pg_has_role(current_user, oid, 'MEMBER')
), relations AS MATERIALIZED (
    SELECT c.oid, c.relname, c.relkind = 'S' AS is_sequence
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema_name)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
), found AS (
    SELECT r.rolname, p.privilege, format('%%I.%%I', %(schema_name)s::text, t.relname) AS object
    FROM roles r CROSS JOIN relations t CROSS JOIN unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) AS p(privilege)
    WHERE CASE WHEN t.is_sequence THEN false ELSE has_table_privilege(r.oid, t.oid, p.privilege) END
    UNION ALL
    SELECT r.rolname, p.privilege, format('sequence %%I.%%I', %(schema_name)s::text, t.relname)
    FROM roles r CROSS JOIN relations t CROSS JOIN unnest(ARRAY['USAGE', 'UPDATE']) AS p(privilege)
    WHERE CASE WHEN t.is_sequence THEN has_sequence_privilege(r.oid, t.oid, p.privilege) ELSE false END
    UNION ALL
    SELECT r.rolname, 'EXECUTE', format('function %%s', f.oid::regprocedure)
    FROM roles r CROSS JOIN pg_proc f JOIN pg_namespace n ON n.oid = f.pronamespace
    WHERE n.nspname = %(schema_name)s AND f.prosecdef AND has_function_privilege(r.oid, f.oid, 'EXECUTE')
    UNION ALL
    SELECT r.rolname, 'CREATE', format('schema %%I', %(schema_name)s::text)
    FROM roles r WHERE has_schema_privilege(r.oid, %(schema_name)s::text, 'CREATE')
)
SELECT format('%%s on %%s', privilege, object)
       || CASE WHEN rolname = current_user THEN '' ELSE format(' (as %%I)', rolname) END
FROM found
ORDER BY rolname <> current_user,
         array_position(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'USAGE', 'EXECUTE', 'CREATE'], privilege),
         object;

-- name: migration_indexes
-- The indexes of an online migration (migrate.py), each by name: whether it exists in the
-- schema, is valid, and is being built now (CREATE INDEX CONCURRENTLY reports its index from
-- its first phase on). Invalid with no build at work: an interrupted build left it.
SELECT n.name, c.oid IS NOT NULL AS present, coalesce(i.indisvalid AND i.indisready, false) AS valid,
       EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.index_relid = c.oid) AS building
FROM unnest(%(names)s::text[]) AS n(name)
LEFT JOIN (pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace AND s.nspname = %(schema_name)s)
       ON c.relname = n.name
LEFT JOIN pg_index i ON i.indexrelid = c.oid;


-- name: migration_table_bytes
-- The size of an online migration's tables (migrate.py): below a bound, its indexes are built
-- in the migration's transaction. A table not made yet counts nothing.
SELECT coalesce(sum(pg_relation_size(c.oid)), 0)::bigint AS bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema_name)s AND c.relname = ANY(%(tables)s::text[]) AND c.relkind = 'r';
