-- The server's clock, and whether this session may write (kernel/server.py).
-- noun: server
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: server_read_only
-- Whether this session may write: false on a hot standby or a read-only default.
SELECT current_setting('transaction_read_only') = 'on' OR pg_is_in_recovery() AS read_only;

-- name: server_now
SELECT now();
