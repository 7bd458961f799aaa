-- What runs each running job, as its worker's heartbeat last saw it: the executor (async,
-- thread or process) and, for a child process, its pid and resident memory. The console, a
-- process of its own, shows it in the Running pane and the job view. The heartbeat writes it
-- as jsonb tagged with the lease token of the attempt it describes, so a value left by an
-- earlier attempt (or by a worker that never writes it) is never shown as the current one;
-- no other statement reads or clears it. NULL for jobs that never had a heartbeat.
-- A nullable column without a default is a change of the catalog only: no table rewrite,
-- however many rows the table holds, and workers of the previous release ignore it. The
-- archive keeps it as it keeps every other column (the archiver of the previous release
-- names its columns, and leaves it NULL).
-- Migration numbers are handed out ahead, so this one may land after 0014 on a schema that
-- has it: job_archive is then partitioned (its partitions get the column with it), and the
-- archive as it was, job_archive_legacy while it exists, gets it as 0014 asks. Applied in
-- order, there is no legacy table yet, and 0014 copies the column.
ALTER TABLE {schema}.job ADD COLUMN runner jsonb;
ALTER TABLE {schema}.job_archive ADD COLUMN runner jsonb;
ALTER TABLE IF EXISTS {schema}.job_archive_legacy ADD COLUMN IF NOT EXISTS runner jsonb;
