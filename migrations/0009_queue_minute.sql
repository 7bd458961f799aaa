-- The queue's figures minute by minute, so the console can draw the last hour from its first
-- frame and tell a backlog's size without counting it. The archiver (once a minute, whichever
-- worker runs it) writes the row of the minute that just ended; rows older than a day are
-- pruned with it, so the table stays at 1,440 rows. A new table: nothing is rewritten.
CREATE TABLE {schema}.queue_minute (
    minute            timestamptz PRIMARY KEY,
    -- Counted when the row was written, a few seconds after the minute ended.
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    ready             bigint      NOT NULL,
    ready_due         bigint      NOT NULL,
    oldest_ready_age  float8,
    -- Jobs that finished within the minute: done (rows and done_tally), dead or failed.
    done              bigint      NOT NULL,
    dead              bigint      NOT NULL,
    -- Leases the reaper found expired within the minute.
    lease_expiries    bigint      NOT NULL,
    -- Ready jobs by type when the row was written: {"type": [ready, due, oldest age]}.
    by_type           jsonb       NOT NULL DEFAULT '{}'::jsonb
);
