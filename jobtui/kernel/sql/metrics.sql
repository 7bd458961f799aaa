-- The snapshot of the queue's measures (reads/metrics.py).
-- noun: metrics
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: metrics_lock_timeout
-- For the snapshot's own transaction: wait this long for a lock on a queue table, then fail
-- (a snapshot must not hang behind the lock it would report). No JIT: on a big table the
-- planner's row estimates make it compile the small aggregates, which costs more than it saves.
SELECT set_config('lock_timeout', %(timeout)s, true), set_config('jit', 'off', true);

-- name: metrics_ready
-- Ready jobs by type among the first %(cap)s + 1 entries of the ready index in claim order:
-- every ready job while there are at most %(cap)s; above, the first ones, which the snapshot
-- completes with estimates (backlog.estimate). The index holds the type, but an entry whose
-- page the visibility map does not mark all-visible (a table no vacuum has reached yet) still
-- visits its row, one page per entry at worst in a scattered table: the cap bounds the pages.
-- A type's age counts only jobs already due (a delayed job is not late) and is exact when one
-- of its due jobs is among the entries read: its first one is its oldest. `newest_age` is the
-- age of the last entry read (negative: delayed, so every due job was read).
SELECT type, count(*)::bigint AS ready, count(*) FILTER (WHERE run_at <= now())::bigint AS due,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now()))::float8 AS oldest_age,
       extract(epoch FROM now() - max(max(run_at)) OVER ())::float8 AS newest_age
FROM (SELECT type, run_at FROM {schema}.job WHERE status = 'ready' ORDER BY run_at, id LIMIT %(cap)s + 1) AS head
GROUP BY type;

-- name: metrics_ready_size
-- What is cheap about the ready jobs however many there are: the oldest due job's age (the
-- first entry of the ready index) and the planner's estimate of the index's entries
-- (pg_class.reltuples, set by VACUUM and ANALYZE). How many there are, up to its cap, is
-- what the queue overview read beside the snapshot (overview_backlog) or, for a snapshot
-- taken alone, metrics_ready.
SELECT (SELECT extract(epoch FROM now() - run_at) FROM {schema}.job
        WHERE status = 'ready' AND run_at <= now() ORDER BY run_at, id LIMIT 1)::float8 AS oldest_age,
       (SELECT greatest(reltuples, 0)::bigint FROM pg_class
        WHERE oid = to_regclass(format('%%I.job_ready_idx', %(schema_name)s::text))) AS index_estimate;

-- name: metrics_minutes
-- The queue's last hour, minute by minute (queue_minute, written by the archiver); the
-- ready jobs by type only of the newest minute.
SELECT minute, recorded_at, ready, ready_due, oldest_ready_age, done, dead, lease_expiries,
       CASE WHEN minute = max(minute) OVER () THEN by_type END AS by_type
FROM {schema}.queue_minute
WHERE minute >= date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00') - interval '60 minutes'
ORDER BY minute;

-- name: metrics_running
SELECT type, locked_by AS worker, count(*) AS jobs, count(*) FILTER (WHERE locked_until < now()) AS expired,
       extract(epoch FROM now() - min(heartbeat_at)) AS heartbeat_age
FROM {schema}.job WHERE status = 'running'
GROUP BY type, locked_by;

-- name: metrics_dead
-- Dead and failed jobs grouped by type and error fingerprint. Plain aggregates (hashed, no
-- sort of the error texts); the latest job's attempts are one primary-key lookup per group.
SELECT g.status, g.type, g.fingerprint, g.jobs, g.first_seen, g.last_seen, g.latest_id, j.attempts
FROM (SELECT status, type, coalesce(error_fingerprint, '') AS fingerprint, count(*) AS jobs,
             min(finished_at) AS first_seen, max(finished_at) AS last_seen, max(id) AS latest_id
      FROM {schema}.job WHERE status IN ('dead', 'failed')
      GROUP BY status, type, error_fingerprint) AS g
JOIN {schema}.job AS j ON j.id = g.latest_id
ORDER BY g.jobs DESC;

