-- Pauses, limits and rates of queues and job types (core/queues.py).
-- noun: queue
--
-- Named blocks (`-- name: NAME`), loaded with every other file of this folder by
-- jobtui/kernel/db.py. {schema} is the quoted schema name, {channel} its LISTEN channel;
-- values are always bound parameters; time is always the database's now().

-- name: queue_pause
-- Operator: pause a queue or a job type on every worker, from each one's next claim. Fenced
-- by the state it expects: returns a row only when it was not paused.
INSERT INTO {schema}.queue_control AS c (kind, name, paused_at, paused_by, changed_by)
VALUES (%(kind)s, %(name)s, now(), %(actor)s, %(actor)s)
ON CONFLICT (kind, name) DO UPDATE
SET paused_at = now(), paused_by = excluded.paused_by, changed_at = now(), changed_by = excluded.changed_by
WHERE c.paused_at IS NULL
RETURNING c.name;

-- name: queue_resume
-- Operator: resume a paused queue or type; returns a row only when it was paused. Wakes the
-- workers, so that they claim at once rather than at their next poll. With a ramp of
-- %(ramp)s seconds the rate then rises over that time (control_rate, migration 0013), from an
-- empty bucket; without one any earlier ramp ends.
WITH resumed AS (
    UPDATE {schema}.queue_control AS c
    SET paused_at = NULL, paused_by = NULL, changed_at = now(), changed_by = %(actor)s,
        ramp_from = CASE WHEN %(ramp)s::float8 > 0 THEN now() END,
        ramp_until = CASE WHEN %(ramp)s::float8 > 0 THEN now() + make_interval(secs => %(ramp)s::float8) END
    WHERE c.kind = %(kind)s AND c.name = %(name)s AND c.paused_at IS NOT NULL
    RETURNING c.kind, c.name
), bucket AS (
    INSERT INTO {schema}.rate_bucket AS b (kind, name, tokens, refilled_at)
    SELECT kind, name, 0, now() FROM resumed WHERE %(ramp)s::float8 > 0
    ON CONFLICT (kind, name) DO UPDATE SET tokens = 0, refilled_at = now()
)
SELECT name, pg_notify(%(channel)s::text, '') AS woken FROM resumed;

-- name: queue_limit_set
-- Operator: set (or with NULL clear) how many jobs of a queue run at once across every
-- worker, from each one's next claim. Fenced by the limit the operator saw (`expected`,
-- compared with IS NOT DISTINCT FROM) when `fenced`; returns the limit it found and whether it
-- replaced it (not when it had changed meanwhile). Wakes the workers when it did, since a
-- higher limit leaves room now.
-- The limit before is read once, in `allowed`, which the insert reads first: read again after
-- the insert, the row it locked FOR UPDATE would be the one this statement just changed, and
-- come back empty.
WITH before AS MATERIALIZED (
    SELECT max_running FROM {schema}.queue_control
    WHERE kind = 'queue' AND name = %(name)s
    FOR UPDATE
), allowed AS MATERIALIZED (
    SELECT b.was, NOT %(fenced)s OR b.was IS NOT DISTINCT FROM %(expected)s::int AS ok
    FROM (SELECT (SELECT max_running FROM before) AS was) AS b
), changed AS (
    INSERT INTO {schema}.queue_control AS c (kind, name, max_running, changed_by)
    SELECT 'queue', %(name)s, %(limit)s::int, %(actor)s FROM allowed WHERE ok
    ON CONFLICT (kind, name) DO UPDATE
    SET max_running = excluded.max_running, changed_at = now(), changed_by = excluded.changed_by
    RETURNING c.name
)
SELECT a.was, c.name IS NOT NULL AS changed,
       CASE WHEN c.name IS NOT NULL THEN pg_notify(%(channel)s::text, '') END AS woken
FROM allowed AS a LEFT JOIN changed AS c ON true;

-- name: queue_rate_set
-- Operator: set (or with NULL clear) how many jobs of a queue or job type are claimed per
-- second across every worker, from each one's next claim. Fenced by the rate the operator
-- saw, as queue_limit_set is; returns the rate before, and whether it changed (not when the rate
-- had changed meanwhile: `was` then says what it is).
-- The bucket keeps what it held at the old rate (up to two seconds' worth of the new one), so
-- that a change takes effect at the next claim, without a burst. Wakes the workers.
-- The rate before is read once, in `allowed`, as in queue_limit_set.
WITH before AS MATERIALIZED (
    SELECT rate_per_second FROM {schema}.queue_control
    WHERE kind = %(kind)s AND name = %(name)s
    FOR UPDATE
), allowed AS MATERIALIZED (
    SELECT b.was, NOT %(fenced)s OR b.was IS NOT DISTINCT FROM %(expected)s::float8 AS ok
    FROM (SELECT (SELECT rate_per_second FROM before) AS was) AS b
), changed AS (
    INSERT INTO {schema}.queue_control AS c (kind, name, rate_per_second, changed_by)
    SELECT %(kind)s, %(name)s, %(rate)s::float8, %(actor)s FROM allowed WHERE ok
    ON CONFLICT (kind, name) DO UPDATE
    SET rate_per_second = excluded.rate_per_second, changed_at = now(), changed_by = excluded.changed_by
    RETURNING c.kind, c.name
), bucket AS (
    INSERT INTO {schema}.rate_bucket AS b (kind, name, tokens, refilled_at)
    SELECT kind, name, 1, now() FROM changed WHERE %(rate)s::float8 IS NOT NULL
    ON CONFLICT (kind, name) DO UPDATE
    SET tokens = least({schema}.rate_burst(%(rate)s::float8),
                       b.tokens + coalesce((SELECT was FROM allowed), 0)
                                  * greatest(0.0, extract(epoch FROM now() - b.refilled_at)::float8)),
        refilled_at = greatest(b.refilled_at, now())
)
SELECT a.was, c.name IS NOT NULL AS changed,
       CASE WHEN c.name IS NOT NULL THEN pg_notify(%(channel)s::text, '') END AS woken
FROM allowed AS a LEFT JOIN changed AS c ON true;
