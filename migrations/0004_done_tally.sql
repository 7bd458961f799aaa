-- Workers started with --delete-on-complete delete a finished job without a key instead of
-- keeping it as a done row: a queue that keeps every done row pays, per job, for a second
-- version of the row and its index entries, and for vacuuming them. The job's count is kept
-- here instead, in the same statement: one row per minute, type, attempts used and worker,
-- so the throughput and attempts figures still see every finished job. A worker owns its
-- rows (the key holds its name), so two workers finishing at once never wait on each other.
CREATE TABLE {schema}.done_tally (
    minute            timestamptz NOT NULL,
    type              text        NOT NULL,
    attempts          integer     NOT NULL,
    worker            text        NOT NULL,
    jobs              bigint      NOT NULL CHECK (jobs > 0),
    -- The earliest start and the latest finish among the jobs counted in this row.
    first_started_at  timestamptz NOT NULL,
    last_finished_at  timestamptz NOT NULL,
    PRIMARY KEY (minute, type, attempts, worker)
);