-- name: metrics_dead_attempts
-- Dead and failed jobs of the last hour by type and attempts used (job_dead_idx: by type and
-- finished_at, so each type's last hour is one range).
SELECT type, attempts, count(*) AS jobs FROM {schema}.job
WHERE status IN ('dead', 'failed') AND finished_at > now() - interval '1 hour'
GROUP BY type, attempts;

-- name: metrics_done_minutes
-- Done jobs by calendar minute, type and attempts used: the done rows, from job_finished_idx
-- alone, plus the jobs counted in done_tally (deleted at completion): the minutes of the last
-- hour from %(since)s on (NULL: the whole hour; a reader that keeps the settled minutes of
-- its previous snapshot asks for the last few only), and how many of them finished in the
-- last 60 seconds, for a jobs-per-minute figure that does not jump at minute starts. A tally
-- row knows when its jobs ran, not each job's second: its jobs count in the last 60 seconds
-- in proportion to the part of their span (from the first start, or the minute's start if
-- later, to the last finish) that lies within them.
-- date_bin is plain arithmetic on the timestamp, where date_trunc converts to a time zone.
WITH bounds AS (
    SELECT greatest(%(since)s::timestamptz,
                    date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00')
                    - interval '59 minutes') AS since
)
SELECT minute, type, attempts, sum(jobs)::bigint AS jobs, round(sum(recent))::bigint AS recent
FROM (
    SELECT date_bin('1 minute', finished_at, timestamptz '2000-01-01 00:00:00+00') AS minute,
           type, attempts, count(*) AS jobs,
           count(*) FILTER (WHERE finished_at > now() - interval '60 seconds')::numeric AS recent
    FROM {schema}.job
    WHERE status = 'done' AND finished_at >= (SELECT since FROM bounds)
    GROUP BY 1, 2, 3
    UNION ALL
    SELECT minute, type, attempts, sum(jobs),
           sum(jobs * CASE
               WHEN last_finished_at <= now() - interval '60 seconds' THEN 0
               WHEN greatest(first_started_at, minute) >= now() - interval '60 seconds' THEN 1
               ELSE extract(epoch FROM last_finished_at - (now() - interval '60 seconds'))
                    / extract(epoch FROM last_finished_at - greatest(first_started_at, minute))
           END)
    FROM {schema}.done_tally
    WHERE minute >= (SELECT since FROM bounds)
    GROUP BY 1, 2, 3
) AS done
GROUP BY 1, 2, 3;

-- name: metrics_day
-- The last 24 completed hours' summaries (filled by the archiver).
SELECT status, attempts, sum(jobs)::bigint AS jobs FROM {schema}.stats_hourly
WHERE hour >= date_trunc('hour', now()) - interval '24 hours'
GROUP BY status, attempts;

-- name: metrics_lease_expiries
-- Expirations per hour of the last 24 hours (hours ago, count): whole hours between the
-- truncated times, by a binary search of the 25 hour starts as above.
SELECT 25 - width_bucket(reaped_at,
                         (SELECT array_agg(h ORDER BY h)
                          FROM generate_series(date_trunc('hour', now()) - interval '24 hours',
                                               date_trunc('hour', now()), interval '1 hour') AS h)) AS hours_ago,
       count(*) AS expiries
FROM {schema}.lease_expiry WHERE reaped_at > now() - interval '24 hours'
GROUP BY 1;

-- name: metrics_recent_expiries
SELECT job_id, job_type AS type, worker, attempt, expired_at, reaped_at, outcome
FROM {schema}.lease_expiry ORDER BY reaped_at DESC, id DESC LIMIT %(limit)s;

-- name: metrics_schedules
-- Read by column name (ScheduleHealth's fields).
SELECT name, job_type, cron, paused, next_run_at, last_slot, missed_count AS missed,
       backfilled_count AS backfilled, skipped_count AS skipped, missed_slots, grace_seconds AS grace,
       coalesce(extract(epoch FROM next_run_at - now()), 0)::float8 AS next_in, queue
FROM {schema}.schedule ORDER BY name;

-- name: metrics_tables
-- Table health from the statistics collector, plus an estimate of all rows (no scan). The
-- partitions of a partitioned table (job_archive's days) count as that table: the partitioned
-- table itself holds no rows, and a row per day would come and go with the days.
SELECT coalesce(p.relname, s.relname) AS table, sum(s.n_live_tup)::bigint AS live_rows,
       sum(s.n_dead_tup)::bigint AS dead_rows, max(s.last_autovacuum) AS last_autovacuum,
       max(s.last_vacuum) AS last_vacuum, max(s.last_autoanalyze) AS last_autoanalyze,
       sum(greatest(c.reltuples, 0))::bigint AS rows_estimate
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
LEFT JOIN pg_inherits i ON i.inhrelid = s.relid AND c.relispartition
LEFT JOIN pg_class p ON p.oid = i.inhparent
WHERE s.schemaname = %(schema_name)s
GROUP BY 1;

-- name: metrics_key_window
-- How long idempotency keys are kept after their job finished (--key-retention), as the
-- archiver's schedule row holds it (each worker's scheduler writes it; 'jobtui.archive' is
-- core/maintenance.py's ARCHIVE_TYPE). No row without an archiver's schedule, NULL when a
-- worker of the previous release wrote it: the default holds then.
SELECT (payload ->> 'key')::float8 AS key_retention FROM {schema}.schedule WHERE name = 'jobtui.archive';

-- name: metrics_lock_waits
-- Sessions of this database waiting for a lock while they work on jobtui's tables, by the
-- kind of lock they wait for, with the longest wait of each kind. A session waiting for a row
-- that another transaction holds (FOR UPDATE, an UPDATE) waits for that transaction's id, and
-- the sessions queued behind it for the row's tuple lock: the first names no table, so a wait
-- counts when it is for a table of the schema (or one of its indexes), for jobtui's
-- migration lock (advisory), or when the waiting session holds a lock on such a table (the
-- table lock its statement took before reaching the row). A claim waiting its turn under a
-- queue's global limit (claim_limited's lock, keyed by the schema and the queue, as in
-- migration 0008) is its own kind, queue_limit: that wait is the limit working, not a lock
-- held too long. So is a claim of a rated queue or type waiting for the claim before it to
-- commit its token bucket (claim_pick's update of the bucket's row, or claim_paced's lock of
-- it, migrations 0021 and 0022): rate_limit.
-- That wait is for the bucket's row: for its tuple lock (queued behind the first waiter), or
-- for the holder's transaction id while holding that tuple lock (the first waiter). An
-- advisory key of 64 bits is shown in pg_locks as classid (its high half) and objid (its low
-- half). Sessions are matched by pid, both views being per server; pg_locks shows every
-- role's locks and when each wait began.
WITH tables AS (
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema_name)s
), buckets AS (
    SELECT to_regclass(format('%%I.rate_bucket', %(schema_name)s::text)) AS oid
), limit_keys AS (
    SELECT hashtextextended('{schema}.queue_limit.' || name, 0) AS key FROM {schema}.queue_control
    WHERE kind = 'queue'
), waits AS (
    SELECT CASE WHEN l.locktype = 'advisory' AND l.objsubid = 1
                     AND ((l.classid::bigint << 32) | l.objid::bigint) IN (SELECT key FROM limit_keys)
                THEN 'queue_limit'
                WHEN l.locktype = 'tuple' AND l.relation = (SELECT oid FROM buckets)
                     OR l.locktype = 'transactionid'
                        AND EXISTS (SELECT 1 FROM pg_locks t
                                    WHERE t.pid = l.pid AND t.granted AND t.locktype = 'tuple'
                                      AND t.relation = (SELECT oid FROM buckets))
                THEN 'rate_limit'
                WHEN l.locktype IN ('relation', 'transactionid', 'tuple', 'advisory') THEN l.locktype
                ELSE 'other' END AS kind,
           coalesce(l.waitstart, a.query_start, clock_timestamp()) AS since
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE NOT l.granted AND a.datname = current_database()
      AND (l.relation IN (SELECT oid FROM tables)
           OR (l.locktype = 'advisory' AND l.classid = 0 AND l.objid = %(advisory_key)s::bigint::oid
               AND l.objsubid = 1)
           OR EXISTS (SELECT 1 FROM pg_locks h
                      WHERE h.pid = l.pid AND h.granted AND h.relation IN (SELECT oid FROM tables)))
)
SELECT kind, count(*) AS sessions, greatest(0, extract(epoch FROM clock_timestamp() - min(since)))::float8 AS longest
FROM waits GROUP BY kind;

-- name: metrics_oldest_xact
-- The oldest open transaction of a client session in this database: it holds back vacuum on
-- the queue table (by its snapshot or its transaction id; an idle one in READ COMMITTED has
-- neither between statements, but takes a snapshot again at its next one) and keeps its locks.
SELECT extract(epoch FROM now() - xact_start) AS age, pid, coalesce(application_name, '') AS application,
       coalesce(state, '') AS state
FROM pg_stat_activity
WHERE datname = current_database() AND xact_start IS NOT NULL AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
ORDER BY xact_start LIMIT 1;

-- name: metrics_recovery
-- Whether this server is a standby, and how far its figures are behind the primary's: 0 when
-- it streams and has replayed all it received, else the time since the last transaction it
-- replayed (that also grows while the primary commits nothing), null when it replayed none
-- yet. Null on a primary. Runs on a hot standby, as every statement of the snapshot does.
SELECT pg_is_in_recovery() AS standby,
       (CASE WHEN NOT pg_is_in_recovery() THEN NULL
             WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
                  AND (SELECT status FROM pg_stat_wal_receiver) = 'streaming' THEN 0
             WHEN pg_last_xact_replay_timestamp() IS NOT NULL
                  THEN greatest(0, extract(epoch FROM now() - pg_last_xact_replay_timestamp()))
        END)::float8 AS replay_lag;

-- name: metrics_lease_expiry_total
-- Every expiry ever recorded: identity values only grow, even after old rows are pruned.
SELECT coalesce(max(id), 0) AS total FROM {schema}.lease_expiry;
