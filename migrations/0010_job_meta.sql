-- Metadata that travels with a job from its enqueue to each attempt, such as the trace
-- context of the code that enqueued it (jobtui/otel.py): NULL for jobs without any. The
-- archive keeps it as it keeps every other column.
-- A nullable column without a default is a change of the catalog only: no table rewrite,
-- however many rows the table holds.
ALTER TABLE {schema}.job ADD COLUMN meta jsonb;
ALTER TABLE {schema}.job_archive ADD COLUMN meta jsonb;
