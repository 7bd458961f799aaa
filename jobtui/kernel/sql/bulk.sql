-- Bulk actions in batches, resumable (core/bulk.py).
-- noun: bulk
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().
--
-- Status fences in lookups by id are written `(j.status = ...) IS TRUE`: claims.sql says why.

-- name: bulk_mark
-- Where a count begins (bulk.py's Mark): the database's now() and the newest job's id. A run
-- begun at it changes only the jobs the count could count.
SELECT now() AS cutoff, coalesce(max(id), 0) AS last_id FROM {schema}.job;

-- name: bulk_count
-- A bulk action's dry run, one window of ids at a time (bulk.py): the jobs of the filter the
-- action applies to (%(scope)s: its statuses), in two figures. `jobs`: those within the
-- count's mark, enqueued up to %(last_id)s and finished (requeue, discard) or enqueued
-- (cancel, %(cancel)s) before %(cutoff)s, which a run begun at the mark changes, as the
-- bulk_*_batch statements choose. `later`: those past it, which such a run leaves.
SELECT count(*) FILTER (WHERE j.id <= %(last_id)s::bigint AND CASE WHEN %(cancel)s::boolean
                          THEN j.created_at ELSE j.finished_at END < %(cutoff)s::timestamptz) AS jobs,
       count(*) FILTER (WHERE j.id > %(last_id)s::bigint OR CASE WHEN %(cancel)s::boolean
                          THEN j.created_at ELSE j.finished_at END >= %(cutoff)s::timestamptz) AS later
FROM {schema}.job AS j
WHERE j.id < %(below)s AND j.id >= %(floor)s AND j.status = ANY(%(scope)s::text[])
      AND {jobfilter_predicate};

-- name: bulk_run_find
-- The newest run of this action and filter that did not end: a second run resumes it.
SELECT id, action, filter, cutoff, last_id, next_id, changed, busy_ids, state, started_by, started_at
FROM {schema}.bulk_run
WHERE action = %(action)s AND filter = %(filter)s::jsonb AND state <> 'done'
ORDER BY id DESC LIMIT 1;

-- name: bulk_run_start
-- A new run at a count's mark (bulk_mark): its cutoff is the mark's, and it walks down from
-- the newest job there was then, so it changes no job the count could not see.
INSERT INTO {schema}.bulk_run (action, filter, cutoff, last_id, next_id, started_by)
VALUES (%(action)s, %(filter)s::jsonb, %(cutoff)s::timestamptz, %(last_id)s::bigint, %(last_id)s::bigint + 1,
        %(actor)s)
RETURNING id, action, filter, cutoff, last_id, next_id, changed, busy_ids, state, started_by, started_at;

-- name: bulk_run_state
-- A run goes on (running), was stopped by its operator (stopped: a second run resumes it) or
-- is done.
UPDATE {schema}.bulk_run
SET state = %(state)s, updated_at = now(), finished_at = CASE WHEN %(state)s = 'done' THEN now() END
WHERE id = %(run)s
RETURNING changed;

-- fragment: bulk_run_locked
-- The run of a batch statement (its `run`), locked while the batch goes on: none when it is no
-- longer running (stopped by its operator), and the batch then changes nothing.
SELECT id, cutoff FROM {schema}.bulk_run WHERE id = %(run)s AND state = 'running' FOR UPDATE

-- fragment: bulk_progress
-- A batch statement's `progress`, from its `run`, `candidates` (the window's jobs of the
-- filter) and `moved` (those it changed): the count, where the next batch starts (the same
-- place when retrying the busy ids) and the ids passed over as busy, to be tried at the end.
UPDATE {schema}.bulk_run AS r
SET changed = r.changed + (SELECT count(*) FROM moved),
    next_id = CASE WHEN %(ids)s::bigint[] IS NOT NULL THEN r.next_id
                   WHEN (SELECT count(*) FROM candidates) >= %(batch)s THEN (SELECT min(id) FROM candidates)
                   ELSE %(floor)s END,
    busy_ids = CASE WHEN %(ids)s::bigint[] IS NOT NULL THEN ARRAY[]::bigint[] ELSE r.busy_ids END
               || ARRAY(SELECT id FROM candidates EXCEPT SELECT id FROM moved),
    updated_at = now()
WHERE r.id = (SELECT id FROM run)
RETURNING r.next_id

-- fragment: bulk_batch_columns
-- What a batch statement returns (bulk.py reads it by these names).
(SELECT count(*) FROM moved) AS changed, (SELECT count(*) FROM candidates) AS candidates,
(SELECT next_id FROM progress) AS next_id, EXISTS (SELECT 1 FROM run) AS running,
ARRAY(SELECT id FROM candidates EXCEPT SELECT id FROM moved ORDER BY 1) AS busy

