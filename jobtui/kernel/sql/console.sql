-- A console connection's session (reads/console.py).
-- noun: console
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: console_session
-- A console connection's first statement: a timeout for every later one, and who and where it
-- is: a standby (in recovery), or a server whose transactions are read-only. Behind a
-- transaction pooler the setting is local (%(local)s): a session's would stay on the server
-- connection for its next client; the console then relies on ending a hung read itself.
SELECT set_config('statement_timeout', %(statement_timeout)s, %(local)s) AS statement_timeout,
       current_user AS role, current_database() AS database,
       current_setting('transaction_read_only') = 'on' AS read_only, pg_is_in_recovery() AS standby;
