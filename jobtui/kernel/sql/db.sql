-- Settings of a new connection's session (kernel/db.py).
-- noun: connection
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: connection_tcp_bound
-- The server's end of this session gives up on a client gone silent (a network that drops
-- packets) within the bounds the client's end has (kernel/db.py tcp_bounds): otherwise the
-- server keeps the session, its locks and its connection slot until its TCP keepalive, about
-- two hours by default, long after the client reconnected. Any role may set these; on a Unix
-- socket they do nothing.
SELECT set_config('tcp_keepalives_idle', %(keepalives_idle)s::text, false),
       set_config('tcp_keepalives_interval', %(keepalives_interval)s::text, false),
       set_config('tcp_keepalives_count', %(keepalives_count)s::text, false),
       set_config('tcp_user_timeout', %(tcp_user_timeout)s::text, false);
