-- The archiver and pruning (core/maintenance.py).
-- noun: maintenance
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- fragment: maintenance_done_batch
-- The ids of a batch of done jobs past their retention, oldest first, locked; SKIP LOCKED lets
-- several archivers share the work. Its status a constant, for the partial index of done
-- jobs (job_finished_idx).
SELECT id FROM {schema}.job
WHERE status = 'done' AND finished_at < now() - make_interval(secs => %(retention)s)
ORDER BY finished_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: maintenance_archive_done
-- Moves done jobs past their retention to job_archive, a bounded batch at a time.
WITH moved AS (
    DELETE FROM {schema}.job
    WHERE id IN ({maintenance_done_batch})
    RETURNING *
), archived AS (
    INSERT INTO {schema}.job_archive
        (id, type, payload, idempotency_key, status, run_at, attempts, max_attempts, locked_by,
         locked_until, lease_token, heartbeat_at, last_error, errors, lease_expirations,
         created_at, started_at, finished_at, error_fingerprint, uncounted, meta, queue, runner)
    SELECT id, type, payload, idempotency_key, status, run_at, attempts, max_attempts, locked_by,
           locked_until, lease_token, heartbeat_at, last_error, errors, lease_expirations,
           created_at, started_at, finished_at, error_fingerprint, uncounted, meta, queue, runner
    FROM moved
    RETURNING 1
)
SELECT count(*) FROM archived;

-- name: maintenance_delete_done
-- Deletes done jobs past their retention, a batch at a time (when the archive is off).
WITH gone AS (
    DELETE FROM {schema}.job
    WHERE id IN ({maintenance_done_batch})
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: maintenance_delete_dead
-- Dead and failed jobs nobody acted on within their (longer) retention.
WITH gone AS (
    DELETE FROM {schema}.job
    WHERE id IN (SELECT id FROM {schema}.job
                 WHERE status IN ('dead', 'failed')
                   AND finished_at < now() - make_interval(secs => %(retention)s)
                 ORDER BY finished_at
                 LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: maintenance_job_key_prune
-- Keys whose job left the queue table more than their window ago (migration 0017), oldest
-- first; a key whose job is still in the table has no finished_at and stays. An enqueue of a
-- key being pruned waits for this batch, then makes a new job.
WITH gone AS (
    DELETE FROM {schema}.job_key
    WHERE key IN (SELECT key FROM {schema}.job_key
                  WHERE finished_at < now() - make_interval(secs => %(retention)s)
                  ORDER BY finished_at
                  LIMIT %(limit)s
                  FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: maintenance_archive_partitions_add
-- The archive's partitions for today and the next `days` days, made where missing (migration
-- 0014): before the archiver moves rows in, days ahead of their use.
SELECT {schema}.archive_partitions_add(%(days)s);

-- name: maintenance_archive_prune
-- Archived jobs past their retention: whole days dropped as partitions, and up to `limit`
-- rows deleted from the default partition and the legacy archive (migration 0014).
SELECT dropped, deleted FROM {schema}.archive_prune(make_interval(secs => %(retention)s), %(limit)s);

-- name: maintenance_stats_missing_hours
-- Completed hours of the last day that have no summary yet.
SELECT h FROM generate_series(date_trunc('hour', now()) - interval '24 hours',
                              date_trunc('hour', now()) - interval '1 hour', interval '1 hour') AS h
WHERE NOT EXISTS (SELECT 1 FROM {schema}.stats_hourly s WHERE s.hour = h);

-- name: maintenance_stats_summarise_hour
-- One completed hour's finished jobs by type, status and attempts, plus a marker row so an
-- hour with no jobs is not summarised again.
INSERT INTO {schema}.stats_hourly (hour, type, status, attempts, jobs)
-- Done and dead/failed are read apart so each part uses its own partial index. Jobs deleted
-- at completion were counted by the minute in done_tally; the hour's minutes hold them all.
SELECT %(hour)s::timestamptz, type, 'done', attempts, sum(jobs)::bigint
FROM (SELECT type, attempts, count(*) AS jobs
      FROM {schema}.job
      WHERE status = 'done'
        AND finished_at >= %(hour)s::timestamptz AND finished_at < %(hour)s::timestamptz + interval '1 hour'
      GROUP BY type, attempts
      UNION ALL
      SELECT type, attempts, sum(jobs)
      FROM {schema}.done_tally
      WHERE minute >= %(hour)s::timestamptz AND minute < %(hour)s::timestamptz + interval '1 hour'
      GROUP BY type, attempts) AS done
GROUP BY type, attempts
UNION ALL
SELECT %(hour)s::timestamptz, type, status, attempts, count(*)
FROM {schema}.job
WHERE status IN ('dead', 'failed')
  AND finished_at >= %(hour)s::timestamptz AND finished_at < %(hour)s::timestamptz + interval '1 hour'
GROUP BY type, status, attempts
UNION ALL
SELECT %(hour)s::timestamptz, '', 'summarised', 0, 0
ON CONFLICT DO NOTHING;

-- name: maintenance_stats_prune_hours
DELETE FROM {schema}.stats_hourly WHERE hour < now() - interval '8 days';

-- name: maintenance_done_tally_prune
-- Minutes older than the day the hourly summaries cover, once their hours are summarised.
DELETE FROM {schema}.done_tally
WHERE minute < date_trunc('hour', now()) - interval '25 hours';

-- name: maintenance_lease_expiry_prune
DELETE FROM {schema}.lease_expiry WHERE reaped_at < now() - interval '8 days';

-- name: maintenance_audit_prune
-- Through the schema owner's function (migration 0006): the worker role may not delete audit
-- rows itself, and the function keeps every row younger than 30 days whatever it is asked.
SELECT {schema}.prune_audit(make_interval(secs => %(retention)s), %(limit)s);

-- name: maintenance_effect_prune
-- Effects older than their retention, unless their job may still run (it is in the queue
-- and not done): a requeued dead job must find the effects of its earlier attempts. No row
-- lock first (it would need UPDATE on the table): two archivers at once wait on each other's
-- deletes at worst, and a batch is small.
WITH gone AS (
    DELETE FROM {schema}.effect
    WHERE key IN (SELECT e.key FROM {schema}.effect AS e
                  WHERE e.created_at < now() - make_interval(secs => %(retention)s)
                    AND NOT EXISTS (SELECT 1 FROM {schema}.job AS j
                                    WHERE j.id = e.job_id AND j.status <> 'done')
                  ORDER BY e.created_at
                  LIMIT %(limit)s)
    RETURNING 1
)
SELECT count(*) FROM gone;
