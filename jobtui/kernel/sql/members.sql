-- The fleet's members: the row each long-running process keeps of itself, and operators'
-- orders to it (core/members.py; migration 0016; reads/fleet.py reads the rows).
-- noun: member
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: member_register
-- A process starts (or comes back after its row was pruned): its row, as it describes
-- itself. A lost row of the same name is the one it replaces (a worker with a fixed --id
-- that was killed and started again), so it goes; a live one of the same name stays, and the
-- two show side by side.
WITH replaced AS (
    DELETE FROM {schema}.fleet
    WHERE name = %(name)s AND seen_at < now() - make_interval(secs => lost_after)
)
INSERT INTO {schema}.fleet (name, kind, host, pid, version, lost_after, queues, every_queue, types, executor,
                            children, scheduler, in_flight, rss_bytes, metrics, state, poll, claimed_at)
VALUES (%(name)s, %(kind)s, %(host)s, %(pid)s, %(version)s, %(lost_after)s, %(queues)s::jsonb, %(every_queue)s,
        %(types)s::text[], %(executor)s, %(children)s, %(scheduler)s, %(in_flight)s, %(rss_bytes)s, %(metrics)s,
        %(state)s, %(poll)s, now() - make_interval(secs => %(claimed_ago)s::float8))
RETURNING id, wanted, orders, ordered_by;

-- name: member_refresh
-- A process's refresh, on its own timer: when it was last seen (the database's now()), what
-- it does, when it last had a claim answered (%(claimed_ago)s seconds ago; NULL: not since
-- it started, or it claims nothing; migration 0019), and what it was asked (its answer). No
-- row: it was pruned while the process was away, and it registers again. A row of the same name last seen before this process started,
-- and lost now, was this process's before a restart (a worker with a fixed --id that crashed
-- and was started again): it goes, rather than wait to be pruned. A live one stays. Only the
-- refreshes of a process's first minutes look (`replacing`): by then such a row is lost.
WITH mine AS (
    UPDATE {schema}.fleet
    SET seen_at = now(), state = %(state)s, in_flight = %(in_flight)s, children = %(children)s,
        rss_bytes = %(rss_bytes)s, claimed_at = now() - make_interval(secs => %(claimed_ago)s::float8)
    WHERE id = %(id)s
    RETURNING id, name, started_at, wanted, orders, ordered_by
), replaced AS (
    DELETE FROM {schema}.fleet AS f
    USING mine AS m
    WHERE %(replacing)s AND f.name = m.name AND f.id <> m.id AND f.seen_at < m.started_at
      AND f.seen_at < now() - make_interval(secs => f.lost_after)
)
SELECT id, wanted, orders, ordered_by FROM mine;

-- name: member_leave
-- A clean exit: the row goes.
DELETE FROM {schema}.fleet WHERE id = %(id)s RETURNING id;

-- name: member_prune
-- The archiver, once a minute: rows lost for longer than %(keep)s seconds go, and lost ones
-- past the newest %(most)s, so a fleet that crashes and restarts cannot grow the table.
WITH lost AS (
    SELECT id, seen_at < now() - make_interval(secs => lost_after + %(keep)s) AS old,
           row_number() OVER (ORDER BY seen_at DESC, id DESC) AS newest
    FROM {schema}.fleet
    WHERE seen_at < now() - make_interval(secs => lost_after)
), gone AS (
    DELETE FROM {schema}.fleet WHERE id IN (SELECT id FROM lost WHERE old OR newest > %(most)s)
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: member_order
-- Operator: quiet, resume or stop the processes matched by id, name, host and version (NULL:
-- any), each only from the state the order expects (a stop of one already stopping changes
-- nothing; quiet and resume are for processes that claim or fire, not `serve`), and only
-- while live. Returns every matched row, live or lost, with whether it changed; a changed one
-- is hinted (a notification, which makes it read its row: anyone may send one, so it decides
-- nothing), and otherwise reads it at its next refresh.
WITH matched AS MATERIALIZED (
    SELECT id, name, kind, host, version, state, wanted,
           seen_at >= now() - make_interval(secs => lost_after) AS live
    FROM {schema}.fleet
    WHERE (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND (%(name)s::text IS NULL OR name = %(name)s::text)
      AND (%(host)s::text IS NULL OR host = %(host)s::text)
      AND (%(version)s::text IS NULL OR version = %(version)s::text)
    ORDER BY id
    FOR UPDATE
), fit AS (
    SELECT id, live AND CASE %(action)s::text
        WHEN 'quiet' THEN kind <> 'serve' AND wanted = 'running' AND state <> 'stopping'
        WHEN 'resume' THEN kind <> 'serve' AND wanted <> 'stopping' AND state <> 'stopping'
                           AND (wanted = 'quiet' OR state = 'quiet')
        WHEN 'stop' THEN wanted <> 'stopping' AND state <> 'stopping'
        ELSE false END AS ok
    FROM matched
), changed AS (
    UPDATE {schema}.fleet AS f
    SET wanted = CASE %(action)s::text WHEN 'quiet' THEN 'quiet' WHEN 'resume' THEN 'running' ELSE 'stopping' END,
        orders = f.orders + 1, ordered_by = %(actor)s, ordered_at = now()
    FROM fit
    WHERE f.id = fit.id AND fit.ok
    RETURNING f.id
)
SELECT m.id, m.name, m.kind, m.host, m.version, m.state, m.wanted, m.live, c.id IS NOT NULL AS changed,
       CASE WHEN c.id IS NOT NULL THEN pg_notify(%(channel)s::text, 'fleet ' || m.id) END AS hinted
FROM matched AS m LEFT JOIN changed AS c USING (id)
ORDER BY m.name, m.id;
