-- Schedules in named queues, and the ready jobs of each minute by queue.
--
-- A schedule's jobs go to its queue ('default' unless declared or added with another: the
-- handler's declared queue, `jobs.schedule(queue=)`, `jobtui schedule add --queue`). The
-- schedule table is small; a constant default changes the catalog only. A scheduler of the
-- previous release names no queue and keeps enqueueing into 'default'.
ALTER TABLE {schema}.schedule
    ADD COLUMN queue text NOT NULL DEFAULT 'default' CHECK (queue <> '' AND length(queue) <= 200);

-- The archiver's minute row also counts the ready jobs by queue ({"queue": [ready, due,
-- oldest age]}), so that the Queues pane, `jobtui queue list` and Prometheus can tell each
-- queue's backlog without counting it on every read. Rows written by an archiver of the
-- previous release keep the empty default, and the readers fall back on the planner.
ALTER TABLE {schema}.queue_minute ADD COLUMN by_queue jsonb NOT NULL DEFAULT '{}'::jsonb;
