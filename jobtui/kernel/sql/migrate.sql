-- The migrations applied, and an online migration's indexes and tables (kernel/migrate.py).
-- noun: migration
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: migration_versions
-- Every applied migration (numbers may land out of order: the newest alone does not say).
SELECT version FROM {schema}.migration;

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