-- fragment: bulk_finished_picked
-- The `candidates` and `picked` of a batch statement over finished jobs (requeue, discard):
-- the window's dead or failed jobs of the filter that finished before the run's cutoff, newest
-- first, at most a batch of them (or those of %(ids)s, passed over as busy), and those of them
-- locked now, SKIP LOCKED.
candidates AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id < %(below)s AND j.id >= %(floor)s AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
      AND j.status IN ('dead', 'failed') AND j.finished_at < (SELECT cutoff FROM run)
      AND {jobfilter_predicate}
    ORDER BY j.id DESC
    LIMIT %(batch)s
), picked AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id IN (SELECT id FROM candidates) AND (j.status IN ('dead', 'failed')) IS TRUE
    FOR UPDATE SKIP LOCKED
)

-- name: bulk_requeue_batch
-- A batch of a bulk requeue (bulk.py): at most %(batch)s dead or failed jobs of the filter
-- among the ids from %(floor)s up to below %(below)s (or among %(ids)s, the jobs passed over
-- as busy), newest first, back to ready with a fresh set of attempts, and the run's progress,
-- in one statement: its own short transaction, holding at most a batch of row locks, taken
-- SKIP LOCKED (a job another transaction holds is passed over and tried again at the end).
-- Only jobs that finished before the run's cutoff: a job the run requeued that failed again
-- since is not requeued twice, by this run or by its resumption. Wakes the workers.
WITH run AS ({bulk_run_locked}), {bulk_finished_picked}, moved AS (
    UPDATE {schema}.job AS j
    SET status = 'ready', attempts = 0, run_at = now(), finished_at = NULL,
        errors = (j.errors || jsonb_build_array(jsonb_build_object(
                     'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', %(actor)s::text,
                     'kind', 'requeued',
                     'error', format('requeued from %%s by %%s (bulk run %%s)', j.status, %(actor)s::text, %(run)s))))
                 - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
    WHERE j.id IN (SELECT id FROM picked) AND (j.status IN ('dead', 'failed')) IS TRUE
    RETURNING j.id
), progress AS ({bulk_progress})
SELECT {bulk_batch_columns},
       CASE WHEN EXISTS (SELECT 1 FROM moved) THEN pg_notify(%(channel)s::text, '') END AS woken;

-- name: bulk_discard_batch
-- A batch of a bulk discard: as bulk_requeue_batch, the dead or failed jobs deleted. Their
-- recorded effects go with the archiver's pruning.
WITH run AS ({bulk_run_locked}), {bulk_finished_picked}, moved AS (
    DELETE FROM {schema}.job AS j
    WHERE j.id IN (SELECT id FROM picked) AND (j.status IN ('dead', 'failed')) IS TRUE
    RETURNING j.id
), progress AS ({bulk_progress})
SELECT {bulk_batch_columns};

-- name: bulk_cancel_batch
-- A batch of a bulk cancel: as bulk_requeue_batch, ready and running jobs enqueued before
-- the run's cutoff become failed, as `action_cancel` makes them; a running job's worker hears of it
-- on the schema's channel ('cancel <id>'), and its heartbeat's answer says so too. A job
-- whose handler is inside job.once()'s transaction holds its row: it is passed over as busy.
WITH run AS ({bulk_run_locked}), candidates AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id < %(below)s AND j.id >= %(floor)s AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
      AND j.status IN ('ready', 'running') AND j.created_at < (SELECT cutoff FROM run)
      AND {jobfilter_predicate}
    ORDER BY j.id DESC
    LIMIT %(batch)s
), picked AS (
    SELECT j.id FROM {schema}.job AS j
    WHERE j.id IN (SELECT id FROM candidates) AND (j.status IN ('ready', 'running')) IS TRUE
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE {schema}.job AS j
    SET status = 'failed', locked_until = NULL, finished_at = now(),
        last_error = format('cancelled by %%s (bulk run %%s)', %(actor)s::text, %(run)s),
        errors = (j.errors || jsonb_build_array(jsonb_build_object(
                     'at', now(), 'started', j.started_at, 'attempt', j.attempts, 'worker', j.locked_by,
                     'kind', 'cancelled', 'error', format('cancelled by %%s (bulk run %%s)', %(actor)s::text, %(run)s))))
                 - CASE WHEN jsonb_array_length(j.errors) >= 50 THEN 0 ELSE 1000 END
    WHERE j.id IN (SELECT id FROM picked) AND (j.status IN ('ready', 'running')) IS TRUE
    RETURNING j.id, CASE WHEN j.locked_by IS NOT NULL THEN pg_notify(%(channel)s::text, 'cancel ' || j.id) END AS told
), progress AS ({bulk_progress})
SELECT {bulk_batch_columns};
