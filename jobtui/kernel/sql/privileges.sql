-- What the session's role lacks, and what it may change, in the schema (core/privileges.py).
-- noun: privileges
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: privileges_missing
-- Which of the given privileges the session's role lacks: table privileges as (table,
-- privilege) pairs, plus USAGE on the schema, USAGE on its sequences and EXECUTE on its
-- functions (not its trigger functions: a trigger fires whoever may call it). Reads the
-- catalog only. The schema's sequences are listed first (MATERIALIZED):
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
WHERE %(functions)s AND n.nspname = %(schema_name)s AND p.prorettype <> 'trigger'::regtype
  AND NOT has_function_privilege(p.oid, 'EXECUTE');

-- name: privileges_changes
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
