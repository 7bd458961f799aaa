-- The fleet as the console, `jobtui workers` and the scrape read it (reads/fleet.py;
-- core/members.py writes it).
-- noun: fleet
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: fleet_list
-- Every process of the fleet, live and lost, as the Workers pane, `jobtui workers` and
-- Prometheus read it: a table of a row per process, kept small by member_prune.
-- The ages are float8 (extract gives numeric, which loads as Decimal, slower to read), and
-- the queues their text, which the reader decodes with one JSON decoder (psycopg's jsonb loader
-- costs several times more per row, and a console reads a thousand rows every second).
-- `claim_gap` is how long it had gone without an answered claim when it last refreshed (since
-- it started, when it has had none): a reader cannot know of claims after that refresh.
SELECT id, name, kind, host, pid, version, extract(epoch FROM now() - started_at)::float8 AS up,
       extract(epoch FROM now() - seen_at)::float8 AS seen_ago, lost_after,
       seen_at < now() - make_interval(secs => lost_after) AS lost,
       queues::text AS queues, every_queue, types, executor, children, scheduler, in_flight, rss_bytes, metrics,
       state, wanted, orders, ordered_by, extract(epoch FROM now() - ordered_at)::float8 AS ordered_ago,
       poll, extract(epoch FROM seen_at - coalesce(claimed_at, started_at))::float8 AS claim_gap,
       claimed_at IS NOT NULL AS claimed
FROM {schema}.fleet
ORDER BY host, name, id
LIMIT %(limit)s;
