-- Each schedule's grace: a slot handled within this many seconds after its time is on time
-- and gets its job, whatever the schedule's interval; a slot handled later was missed (every
-- scheduler was down), and the missed-slot policy decides whether it still gets one.
ALTER TABLE {schema}.schedule
    ADD COLUMN grace_seconds double precision NOT NULL DEFAULT 30
        CHECK (grace_seconds >= 0 AND grace_seconds <= 86400),
    -- Missed slots that got their job late anyway: the newest one of each outage under the
    -- `once` policy, up to 100 per outage under `all`. missed_count counts every missed slot.
    ADD COLUMN backfilled_count bigint NOT NULL DEFAULT 0;
