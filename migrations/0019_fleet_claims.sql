-- The fleet's claims: when each worker last had a claim answered, and how often it polls, so
-- that a reader can tell a worker that is alive (its row refreshed) but not claiming (a claim
-- stuck behind a lock, a producer that stopped) from one that is busy or idle. A worker
-- writes them with its row (core/fleet.py), never once per claim: `claimed_at` is the time of
-- its last answered claim as of its last refresh, by the database's clock. NULL in both for
-- processes that claim nothing (a scheduler, `serve`) and for workers of the release before,
-- which do not report their claims; nothing else changes, so those keep working.
ALTER TABLE {schema}.fleet
    ADD COLUMN claimed_at timestamptz,
    ADD COLUMN poll       float8 CHECK (poll > 0 AND poll <= 86400);
