-- The flow spans the drain forecast reads (reads/flows.py; core/history.py records them).
-- noun: flow
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: flow_recent
-- The spans of the last 11 minutes (at most one a minute, so a handful of rows), oldest
-- first: the forecast reads the last five minutes of them, and each span's enqueues are
-- told apart from the ids drawn since the span before.
SELECT span_start, span_end, last_id, enqueues_known, pairs FROM {schema}.queue_flow
WHERE span_end > now() - interval '11 minutes'
ORDER BY span_end;
