"""Handlers for the outage and zombie tests (tests/chaos/test_outages.py).

While the database is away a handler cannot write to it, so each one appends what it does to
the file named by JOBTUI_TEST_EVENTS, one line per event, with the system-wide monotonic
clock, so that the test can tell whether two attempts of a job ever ran at the same time:

    <event> <job id> <lease token> <worker> <time.monotonic()>

Effects go through `job.once` into effect_log (the tests create it), as in worker_app.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import psycopg

from jobtui.core.registry import Job, Jobs, LeaseLost
from jobtui.kernel.backoff import BackoffPolicy
from tests.apps.work import awork, note, work

jobs = Jobs()
FAST = BackoffPolicy(base=0.1, cap=0.2)


def _dsn() -> str:
    return os.environ["JOBTUI_DSN"]


def event(job: Job, what: str) -> None:
    note(job, what)


def _record(conn: psycopg.Connection[Any], job: Job, key: str) -> None:
    conn.execute(
        "INSERT INTO effect_log (key, job_id, attempt, worker) VALUES (%s, %s, %s, %s)",
        (key, job.id, job.lease_token, job.worker_id),
    )


@jobs.handler("outage.async", backoff=FAST)
async def outage_async(job: Job) -> None:
    """Work for `seconds`, then do the job's effect once."""
    event(job, "start")
    try:
        await awork(float(job.payload["seconds"]))
    except asyncio.CancelledError:
        event(job, "cancelled")
        raise
    async with await psycopg.AsyncConnection.connect(_dsn()) as conn:
        if await job.once_async(conn, f"outage:{job.id}"):
            await conn.execute(
                "INSERT INTO effect_log (key, job_id, attempt, worker) VALUES (%s, %s, %s, %s)",
                (f"outage:{job.id}", job.id, job.lease_token, job.worker_id),
            )
    event(job, "end")


@jobs.handler("outage.sync", backoff=FAST)
def outage_sync(job: Job) -> None:
    """As outage.async, in a thread: it stops when `job.lost` says so, as a long handler should."""
    event(job, "start")
    if work(float(job.payload["seconds"]), lambda: job.lost):
        event(job, "stopped")
        return
    with psycopg.connect(_dsn()) as conn:
        if job.once(conn, f"outage:{job.id}"):
            _record(conn, job, f"outage:{job.id}")
    event(job, "end")


def _wait_at_gate(marker: Path, gate: int) -> None:
    """Create `marker`, then wait until the test opens `gate` (tests.workers.close_gate: an
    advisory lock the test holds, shared here once the test let it go)."""
    marker.touch()
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock_shared(%s)", (gate,))


@jobs.handler("hold_effect", backoff=FAST)
def hold_effect(job: Job) -> None:
    """On its first attempt, hold the effect's transaction open after `once()` (mode
    "after") or before it (mode "before"), until the test opens the gate `gate`; it creates the
    file `marker` there, and the test freezes the worker meanwhile."""
    event(job, "start")
    first = job.lease_token == 1
    marker = Path(job.payload["marker"])
    with psycopg.connect(_dsn()) as conn:
        conn.execute("SELECT 1")  # the transaction has begun
        if first and job.payload["mode"] == "before":
            _wait_at_gate(marker, int(job.payload["gate"]))
        try:
            fresh = job.once(conn, f"hold:{job.id}")
        except LeaseLost:
            event(job, "refused")
            raise
        if fresh:
            _record(conn, job, f"hold:{job.id}")
            if first and job.payload["mode"] == "after":
                _wait_at_gate(marker, int(job.payload["gate"]))
    event(job, "end")


@jobs.handler("db_error", backoff=FAST, max_attempts=2)
def db_error(job: Job) -> None:
    """Its own connection is terminated (AdminShutdown) on the first `fail` runs, inside the
    effect's transaction after `once()`; then it does the effect."""
    with psycopg.connect(_dsn(), autocommit=True) as log_conn:
        log_conn.execute("INSERT INTO run_log (job_id, attempt, worker, event) VALUES (%s, %s, %s, 'start')",
                         (job.id, job.attempt, job.worker_id))  # fmt: skip
        row = log_conn.execute("SELECT count(*) FROM run_log WHERE job_id = %s", (job.id,)).fetchone()
    runs = int(row[0]) if row else 0
    with psycopg.connect(_dsn()) as conn:
        if job.once(conn, f"db-error:{job.id}"):
            if runs <= int(job.payload.get("fail", 0)):
                conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            _record(conn, job, f"db-error:{job.id}")
