-- The ready jobs of jobtui's own queue ('jobtui.builtin': the archiver's), in an index of
-- their own. Every worker keeps a slot for them whatever queues it serves, and claims once a
-- poll (claim_builtin). Through the ready index that claim would step over every other ready
-- job to find none: a read that grows with the backlog, on every worker, every second. This
-- partial index holds a few rows at most, so the claim reads a page or two at any size.
--
-- Built CONCURRENTLY (an online migration, kernel/migrate.py): it reads the job table twice
-- while enqueues, claims and outcomes go on, and is recorded once valid. A build that was
-- interrupted leaves an invalid index, which the next `jobtui migrate` drops and builds
-- again. Installs that applied this migration when it was a plain CREATE INDEX are not
-- touched: the migration table records it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS job_builtin_ready_idx ON {schema}.job (run_at, id)
    WHERE status = 'ready' AND queue = 'jobtui.builtin';
