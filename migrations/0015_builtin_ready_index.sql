-- The ready jobs of jobtui's own queue ('jobtui.builtin': the archiver's), in an index of
-- their own. Every worker keeps a slot for them whatever queues it serves, and claims once a
-- poll (claim_builtin). Through the ready index that claim would step over every other ready
-- job to find none: a read that grows with the backlog, on every worker, every second. This
-- partial index holds a few rows at most, so the claim reads a page or two at any size.
-- Building it reads the job table once, while enqueues and claims wait (seconds per few
-- million rows). On a big table, build it beforehand without blocking them, and the migration
-- finds it (docs/operations.md, "Upgrading"):
--   CREATE INDEX CONCURRENTLY job_builtin_ready_idx ON SCHEMA.job (run_at, id)
--       WHERE status = 'ready' AND queue = 'jobtui.builtin';
CREATE INDEX IF NOT EXISTS job_builtin_ready_idx ON {schema}.job (run_at, id)
    WHERE status = 'ready' AND queue = 'jobtui.builtin';
