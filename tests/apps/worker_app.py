"""Handlers for the worker runtime tests, driven by each job's payload.

Every handler records what it did in tables of the test database (created by the tests):

    run_log(job_id, attempt, worker, event, at)       one row per event, no idempotency
    effect_log(key, job_id, attempt, worker)          the effect; deliberately no unique key,
                                                      so a duplicated effect shows as two rows

Effects go through the idempotency helper: `job.once(conn, key)` and the insert share one
transaction on the handler's own connection.

Sleeps (`after`, `sleep`) are seconds, or a list of seconds indexed by attempt - 1 (missing
entries mean 0), so a job can be slow on its first attempt only. Gates (`hold_before`,
`hold_after`: the key of an advisory lock the test holds, tests.workers.close_gate) make the
handler wait until the test opens them, instead of for a time; a list of keys is indexed by
attempt - 1 as well (missing entries mean no gate).
"""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

import psycopg

from jobtui.core.registry import Job, Jobs, Permanent, Retry
from jobtui.kernel.backoff import BackoffPolicy
from tests.apps.work import awork, work

jobs = Jobs()
# For the bad --app tests: an attribute that is not a Jobs registry.
not_jobs: dict[str, dict[str, object]] = {"handlers": {}}

FAST = BackoffPolicy(base=0.1, cap=0.2)


def _dsn() -> str:
    return os.environ["JOBTUI_DSN"]


def _seconds(value: Any, job: Job) -> float:
    if isinstance(value, list):
        return float(value[job.attempt - 1]) if job.attempt <= len(value) else 0.0
    return float(value or 0)


def _gate(value: Any, job: Job) -> int | None:
    if isinstance(value, list):
        return int(value[job.attempt - 1]) if job.attempt <= len(value) else None
    return None if value is None else int(value)


def _wait_gate(job: Job, value: Any) -> None:
    """Until the test opens the gate: its advisory lock, shared once the test let it go."""
    key = _gate(value, job)
    if key is not None:
        with psycopg.connect(_dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock_shared(%s)", (key,))


async def _await_gate(job: Job, value: Any) -> None:
    key = _gate(value, job)
    if key is not None:
        async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
            await conn.execute("SELECT pg_advisory_lock_shared(%s)", (key,))


def _log(job: Job, event: str) -> None:
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO run_log (job_id, attempt, worker, event) VALUES (%s, %s, %s, %s)",
            (job.id, job.attempt, job.worker_id, event),
        )


async def _alog(job: Job, event: str) -> None:
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO run_log (job_id, attempt, worker, event) VALUES (%s, %s, %s, %s)",
            (job.id, job.attempt, job.worker_id, event),
        )


def _effect(job: Job, key: str) -> None:
    # psycopg commits on leaving the block and rolls back on an exception.
    with psycopg.connect(_dsn()) as conn:
        if job.once(conn, key):
            conn.execute(
                "INSERT INTO effect_log (key, job_id, attempt, worker) VALUES (%s, %s, %s, %s)",
                (key, job.id, job.attempt, job.worker_id),
            )


@jobs.handler("effect", backoff=FAST)
def effect(job: Job) -> None:
    """Wait at gate `hold_before`, do effect `key` once, sleep `after`, wait at `hold_after`."""
    _log(job, "start")
    _wait_gate(job, job.payload.get("hold_before"))
    _effect(job, job.payload["key"])
    _log(job, "effect")
    work(_seconds(job.payload.get("after"), job))
    _wait_gate(job, job.payload.get("hold_after"))
    _log(job, "end")


@jobs.handler("effect_async", backoff=FAST)
async def effect_async(job: Job) -> None:
    """Async counterpart of `effect`."""
    await _alog(job, "start")
    await _await_gate(job, job.payload.get("hold_before"))
    async with await psycopg.AsyncConnection.connect(_dsn()) as conn:
        if await job.once_async(conn, job.payload["key"]):
            await conn.execute(
                "INSERT INTO effect_log (key, job_id, attempt, worker) VALUES (%s, %s, %s, %s)",
                (job.payload["key"], job.id, job.attempt, job.worker_id),
            )
    await _alog(job, "effect")
    await awork(_seconds(job.payload.get("after"), job))
    await _await_gate(job, job.payload.get("hold_after"))
    await _alog(job, "end")


