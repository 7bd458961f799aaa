-- The fleet: one row per long-running jobtui process (a worker, a standalone scheduler, the
-- console's embedded worker, `jobtui serve`), written when it starts, refreshed on its own
-- slow timer by the database's clock, and deleted when it exits cleanly (core/fleet.py). A
-- row not refreshed within its own `lost_after` reads as lost; lost rows are pruned after an
-- hour, and past the newest 500 of them (fleet_prune), so the table stays bounded.
-- An operator's order (quiet, resume, stop) is written to the row (`wanted`, counted in
-- `orders`), with an audit row in the same transaction; the process reads it at its next
-- refresh (a notification may make that come sooner, never decide). Nothing here touches
-- the job table: a worker of the previous release keeps working, and does not register.
CREATE TABLE {schema}.fleet (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text        NOT NULL CHECK (name <> '' AND length(name) <= 200),
    kind        text        NOT NULL CHECK (kind IN ('worker', 'scheduler', 'console', 'serve')),
    host        text        NOT NULL CHECK (length(host) <= 255),
    pid         integer     NOT NULL,
    version     text        NOT NULL CHECK (length(version) <= 64),
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now(),
    -- Seconds without a refresh after which the row reads as lost: three of its intervals.
    lost_after  float8      NOT NULL CHECK (lost_after > 0 AND lost_after <= 86400),
    -- The queues it claims from, each with its slots ({"emails": 5, "jobtui.builtin": 1}),
    -- and the slots it shares among every queue (NULL: it serves named queues only).
    queues      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    every_queue integer     CHECK (every_queue > 0),
    -- The job types its app handles (claims), the built-in ones included.
    types       text[]      NOT NULL DEFAULT ARRAY[]::text[],
    -- Where its sync handlers run (thread, process, or none for an app of async handlers),
    -- and its handler processes alive, in process mode.
    executor    text,
    children    integer,
    scheduler   boolean     NOT NULL DEFAULT false,
    in_flight   integer     NOT NULL DEFAULT 0,
    rss_bytes   bigint,
    metrics     text,
    -- What the process does (state) and what an operator asked of it (wanted); `orders`
    -- counts the orders given, so that the process acts on each once.
    state       text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'quiet', 'stopping')),
    wanted      text        NOT NULL DEFAULT 'running' CHECK (wanted IN ('running', 'quiet', 'stopping')),
    orders      integer     NOT NULL DEFAULT 0,
    ordered_by  text,
    ordered_at  timestamptz
) WITH (fillfactor = 50);
-- Half of each page is left free: a refresh changes no indexed column, so it can be a HOT
-- update in the same page, and the table stays a few pages for a thousand processes.
-- A process finds the rows of its name by it: its own lost ones, which it replaces.
CREATE INDEX fleet_name_idx ON {schema}.fleet (name);
