-- Privileges for the roles that use jobtui, once its schema exists (`jobtui migrate`, run by
-- the role that owns the schema). Apply with psql, which quotes the names given with -v:
--
--   psql "$OWNER_DSN" -v schema=jobtui -v role=jobtui_worker -f docs/grants.sql
--   psql "$OWNER_DSN" -v schema=jobtui -v role=jobtui_readonly -v read_only=1 -f docs/grants.sql
--
-- The first gives a role what workers, schedulers, enqueueing applications and operators
-- (`jobtui requeue`, `kill-lease`, `cancel`, `bulk`, `schedule`, `queue`, `type`, `workers
-- quiet|resume|stop`, the console) need, and nothing that changes the schema; the second gives
-- SELECT only (`jobtui stats`, `job`, `dead`, `audit`, `workers`, `jobtui --read-only`,
-- Prometheus metrics). Every statement can be run again: re-run the file
-- after a `jobtui migrate` that adds tables.
--
-- With -v create_role=1 (run by a role that may create roles), a role that does not exist yet
-- is created first (LOGIN, no password: set one, or use another authentication), and marked
-- as jobtui's in its comment, so that `jobtui uninstall` drops it with the schema. A role that
-- exists is left as it is, and `jobtui uninstall` keeps it.

\set ON_ERROR_STOP on

\if :{?create_role}
SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') AS role_missing,
       format('created by jobtui''s docs/grants.sql for schema %I of database %I: jobtui uninstall drops it',
              :'schema', current_database()) AS role_marker
\gset
\if :role_missing
CREATE ROLE :"role" LOGIN;
COMMENT ON ROLE :"role" IS :'role_marker';
\endif
\endif

GRANT USAGE ON SCHEMA :"schema" TO :"role";

\if :{?read_only}

GRANT SELECT ON ALL TABLES IN SCHEMA :"schema" TO :"role";

\else

-- The queue itself: enqueue, claim, heartbeat, outcomes, reaping, operators' changes, and
-- the archiver, which deletes done jobs past their retention.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".job TO :"role";
-- Idempotency keys (migration 0017): claimed by every keyed enqueue, written as keyed jobs
-- leave the queue table, pruned by the archiver once their window has passed.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".job_key TO :"role";
-- Schedules: synced from code by each worker, advanced by the scheduler, managed by the CLI.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".schedule TO :"role";
-- The archiver moves done jobs here, and prunes them after their own retention (through the
-- owner's functions archive_partitions_add and archive_prune, granted with the others below:
-- the day partitions are the owner's, reached through job_archive).
GRANT SELECT, INSERT, DELETE ON :"schema".job_archive TO :"role";
-- Lease expiries (recorded by the reaper) and hourly summaries, pruned by the archiver.
GRANT SELECT, INSERT, DELETE ON :"schema".lease_expiry, :"schema".stats_hourly TO :"role";
-- Counts of jobs deleted at completion (--delete-on-complete), added to by each finishing
-- worker and pruned by the archiver.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".done_tally TO :"role";
-- The queue's figures per minute (the console's charts and backlog estimate), written and
-- pruned by the archiver.
GRANT SELECT, INSERT, DELETE ON :"schema".queue_minute TO :"role";
-- Effects recorded by handlers (`job.once`): written by handlers, pruned by the archiver
-- once no retry of their job can need them.
GRANT SELECT, INSERT, DELETE ON :"schema".effect TO :"role";
-- The operators' audit log: written, never changed or deleted by this role (the archiver
-- prunes rows older than 30 days at least through the owner's prune_audit function).
GRANT SELECT, INSERT ON :"schema".audit TO :"role";
-- Pauses, limits and rates of queues and types: read by every claim, set by operators.
GRANT SELECT, INSERT, UPDATE ON :"schema".queue_control TO :"role";
-- The token buckets of rated queues and types: taken from by every claim of them.
GRANT SELECT, INSERT, UPDATE ON :"schema".rate_bucket TO :"role";
-- The flows behind the drain forecast, written and pruned by the archiver.
GRANT SELECT, INSERT, DELETE ON :"schema".queue_flow TO :"role";
-- Bulk actions' runs (`jobtui bulk`): their progress, written with each batch.
GRANT SELECT, INSERT, UPDATE ON :"schema".bulk_run TO :"role";
-- The fleet: each process's own row (written at start, refreshed, deleted at exit), lost
-- ones pruned by the archiver, and operators' orders to quiet, resume or stop one. A role
-- given SELECT only (the read-only one) can read the fleet and give no order.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".fleet TO :"role";
-- Checking that the schema is migrated; migrating is left to the owner.
GRANT SELECT ON :"schema".migration TO :"role";
-- Ids for bulk enqueue (COPY) are drawn from the job table's sequence.
GRANT USAGE ON ALL SEQUENCES IN SCHEMA :"schema" TO :"role";
-- The error fingerprint of the job table's generated column (PUBLIC may execute functions by
-- default; granted here for databases that revoke that).
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA :"schema" TO :"role";

\endif