@jobs.handler("gc_threshold")
async def gc_threshold(job: Job) -> None:
    """Records the collector's first threshold in this worker process."""
    await _alog(job, f"gc {gc.get_threshold()[0]}")


@jobs.handler("permanent")
def permanent(job: Job) -> None:
    _log(job, "start")
    raise Permanent(f"cannot ever work: {job.payload.get('why', 'bad input')}")


@jobs.handler("retry_later")
def retry_later(job: Job) -> None:
    """Ask to run again after `delay` seconds the first `retries` times it runs, then succeed."""
    _log(job, "start")
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM run_log WHERE job_id = %s AND event = 'start'", (job.id,)).fetchone()
    runs = int(row[0]) if row else 0
    if runs <= int(job.payload.get("retries", 1)):
        raise Retry(float(job.payload.get("delay", 0.5)), "come back later")
    _log(job, "end")


@jobs.handler("boom", backoff=FAST)
def boom(job: Job) -> None:
    _log(job, "start")
    raise ValueError(f"boom on attempt {job.attempt}")


@jobs.handler("slow_async", timeout=0.5, backoff=FAST)
async def slow_async(job: Job) -> None:
    await _alog(job, "start")
    await awork(float(job.payload.get("sleep", 5)))
    await _alog(job, "end")


@jobs.handler("slow_sync", timeout=0.5, backoff=FAST)
def slow_sync(job: Job) -> None:
    """Runs over its timeout, then tries its effect: the helper must refuse it."""
    _log(job, "start")
    work(float(job.payload.get("sleep", 1.5)))
    try:
        _effect(job, job.payload["key"])
    except Exception as exc:
        _log(job, f"effect refused: {type(exc).__name__}")
        raise
    _log(job, "end")


@jobs.handler("quick")
async def quick(job: Job) -> None:
    """Nothing: a job whose start time is all a test reads (rates, ramps)."""


@jobs.handler("brief")
async def brief(job: Job) -> None:
    """Work `sleep` seconds, writing nothing: a job whose only cost is its slot's time."""
    await awork(float(job.payload["sleep"]))


@jobs.handler("nap")
async def nap(job: Job) -> None:
    """Sleep `sleep` seconds; logs `cancelled` if the worker cancels it meanwhile."""
    await _alog(job, "start")
    try:
        await awork(float(job.payload.get("sleep", 0.1)))
    except asyncio.CancelledError:
        await asyncio.shield(_alog(job, "cancelled"))
        raise
    await _alog(job, "end")


@jobs.handler("nap_sync")
def nap_sync(job: Job) -> None:
    """Sleep `sleep` seconds in steps, returning early once `job.cancelled`; then try effect
    `key`, which a cancelled job's helper must refuse."""
    _log(job, "start")
    work(float(job.payload.get("sleep", 0.1)), lambda: job.cancelled)
    if job.cancelled:
        _log(job, "cancelled")
    try:
        _effect(job, job.payload.get("key", f"nap-{job.id}"))
    except Exception as exc:
        _log(job, f"effect refused: {type(exc).__name__}")
        return
    _log(job, "end")


@jobs.handler("crash")
def crash(job: Job) -> None:
    """Ends the worker's process at once (in the thread executor): a poison job in a crash loop."""
    _log(job, "start")
    os._exit(3)


@jobs.handler("fails_slowly", backoff=BackoffPolicy(base=60.0, cap=60.0))
def fails_slowly(job: Job) -> None:
    """Fails, and is retried after about a minute's back-off."""
    raise ValueError(f"fails on attempt {job.attempt}")
