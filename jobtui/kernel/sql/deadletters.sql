-- The dead letters an operator picks from, by type and error (reads/deadletters.py).
-- noun: deadletter
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: deadletter_regex_check
-- Compiles the pattern once, so a bad one is an error even when no row would be compared.
SELECT '' ~* %(pattern)s;

-- name: deadletter_matching
-- The one definition of the dead and failed jobs an operator names by type and error:
-- `jobtui dead`, `jobtui requeue --type/--error/--all` (its dry run counts the same rows),
-- the console's dead groups and their filter. Read by column name. Grouped like the dead
-- pane (status, type, error fingerprint), each group with its ids when %(with_ids)s.
-- The error pattern is a case-insensitive PostgreSQL regular expression, matched against the
-- error's first line (the exception and its message, as `jobtui job` shows it) or its
-- fingerprint (that line with numbers, hex ids and UUIDs masked, as `jobtui dead` shows
-- it); never against the traceback below it, whose file and module names would match by
-- accident. With %(in_group)s, only the group of %(fingerprint)s (NULL: no error).
SELECT g.status, g.type, g.fingerprint, g.jobs, g.first_seen, g.last_seen, g.latest_id AS latest_job_id,
       j.attempts AS latest_attempts, coalesce(g.ids, ARRAY[]::bigint[]) AS job_ids
FROM (SELECT status, type, coalesce(error_fingerprint, '') AS fingerprint, count(*) AS jobs,
             min(finished_at) AS first_seen, max(finished_at) AS last_seen, max(id) AS latest_id,
             array_agg(id ORDER BY id) FILTER (WHERE %(with_ids)s) AS ids
      FROM {schema}.job
      WHERE status IN ('dead', 'failed')
        AND (%(status)s::text IS NULL OR status = %(status)s::text)
        AND (%(type)s::text IS NULL OR type = %(type)s::text)
        AND (NOT %(in_group)s OR error_fingerprint IS NOT DISTINCT FROM %(fingerprint)s::text)
        AND (%(error)s::text IS NULL
             OR split_part(last_error, E'\n', 1) ~* %(error)s::text
             OR error_fingerprint ~* %(error)s::text)
      GROUP BY status, type, error_fingerprint) AS g
JOIN {schema}.job AS j ON j.id = g.latest_id
ORDER BY g.jobs DESC, g.status, g.type, g.fingerprint;
