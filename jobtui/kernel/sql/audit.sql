-- The audit log of operators' actions (core/audit.py).
-- noun: audit
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: audit_insert
INSERT INTO {schema}.audit (actor, action, target, job_ids, rows, detail)
VALUES (%(actor)s, %(action)s, %(target)s, %(job_ids)s, %(rows)s, %(detail)s)
RETURNING id;

-- name: audit_list
SELECT id, at, actor, action, target, job_ids, rows, detail FROM {schema}.audit
ORDER BY id DESC LIMIT %(limit)s;
