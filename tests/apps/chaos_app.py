"""Handlers of the chaos runs (bench/chaos.py, tests/chaos/): workers load `tests.apps.chaos_app:jobs`.

Every handler writes what it did into tables of the run's database (created by
`APP_TABLES`), on a connection of its own (JOBTUI_DSN, so a worker cut off from the database
is cut off from them too):

    chaos_attempt(job_id, token, attempt, worker, event, at) 'start' when an attempt starts,
                                                             'end' when its handler returns
    chaos_effect(job_id, key, token, attempt, worker,        the effect, in the same transaction
                 seen_token, seen_status, at)                as `job.once(conn, key)`

`chaos_effect` has deliberately no unique key, so a duplicated effect would show as two rows.
Before calling `once`, the effect transaction reads the job's row: `seen_token`/`seen_status`
say which lease the queue held when this attempt did its effect. An effect done by an attempt
whose lease had already passed to another claim (a zombie) shows as seen_token <> token.

Payload: `before` and `after` (seconds, or a list indexed by attempt - 1: sleeps around the
effect), `fail_first` (the first attempt raises before its effect).
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

from jobtui.core.registry import Job, Jobs
from jobtui.kernel.backoff import BackoffPolicy
from jobtui.kernel.db import connection_options
from tests.apps.work import awork, work

jobs = Jobs()

# Chaos counts lease expiries and failed attempts caused by terminated connections as
# attempts: effect jobs get room for them (a job running 5 s while a fault strikes every
# 1.5 s can take a dozen), and retry fast so that the run drains quickly.
EFFECT_ATTEMPTS = 100
POISON_ATTEMPTS = 3
FAST = BackoffPolicy(base=0.2, factor=2.0, cap=1.0)

APP_TABLES = """
CREATE TABLE IF NOT EXISTS chaos_attempt (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, token bigint NOT NULL, attempt int NOT NULL,
    worker text NOT NULL, event text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS chaos_effect (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, key text NOT NULL, token bigint NOT NULL,
    attempt int NOT NULL, worker text NOT NULL, seen_token bigint, seen_status text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS chaos_clock (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, worker text NOT NULL,
    local_at timestamptz NOT NULL, db_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

_ATTEMPT = "INSERT INTO chaos_attempt (job_id, token, attempt, worker, event) VALUES (%s, %s, %s, %s, %s)"
_SEEN = "SELECT lease_token, status FROM jobtui.job WHERE id = %s"
_EFFECT = (
    "INSERT INTO chaos_effect (job_id, key, token, attempt, worker, seen_token, seen_status)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
_CLOCK = "INSERT INTO chaos_clock (job_id, worker, local_at) VALUES (%s, %s, to_timestamp(%s))"


def effect_key(job_id: int) -> str:
    return f"chaos:{job_id}"


def _dsn() -> str:
    return os.environ["JOBTUI_DSN"]


def _options() -> dict[str, Any]:
    """A handler's connection as docs/scaling.md advises: it fails within seconds when the
    database goes silent, rather than when TCP gives up."""
    return connection_options(_dsn())


def _seconds(value: Any, job: Job) -> float:
    if isinstance(value, list):
        return float(value[job.attempt - 1]) if job.attempt <= len(value) else 0.0
    return float(value or 0)


def _attempt_row(job: Job, event: str) -> tuple[int, int, int, str, str]:
    return (job.id, job.lease_token, job.attempt, job.worker_id, event)


def _effect_row(job: Job, seen: Any) -> tuple[Any, ...]:
    seen_token, seen_status = seen if seen else (None, None)
    return (job.id, effect_key(job.id), job.lease_token, job.attempt, job.worker_id, seen_token, seen_status)


def _fail_first(job: Job) -> None:
    if job.payload.get("fail_first") and job.attempt == 1:
        raise RuntimeError(f"flaky: attempt {job.attempt} fails before its effect")


def _effect(job: Job) -> None:
    payload = job.payload
    with psycopg.connect(_dsn(), autocommit=True, **_options()) as conn:
        conn.execute(_ATTEMPT, _attempt_row(job, "start"))
        work(_seconds(payload.get("before"), job))
        _fail_first(job)
        with conn.transaction():
            seen = conn.execute(_SEEN, (job.id,)).fetchone()
            if job.once(conn, effect_key(job.id)):
                conn.execute(_EFFECT, _effect_row(job, seen))
        work(_seconds(payload.get("after"), job))
        conn.execute(_ATTEMPT, _attempt_row(job, "end"))


async def _effect_async(job: Job) -> None:
    payload = job.payload
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True, **_options()) as conn:
        await conn.execute(_ATTEMPT, _attempt_row(job, "start"))
        await awork(_seconds(payload.get("before"), job))
        _fail_first(job)
        async with conn.transaction():
            seen = await (await conn.execute(_SEEN, (job.id,))).fetchone()
            if await job.once_async(conn, effect_key(job.id)):
                await conn.execute(_EFFECT, _effect_row(job, seen))
        await awork(_seconds(payload.get("after"), job))
        await conn.execute(_ATTEMPT, _attempt_row(job, "end"))


@jobs.handler("chaos.sync", max_attempts=EFFECT_ATTEMPTS, backoff=FAST)
def effect_sync(job: Job) -> None:
    """The effect from a sync handler (a thread of its own)."""
    _effect(job)


@jobs.handler("chaos.async", max_attempts=EFFECT_ATTEMPTS, backoff=FAST)
async def effect_async(job: Job) -> None:
    """The effect from an async handler (on the worker's loop)."""
    await _effect_async(job)


@jobs.handler("chaos.poison", max_attempts=POISON_ATTEMPTS, backoff=BackoffPolicy(base=0.1, cap=0.2))
def poison(job: Job) -> None:
    """Always fails: dead by design after POISON_ATTEMPTS attempts, with no effect."""
    with psycopg.connect(_dsn(), autocommit=True, **_options()) as conn:
        conn.execute(_ATTEMPT, _attempt_row(job, "start"))
    raise ValueError(f"poison: attempt {job.attempt} always fails")


@jobs.handler("chaos.clock", max_attempts=EFFECT_ATTEMPTS, backoff=FAST)
def clock(job: Job) -> None:
    """Records this worker's wall clock next to the database's, then does the effect."""
    with psycopg.connect(_dsn(), autocommit=True, **_options()) as conn:
        conn.execute(_CLOCK, (job.id, job.worker_id, time.time()))
    _effect(job)


@jobs.handler("chaos.tick")
def tick(job: Job) -> None:
    """A schedule's job: nothing to do."""
