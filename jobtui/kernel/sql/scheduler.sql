-- Cron schedules (core/scheduler.py).
-- noun: schedule
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: schedule_upsert
-- Declares a schedule (from code or the CLI). A changed cron line or timezone restarts the
-- slot sequence from now; otherwise the slots already handled are kept.
INSERT INTO {schema}.schedule AS s
    (name, job_type, cron, timezone, payload, max_attempts, offset_seconds, missed_policy,
     grace_seconds, next_run_at, last_slot, source, queue)
VALUES (%(name)s, %(job_type)s, %(cron)s, %(timezone)s, %(payload)s, %(max_attempts)s,
        %(offset)s, %(missed_policy)s, %(grace)s, %(next_run_at)s, now(), %(source)s, %(queue)s)
ON CONFLICT (name) DO UPDATE
SET job_type = excluded.job_type,
    queue = excluded.queue,
    payload = excluded.payload,
    max_attempts = excluded.max_attempts,
    offset_seconds = excluded.offset_seconds,
    missed_policy = excluded.missed_policy,
    grace_seconds = excluded.grace_seconds,
    source = excluded.source,
    next_run_at = CASE WHEN (s.cron, s.timezone) = (excluded.cron, excluded.timezone)
                       THEN s.next_run_at ELSE excluded.next_run_at END,
    last_slot = CASE WHEN (s.cron, s.timezone) = (excluded.cron, excluded.timezone)
                     THEN s.last_slot ELSE now() END,
    cron = excluded.cron,
    timezone = excluded.timezone,
    updated_at = now()
RETURNING id;

-- name: schedule_due
-- Due schedules, locked for this transaction; other instances skip them. Read by column name.
SELECT id, name, job_type, cron, timezone, payload, max_attempts, offset_seconds,
       missed_policy, grace_seconds, last_slot, now() AS now, queue
FROM {schema}.schedule
WHERE NOT paused AND next_run_at <= now()
ORDER BY next_run_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: schedule_enqueue
-- One slot's job, in the schedule's queue; its slot key makes a second enqueue of the same
-- slot do nothing (return nothing), also once the slot's job left the queue table, for the
-- key's window: as job_enqueue_keyed (jobs.sql), the key is claimed in job_key first
-- (job_key_claim).
WITH {job_key_claim}
INSERT INTO {schema}.job (id, type, payload, idempotency_key, run_at, max_attempts, queue)
SELECT keyed.job_id, %(type)s::text, %(payload)s::jsonb, %(key)s::text, %(run_at)s::timestamptz,
       %(max_attempts)s::integer, %(queue)s::text
FROM keyed
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: schedule_advance
-- missed_count counts every missed slot, backfilled_count those of them fired late by the
-- policy; `missed` lists only the newest of them.
UPDATE {schema}.schedule AS s
SET last_slot = %(last_slot)s,
    next_run_at = %(next_run_at)s,
    last_fired_slot = coalesce(%(fired_slot)s, s.last_fired_slot),
    last_job_id = coalesce(%(job_id)s, s.last_job_id),
    missed_count = s.missed_count + %(missed_count)s,
    backfilled_count = s.backfilled_count + %(backfilled)s,
    missed_slots = (SELECT coalesce(jsonb_agg(x ORDER BY x), '[]'::jsonb)
                    FROM (SELECT x FROM (SELECT jsonb_array_elements_text(s.missed_slots)::timestamptz AS x
                                         UNION ALL SELECT unnest(%(missed)s::timestamptz[])) AS a
                          ORDER BY x DESC LIMIT 20) AS newest),
    updated_at = now()
WHERE s.id = %(id)s;

-- name: schedule_defer
-- A schedule whose slots cannot be computed waits until `until` instead of being due at
-- every tick; its last_slot is kept.
UPDATE {schema}.schedule SET next_run_at = %(until)s, updated_at = now() WHERE id = %(id)s;

-- name: schedule_next_due
-- Seconds until the next schedule is due (NULL when none is active).
SELECT extract(epoch FROM min(next_run_at) - now()) FROM {schema}.schedule WHERE NOT paused;

-- name: schedule_list
-- Read by column name (ScheduleRow's fields).
SELECT id, name, job_type, cron, timezone, payload, max_attempts, offset_seconds, missed_policy,
       grace_seconds, paused, paused_at, next_run_at, last_slot, last_fired_slot, last_job_id,
       missed_count, backfilled_count, missed_slots, skipped_count, source, created_at,
       now() AS db_now, queue
FROM {schema}.schedule
ORDER BY name;

-- name: schedule_lock
SELECT id, cron, timezone, paused, last_slot, paused_at, now()
FROM {schema}.schedule WHERE name = %(name)s FOR UPDATE;

-- name: schedule_pause
UPDATE {schema}.schedule SET paused = true, paused_at = now(), updated_at = now()
WHERE name = %(name)s AND NOT paused
RETURNING id;

-- name: schedule_resume
-- Slots that passed while paused are counted as skipped; the sequence restarts from now.
UPDATE {schema}.schedule
SET paused = false, paused_at = NULL, last_slot = now(), next_run_at = %(next_run_at)s,
    skipped_count = skipped_count + %(skipped)s, updated_at = now()
WHERE name = %(name)s AND paused
RETURNING id;

-- name: schedule_remove
DELETE FROM {schema}.schedule WHERE name = %(name)s RETURNING id;

-- name: schedule_get
-- Read by column name.
SELECT id, job_type, payload, max_attempts, queue FROM {schema}.schedule WHERE name = %(name)s;

-- name: schedule_rewind
-- Moves a schedule's handled slots back in time, as if every scheduler had been down for
-- that long (used by the demo and by drills of the missed-slot policies).
UPDATE {schema}.schedule
SET last_slot = now() - make_interval(secs => %(seconds)s),
    next_run_at = now() - make_interval(secs => %(seconds)s),
    updated_at = now()
WHERE name = %(name)s
RETURNING id;
