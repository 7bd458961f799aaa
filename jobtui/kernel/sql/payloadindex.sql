-- The payload's GIN index: `jobtui index payload` (core/payloadindex.py).
-- noun: payload_index
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: payload_index_state
-- The payload's GIN index: absent (no row), valid, or left invalid by an interrupted build.
SELECT i.indisvalid AS valid, pg_relation_size(i.indexrelid) AS bytes
FROM pg_index i
WHERE i.indexrelid = to_regclass(format('%%I.job_payload_idx', %(schema_name)s::text));

-- name: payload_index_create
-- `jobtui index payload`: outside a transaction, without blocking enqueues or claims.
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_payload_idx ON {schema}.job USING gin (payload jsonb_path_ops);

-- name: payload_index_drop
DROP INDEX CONCURRENTLY IF EXISTS {schema}.job_payload_idx;

-- name: payload_index_progress
-- How far a CREATE INDEX CONCURRENTLY of the job table is (from another session).
SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total
FROM pg_stat_progress_create_index
WHERE relid = to_regclass(format('%%I.job', %(schema_name)s::text));
