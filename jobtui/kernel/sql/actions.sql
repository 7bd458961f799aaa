-- An operator's actions on jobs: requeue, kill a lease, cancel (core/actions.py).
-- noun: action
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().
--
-- Status fences in lookups by id are written `(j.status = ...) IS TRUE`: claims.sql says why.

-- fragment: action_requeue_set
-- An operator's requeue of a job `j` of the job table: back to ready now with a fresh set of
-- attempts, the requeue recorded in its errors (the oldest dropped past 50).
status = 'ready', attempts = 0, run_at = now(), finished_at = NULL,
errors = (j.errors || jsonb_build_array(jsonb_build_object(
             'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', %(actor)s::text,
             'kind', 'requeued', 'error', format('requeued from %%s by %%s', j.status, %(actor)s::text))))
         - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END

-- name: action_requeue_by_id
-- Operator: dead or failed jobs back to ready now with a fresh set of attempts.
UPDATE {schema}.job AS j
SET {action_requeue_set}
WHERE j.id = ANY(%(ids)s::bigint[]) AND (j.status IN ('dead', 'failed')) IS TRUE
RETURNING j.id;

-- name: action_dead_group_requeue
-- Operator: the given jobs of one dead-letter group (those the console counted and the
-- operator confirmed) back to ready with a fresh set of attempts; a job that left the group
-- since (requeued, cancelled, or dead again with another error) is left alone.
UPDATE {schema}.job AS j
SET {action_requeue_set}
WHERE j.id = ANY(%(ids)s::bigint[]) AND (j.status = %(status)s) IS TRUE AND j.type = %(type)s
  AND j.error_fingerprint IS NOT DISTINCT FROM %(fingerprint)s
RETURNING j.id;

-- name: action_lease_kill
-- Operator: a running job returns to ready now, or goes dead when the killed attempt was its
-- last: a killed attempt counts, as an expired one does. Its worker's late outcome is
-- rejected because the status (and later the lease token) no longer match. The row lock is
-- taken first and skips a job whose handler is inside `job.once()`'s transaction (which
-- holds the row): its effect commits under the lease it was checked against, and the kill
-- is refused for now. With `tokens` (each id's lease token, in the order of `ids`), only the
-- attempts that hold them are killed: a question asked of one attempt never kills the next.
UPDATE {schema}.job AS j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'ready' END,
    run_at = now(), locked_until = NULL,
    finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
    uncounted = 0,
    last_error = format('lease killed by %%s during attempt %%s of %%s%%s', %(actor)s::text, j.attempts,
                        j.max_attempts,
                        CASE WHEN j.attempts >= j.max_attempts THEN ' (its last attempt: dead)' ELSE '' END),
    errors = (j.errors || jsonb_build_array(jsonb_build_object(
                 'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                 'kind', 'lease_killed', 'error', format('lease killed by %%s', %(actor)s::text))))
             - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
WHERE j.id IN (SELECT id FROM {schema}.job
               WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running'
                 AND (%(tokens)s::bigint[] IS NULL
                      OR lease_token = (%(tokens)s::bigint[])[array_position(%(ids)s::bigint[], id)])
               FOR UPDATE SKIP LOCKED)
  AND j.status = 'running'
  AND (%(tokens)s::bigint[] IS NULL
       OR j.lease_token = (%(tokens)s::bigint[])[array_position(%(ids)s::bigint[], j.id)])
RETURNING j.id;

-- name: action_cancel
-- Operator: a ready or running job becomes failed; it will not run again unless requeued.
-- A running job's worker hears of it at once on the schema's channel ('cancel <id>'), and
-- its heartbeat's answer says so too, should the notification be lost; its late outcome is
-- refused either way, since the status no longer matches.
WITH cancelled AS (
    UPDATE {schema}.job AS j
    SET status = 'failed', locked_until = NULL, finished_at = now(),
        last_error = format('cancelled by %%s', %(actor)s::text),
        errors = (j.errors || jsonb_build_array(jsonb_build_object(
                     'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                     'kind', 'cancelled', 'error', format('cancelled by %%s', %(actor)s::text))))
                 - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
    WHERE j.id = ANY(%(ids)s::bigint[]) AND (j.status IN ('ready', 'running')) IS TRUE
    RETURNING j.id, j.locked_by
)
SELECT id, CASE WHEN locked_by IS NOT NULL
                THEN pg_notify(%(channel)s::text, 'cancel ' || id) END AS told
FROM cancelled;
