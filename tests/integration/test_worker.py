"""The worker runtime against real PostgreSQL and real worker processes.

Worker processes run `python -m jobtui.cli worker --app tests.apps.worker_app:jobs`; their
handlers (tests/apps/worker_app.py) log each run to `run_log` and do their effects through
the idempotency helper into `effect_log`, which has no unique key so that a duplicated
effect would show. Conditions are polled with a deadline, never waited for with a fixed sleep.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui.core.jobs import enqueue as enqueue_job
from jobtui.core.jobs import enqueue_call, get_job_call
from jobtui.core.registry import Job, Jobs, Retry
from jobtui.kernel.db import run
from jobtui.kernel.domain import JobRow, JobStatus
from jobtui.worker import Worker
from jobtui.worker.config import GC_THRESHOLD as WORKER_GC_THRESHOLD
from jobtui.worker.events import Expectation
from tests.cli import run_cli
from tests.integration.conftest import Spawn
from tests.waits import wait_until
from tests.workers import close_gate, open_gate

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.worker_app:jobs"

Conn = psycopg.Connection[Any]


# -- helpers ------------------------------------------------------------------------------


def enqueue(conn: Conn, job_type: str, payload: Any = None, **kwargs: Any) -> int:
    return enqueue_job(conn, enqueue_call(job_type, payload, **kwargs))


def get(conn: Conn, job_id: int) -> JobRow:
    row = run(conn, get_job_call(job_id))
    assert row is not None, f"job {job_id} does not exist"
    return row


def statuses(conn: Conn, ids: list[int]) -> dict[int, str]:
    rows = conn.execute("SELECT id, status FROM jobtui.job WHERE id = ANY(%s)", (ids,)).fetchall()
    return {int(r[0]): str(r[1]) for r in rows}


def all_status(conn: Conn, ids: list[int], status: str) -> bool:
    found = statuses(conn, ids)
    return len(found) == len(ids) and all(s == status for s in found.values())


def runs(conn: Conn, job_id: int, event: str = "start") -> list[tuple[int, str]]:
    """(attempt, worker) of each `event` logged by the handlers of job `job_id`, in order."""
    rows = conn.execute(
        "SELECT attempt, worker FROM run_log WHERE job_id = %s AND event = %s ORDER BY id", (job_id, event)
    ).fetchall()
    return [(int(r[0]), str(r[1])) for r in rows]


def effects(conn: Conn, key: str) -> list[tuple[int, int, str]]:
    """(job_id, attempt, worker) of each time effect `key` was done."""
    rows = conn.execute("SELECT job_id, attempt, worker FROM effect_log WHERE key = %s ORDER BY id", (key,)).fetchall()
    return [(int(r[0]), int(r[1]), str(r[2])) for r in rows]


# -- crashes and leases -------------------------------------------------------------------


def test_killed_worker_job_is_reaped_and_rerun_with_its_effect_once(db: Conn, spawn: Spawn) -> None:
    a = spawn("A")
    # The first attempt does its effect, then waits at a gate that stays closed: A is killed there.
    job_id = enqueue(db, "effect", {"key": "k-kill", "hold_after": [close_gate(db)]})
    wait_until(lambda: effects(db, "k-kill"), 10, "the first attempt's effect", a.log)
    b = spawn("B")  # started after A claimed the job: only A's lease can bring it to B
    a.signal(signal.SIGKILL)
    a.wait_exit(5)

    wait_until(lambda: get(db, job_id).status == JobStatus.DONE, 15, "the job done by B", b.log)
    row = get(db, job_id)
    assert (row.attempts, row.lease_expirations, row.locked_by) == (2, 1, "B")
    assert runs(db, job_id) == [(1, "A"), (2, "B")]
    assert runs(db, job_id, "end") == [(2, "B")]
    # The second attempt found the effect recorded and did not do it again.
    assert effects(db, "k-kill") == [(job_id, 1, "A")]
    expiry = db.execute("SELECT job_id, worker, attempt, outcome FROM jobtui.lease_expiry").fetchall()
    assert expiry == [(job_id, "A", 1, "ready")]
    [entry] = row.errors
    assert (entry.kind, entry.attempt, entry.worker) == ("lease_expired", 1, "A")
    assert f"job {job_id} (effect) attempt 1: lease of worker A expired" in b.log()


def test_heartbeats_keep_a_lease_longer_than_the_lease_time(db: Conn, spawn: Spawn) -> None:
    w = spawn("W", "--concurrency", "4")
    # Lease 2s; each job runs until its lease was extended past twice that. The worker's own
    # reaper would take them back without heartbeats.
    gate = close_gate(db)
    ids = [
        enqueue(db, "effect", {"key": "k-hb-sync", "hold_after": gate}),
        enqueue(db, "effect_async", {"key": "k-hb-async", "hold_after": gate}),
    ]

    def held_past_two_leases() -> bool:
        rows = db.execute(
            "SELECT count(*) FROM jobtui.job WHERE id = ANY(%s) AND status = 'running'"
            " AND heartbeat_at > started_at + interval '4 seconds'",
            (ids,),
        ).fetchone()
        return rows is not None and rows[0] == len(ids)

    wait_until(held_past_two_leases, 15, "both leases extended past two leases", w.log)
    open_gate(db, gate)
    wait_until(lambda: all_status(db, ids, "done"), 15, "both long jobs done", w.log)
    for job_id in ids:
        row = get(db, job_id)
        assert (row.attempts, row.lease_expirations, row.errors) == (1, 0, [])
        assert runs(db, job_id) == [(1, "W")]
    assert db.execute("SELECT count(*) FROM jobtui.lease_expiry").fetchone() == (0,)
    assert len(effects(db, "k-hb-sync")) == len(effects(db, "k-hb-async")) == 1


def test_stopped_worker_loses_its_lease_and_its_late_outcome_is_rejected(db: Conn, spawn: Spawn) -> None:
    a = spawn("A")
    # The first attempt waits at a gate before its effect; the second does it at once.
    gate = close_gate(db)
    job_id = enqueue(db, "effect", {"key": "k-stop", "hold_before": [gate]})
    wait_until(lambda: runs(db, job_id), 10, "A to start the job", a.log)
    b = spawn("B")
    a.signal(signal.SIGSTOP)  # no heartbeats: the lease expires and B's reaper returns the job
    try:
        wait_until(lambda: get(db, job_id).status == JobStatus.DONE, 15, "the job done by B", b.log)
        done = get(db, job_id)
        assert (done.locked_by, done.attempts, done.lease_expirations) == ("B", 2, 1)
    finally:
        open_gate(db, gate)
        a.signal(signal.SIGCONT)
    # A wakes up past its lease: it gives the attempt up without trying to write an outcome.
    a.wait_gave_up(job_id, "effect", 15)
    row = get(db, job_id)
    assert (row.status, row.locked_by, row.attempts) == (JobStatus.DONE, "B", 2)
    assert row.finished_at == done.finished_at and row.lease_token == done.lease_token
    assert effects(db, "k-stop") == [(job_id, 2, "B")]
    assert a.proc.poll() is None, "the worker must keep running after losing a lease"


def test_sigterm_finishes_short_jobs_and_releases_long_ones(db: Conn, spawn: Spawn) -> None:
    w = spawn("W", "--concurrency", "10", "--shutdown-timeout", "2s", lease="5s")
    # The short jobs wait at a gate opened once the worker waits for them to stop.
    short_gate = close_gate(db)
    short = [
        enqueue(db, "effect", {"key": "k-short-sync", "hold_after": short_gate}),
        enqueue(db, "effect_async", {"key": "k-short-async", "hold_after": short_gate}),
    ]
    gate = close_gate(db)  # never opened: the long jobs are still at it when the worker stops
    long = [
        enqueue(db, "effect", {"key": "k-long-sync", "hold_before": gate}),
        enqueue(db, "effect_async", {"key": "k-long-async", "hold_before": gate}),
    ]
    ids = short + long
    wait_until(lambda: all(runs(db, i) for i in ids), 10, "every job to start", w.log)
    sent = time.monotonic()
    w.signal(signal.SIGTERM)
    w.wait_log("waiting up to 2s for 4 in-flight job(s)", 5)
    open_gate(db, short_gate)
    assert w.wait_exit(15) == 0, w.log()
    took = time.monotonic() - sent
    for job_id in short:
        row = get(db, job_id)
        assert (row.status, row.attempts) == (JobStatus.DONE, 1)
    for job_id in long:
        row = get(db, job_id)
        assert (row.status, row.attempts, row.locked_until) == (JobStatus.READY, 0, None)
        assert row.lease_expirations == 0 and row.last_error is None
        # The history says why the job is ready again, though nothing failed.
        assert [(e.kind, e.attempt, e.error) for e in row.errors] == [
            ("shutdown", 1, "the worker stopped before the handler finished")
        ]
    assert [len(effects(db, k)) for k in ("k-short-sync", "k-short-async", "k-long-sync", "k-long-async")] == [
        1,
        1,
        0,
        0,
    ]
    assert "released 2 unfinished job(s)" in w.log()
    # The shutdown timeout bounds the exit, even with a sync handler still waiting in its thread.
    assert took < 6, f"exit took {took:.1f}s with --shutdown-timeout 2s"


# -- connections --------------------------------------------------------------------------


def test_worker_recovers_from_terminated_connections(db: Conn, spawn: Spawn) -> None:
    w = spawn("W", "--concurrency", "5", lease="3s")
    kill_all = (
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )

    def started(ids: list[int]) -> int:
        row = db.execute("SELECT count(DISTINCT job_id) FROM run_log WHERE job_id = ANY(%s)", (ids,)).fetchone()
        return int(row[0]) if row else 0

    # A long job sleeps (holding no connection of its own) through both kills: its lease
    # needs the heartbeat connection to come back.
    long = enqueue(db, "effect_async", {"key": "k-term-long", "after": 5})
    keys = [f"k-term-{i}" for i in range(30)]
    ids = [enqueue(db, "effect", {"key": k, "after": 0.3}) for k in keys[:15]]
    # Kill once every connection of the worker is in use: jobs done, a heartbeat sent.
    wait_until(
        lambda: (
            runs(db, long, "effect")
            and sum(s == "done" for s in statuses(db, ids).values()) >= 3
            and (row := get(db, long)).heartbeat_at is not None
            and row.started_at is not None
            and row.heartbeat_at > row.started_at
        ),
        10,
        "jobs done and a heartbeat",
        w.log,
    )
    killed = db.execute(kill_all).fetchone()
    assert killed is not None and killed[0] >= 4  # at least claim, outcome, heartbeat and listen
    # More jobs while the worker reconnects, and a second kill while they run.
    ids += [enqueue(db, "effect_async", {"key": k, "after": 0.2}) for k in keys[15:]]
    wait_until(lambda: started(ids[15:]) >= 3, 15, "second batch running", w.log)
    db.execute(kill_all)

    wait_until(lambda: all_status(db, [*ids, long], "done"), 40, "every job done", w.log)
    for key in [*keys, "k-term-long"]:
        assert len(effects(db, key)) == 1, f"effect {key} done {len(effects(db, key))} times"
    row = get(db, long)
    assert (row.attempts, row.lease_expirations) == (1, 0)
    log = w.log()
    for role in ("claim", "outcome", "heartbeat", "listen"):
        assert f"{role} connection lost" in log and f"{role} connection back" in log, log
    assert w.proc.poll() is None
    # And the reconnected worker keeps taking jobs.
    late = enqueue(db, "effect_async", {"key": "k-term-late"})
    wait_until(lambda: get(db, late).status == JobStatus.DONE, 10, "a job enqueued after recovery", w.log)
    assert len(effects(db, "k-term-late")) == 1


def test_notify_wakes_an_idle_worker(db: Conn, spawn: Spawn) -> None:
    w = spawn("W", "--poll", "30s")
    wait_until(
        lambda: (
            db.execute(
                # The statement's text starts with its name.
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query ~ '^\\s*(--[^\n]*\n\\s*)*LISTEN '"
            ).fetchone()
            == (1,)
        ),
        10,
        "the worker to LISTEN",
        w.log,
    )
    after = None  # the last claim that found a job began then
    for n in range(2):
        # Idle: the claim loop found nothing and now waits for a notification or the poll.
        wait_until(lambda: _claim_idle(db, after), 10, "the worker idle", w.log)  # noqa: B023
        enqueued = time.monotonic()
        job_id = enqueue(db, "effect_async", {"key": f"k-wake-{n}"})
        wait_until(lambda: get(db, job_id).status == JobStatus.DONE, 10, "the job done", w.log)  # noqa: B023
        latency = time.monotonic() - enqueued
        row = get(db, job_id)
        assert row.started_at is not None and row.created_at is not None
        started_after = (row.started_at - row.created_at).total_seconds()
        assert started_after < 1.0 and latency < 2.0, (started_after, latency)
        after = row.started_at


# The starts of the texts of the statements of the claim connection, the claim and reaping:
# each statement sent starts with its name.
CLAIM_TEXTS = ("-- jobtui: claim_take\n", "-- jobtui: claim_reap\n")


def _claim_idle(db: Conn, after: datetime | None) -> bool:
    """Whether the worker's claim connection waits, its last statement begun later than
    `after`. The claim that took a job began at the job's started_at (its now()); a claim
    after it is the one that found nothing (the loop claims again once the handler ended)."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle'"
        " AND (starts_with(query, %s) OR starts_with(query, %s)) AND (%s::timestamptz IS NULL OR query_start > %s)",
        (*CLAIM_TEXTS, after, after),
    ).fetchone()
    return row is not None and row[0] == 1


def test_a_worker_deleting_on_complete_keeps_keyed_jobs_and_failures(db: Conn, spawn: Spawn) -> None:
    keyless = [enqueue(db, "effect_async", {"key": f"k-del-{n}"}) for n in range(30)]
    keyed = enqueue(db, "effect_async", {"key": "k-del-keyed"}, key="once-only")
    failing = enqueue(db, "boom", max_attempts=2)
    w = spawn("D", "--delete-on-complete", "--concurrency", "8")
    ids = [*keyless, keyed, failing]
    wait_until(
        lambda: (
            db.execute(
                "SELECT count(*) FROM jobtui.job WHERE id = ANY(%s) AND status IN ('ready', 'running')", (ids,)
            ).fetchone()
            == (0,)
        ),
        20,
        "the jobs to finish",
        w.log,
    )
    assert statuses(db, ids) == {keyed: "done", failing: "dead"}
    assert all(len(effects(db, f"k-del-{n}")) == 1 for n in range(30))
    tallied = db.execute("SELECT type, attempts, sum(jobs) FROM jobtui.done_tally WHERE worker = 'D' GROUP BY 1, 2")
    assert tallied.fetchall() == [("effect_async", 1, 30)]


def test_a_worker_process_collects_garbage_less_often(db: Conn, spawn: Spawn) -> None:
    job = enqueue(db, "gc_threshold")
    w = spawn("G")
    wait_until(lambda: statuses(db, [job]) == {job: "done"}, 20, "the job to run", w.log)
    event = db.execute("SELECT event FROM run_log WHERE job_id = %s", (job,)).fetchone()
    assert event == (f"gc {WORKER_GC_THRESHOLD}",)
    assert gc.get_threshold()[0] != WORKER_GC_THRESHOLD  # importing jobtui leaves it alone


# -- handler outcomes ---------------------------------------------------------------------


def test_handler_exceptions_and_timeouts(db: Conn, spawn: Spawn) -> None:
    w = spawn("W", "--concurrency", "10")
    permanent = enqueue(db, "permanent", {"why": "no such user"})
    retried = enqueue(db, "retry_later", {"retries": 2, "delay": 0.4})
    boom = enqueue(db, "boom", max_attempts=2)
    slow_async = enqueue(db, "slow_async", {"sleep": 5}, max_attempts=1)
    slow_sync = enqueue(db, "slow_sync", {"sleep": 1.5, "key": "k-too-late"}, max_attempts=1)

    def final() -> bool:
        s = statuses(db, [permanent, retried, boom, slow_async, slow_sync])
        return s == {permanent: "failed", retried: "done", boom: "dead", slow_async: "dead", slow_sync: "dead"}

    wait_until(final, 20, "every job in its final state", w.log)

    row = get(db, permanent)
    assert row.attempts == 1 and row.last_error is not None
    assert row.last_error.startswith("Permanent: cannot ever work: no such user")
    assert [(e.kind, e.attempt, e.worker) for e in row.errors] == [("permanent", 1, "W")]
    assert runs(db, permanent) == [(1, "W")]

    # Retry runs it again later without counting the attempt, and says so in the history.
    row = get(db, retried)
    assert row.attempts == 1 and row.last_error is None
    assert [(e.kind, e.attempt, e.error) for e in row.errors] == [("retry", 1, "come back later")] * 2
    assert runs(db, retried) == [(1, "W")] * 3 and runs(db, retried, "end") == [(1, "W")]
    starts = [
        r[0] for r in db.execute("SELECT at FROM run_log WHERE job_id = %s AND event = 'start' ORDER BY id", (retried,))
    ]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    assert all(g >= 0.35 for g in gaps), gaps

    # A plain exception is retried with backoff, then the job is dead after max_attempts.
    row = get(db, boom)
    assert row.attempts == 2 and row.last_error is not None
    assert row.last_error.startswith("ValueError: boom on attempt 2")
    assert [(e.kind, e.attempt, e.worker) for e in row.errors] == [("error", 1, "W"), ("error", 2, "W")]
    assert row.errors[0].error.startswith("ValueError: boom on attempt 1") and "Traceback" in row.errors[0].error
    assert runs(db, boom) == [(1, "W"), (2, "W")]
    at = [r[0] for r in db.execute("SELECT at FROM run_log WHERE job_id = %s AND event = 'start' ORDER BY id", (boom,))]
    assert (at[1] - at[0]).total_seconds() >= 0.07  # backoff base 0.1s, jitter 25%
    assert f"job {boom} (boom) is dead after 2 of 2 attempts" in w.log()

    # Over the timeout: a counted failure naming the timeout.
    for job_id in (slow_async, slow_sync):
        row = get(db, job_id)
        assert row.attempts == 1 and row.last_error is not None
        assert "timeout" in row.last_error and "0.5s" in row.last_error, row.last_error
        assert [(e.kind, e.attempt, e.worker) for e in row.errors] == [("error", 1, "W")]
        assert runs(db, job_id, "end") == []
    # The sync handler keeps running in its thread after its timeout; its late effect is refused.
    wait_until(lambda: runs(db, slow_sync, "effect refused: LeaseLost"), 10, "the late effect refused", w.log)
    assert effects(db, "k-too-late") == []
    assert w.proc.poll() is None


# -- in process -----------------------------------------------------------------------------


async def run_until(worker: Worker, awaited: list[Expectation], state: Callable[[], object]) -> None:
    """Run `worker` in this loop until every event `awaited` came (at most 15 s; `state()`
    says where the jobs were), then stop it and wait for it."""
    task: asyncio.Future[Any] = asyncio.create_task(worker.run())
    try:
        waiting: asyncio.Future[Any] = asyncio.gather(*(expected.wait(15) for expected in awaited))
        await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), f"worker stopped: {task}"
        try:
            await waiting
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {state()}") from None
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


async def test_sync_handlers_do_not_block_async_ones(db: Conn, app_dsn: str) -> None:
    jobs = Jobs()
    loop = asyncio.get_running_loop()
    sync_started = asyncio.Event()
    all_async_done = threading.Event()
    async_done: list[int] = []
    sync_saw: list[int] = []

    @jobs.handler("slow_sync")
    def slow_sync(job: Job) -> None:
        loop.call_soon_threadsafe(sync_started.set)
        # Blocks its thread until every async job finished: were the loop blocked by this
        # thread, they never would, and the wait would time out.
        all_async_done.wait(15)
        sync_saw.append(len(async_done))

    @jobs.handler("quick_async")
    async def quick_async(job: Job) -> None:
        await sync_started.wait()  # they run while the sync handler holds its thread
        async_done.append(job.id)
        if len(async_done) == 50:
            all_async_done.set()

    ids = [enqueue(db, "slow_sync")] + [enqueue(db, "quick_async", {"n": n}) for n in range(50)]
    # No scheduler and no archiver: the built-in archive job, due every minute, would be
    # counted as done too when a minute turns during the test.
    worker = Worker(
        jobs, app_dsn, concurrency=60, lease=5, poll_interval=0.2, worker_id="inproc", scheduler=False, retention=None
    )
    await run_until(worker, [worker.events.expect("completed", ids=ids)], lambda: statuses(db, ids))
    assert all_status(db, ids, "done")
    assert len(async_done) == 50
    # They ran while the sync handler was blocked in its thread, not after it.
    assert sync_saw == [50]
    assert worker.counts["done"] == 51


async def test_the_worker_tells_what_its_parts_did(db: Conn, app_dsn: str) -> None:
    jobs = Jobs()
    go_on = asyncio.Event()

    @jobs.handler("waits")
    async def waits(job: Job) -> None:
        await go_on.wait()

    ids = [enqueue(db, "waits", {"n": n}) for n in range(3)]
    worker = Worker(jobs, app_dsn, concurrency=5, lease=3, worker_id="inproc", scheduler=False, retention=None)
    claimed = worker.events.expect("claimed", ids=ids)
    beat = worker.events.expect("heartbeat", ids=ids)
    idle = worker.events.expect("idle")
    reaped = worker.events.expect("reap round")
    task = asyncio.create_task(worker.run())
    try:
        assert sorted(await claimed.wait(10)) == sorted(ids)
        await idle.wait(10)  # the claim after them found nothing
        await beat.wait(10)  # their leases, extended while the handlers wait
        assert statuses(db, ids) == dict.fromkeys(ids, "running")
        assert await reaped.wait(10) == []  # a round ran, and took back none of its own jobs
        completed = worker.events.expect("completed", ids=ids)
        go_on.set()
        await completed.wait(10)
        assert all_status(db, ids, "done")
        with pytest.raises(TimeoutError, match=r"no 'released' event for job\(s\) \[1\] within 0.01s"):
            await worker.events.expect("released", ids=[1]).wait(0.01)
        assert not worker.events.watched  # nobody waits: the parts tell nothing
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


async def test_a_bad_retry_delay_fails_its_attempt_and_the_rest_go_on(db: Conn, app_dsn: str) -> None:
    jobs = Jobs()

    @jobs.handler("bad_retry", max_attempts=1)
    async def bad_retry(job: Job) -> None:
        raise Retry(delay=math.inf)

    @jobs.handler("fine")
    async def fine(job: Job) -> None:
        """Does nothing."""

    bad = enqueue(db, "bad_retry")
    ids = [enqueue(db, "fine") for _ in range(20)]
    worker = Worker(
        jobs, app_dsn, concurrency=30, lease=5, poll_interval=0.2, worker_id="inproc", scheduler=False, retention=None
    )

    finished = [worker.events.expect("completed", ids=ids), worker.events.expect("dead", ids=[bad])]
    await run_until(worker, finished, lambda: statuses(db, [bad, *ids]))
    assert all_status(db, ids, "done") and all_status(db, [bad], "dead")
    last_error = get(db, bad).last_error
    assert last_error is not None and last_error.startswith("InvalidInput: bad delay inf"), last_error
    assert (worker.counts["done"], worker.counts["dead"], worker.in_flight) == (20, 1, {})


async def test_retry_is_bounded_and_each_one_is_in_the_history(db: Conn, app_dsn: str) -> None:
    jobs = Jobs()
    runs_seen = 0

    @jobs.handler("always_retry", max_attempts=2)
    async def always_retry(job: Job) -> None:
        nonlocal runs_seen
        runs_seen += 1
        raise Retry(reason="rate limited")

    job_id = enqueue(db, "always_retry")
    worker = Worker(
        jobs, app_dsn, concurrency=2, lease=5, poll_interval=0.05, worker_id="inproc", scheduler=False, retention=None
    )
    await run_until(worker, [worker.events.expect("dead", ids=[job_id])], lambda: statuses(db, [job_id]))
    row = get(db, job_id)
    # 25 releases in a row are not attempts; the 26th counts, and the second counted one is the last.
    assert (row.attempts, row.lease_token, runs_seen) == (2, 52, 52)
    kinds = [e.kind for e in row.errors]
    assert kinds[-26:] == ["retry"] * 25 + ["error"]  # the history keeps the newest 50
    assert all(e.error == "rate limited" for e in row.errors if e.kind == "retry")
    assert row.last_error is not None and "25 releases in a row without an attempt counted" in row.last_error


async def test_a_retry_without_delay_is_claimed_again_at_once_not_at_the_next_poll(db: Conn, app_dsn: str) -> None:
    """One slot: the handler's end frees it while the release is still to be written, so the
    claim it wakes finds the job running and nothing else; the release written wakes the
    producer again, well before its wait after that empty claim (a tenth of a 30 s poll)."""
    jobs = Jobs()
    starts: list[float] = []

    @jobs.handler("again")
    async def again(job: Job) -> None:
        starts.append(time.monotonic())
        if job.attempt == 1 and len(starts) == 1:
            await asyncio.sleep(0.2)  # the attempt's work before its Retry
            raise Retry()

    job_id = enqueue(db, "again")
    worker = Worker(
        jobs, app_dsn, concurrency=1, lease=30, poll_interval=30, worker_id="inproc", scheduler=False, retention=None
    )
    await run_until(worker, [worker.events.expect("completed", ids=[job_id])], lambda: statuses(db, [job_id]))
    assert len(starts) == 2
    # The first attempt ran 0.2 s; the second started after a claim or two, not a 3 s wait.
    assert starts[1] - starts[0] < 1.5, starts


# -- bad --app ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "app",
    [
        "tests.apps.worker_app",  # no colon
        "tests.apps.worker_app:",  # no attribute
        "tests.apps.no_such_module:jobs",
        "tests.apps.worker_app:not_jobs",  # not a Jobs registry
        "tests.apps.worker_app:missing",
    ],
)
def test_bad_app_is_one_line_error(app: str, app_dsn: str) -> None:
    proc = run_cli("worker", "--app", app, env={**os.environ, "JOBTUI_DSN": app_dsn}, timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobtui: error:"), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("def broken(:\n", "does not compile: invalid syntax at"),
        ("raise RuntimeError('no config file')\n", "raised RuntimeError: no config file"),
        ("import sys\nsys.exit(3)\n", "raised SystemExit: 3"),
        ("import jobtui\nother = jobtui.Jobs()\n", "has no attribute 'jobs'"),
    ],
    ids=["syntax-error", "raises", "exits", "no-attribute"],
)
def test_an_app_that_fails_to_import_is_one_line_error(source: str, says: str, app_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "badapp.py").write_text(source)
    env = {**os.environ, "JOBTUI_DSN": app_dsn, "PYTHONPATH": str(tmp_path)}
    proc = run_cli("worker", "--app", "badapp:jobs", env=env, timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobtui: error:") and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_app_its_handler_processes_cannot_load_is_one_line_error(app_dsn: str, tmp_path: Path) -> None:
    # It imports in the worker, not in the process pool's template (a fresh interpreter).
    (tmp_path / "halfapp.py").write_text(
        "import sys\nimport jobtui\nif 'jobtui.worker.template_process' in sys.modules:\n"
        "    raise RuntimeError('no config in this process')\n"
        "jobs = jobtui.Jobs()\njobs.handler('t')(lambda job: None)\n"
    )
    env = {**os.environ, "JOBTUI_DSN": app_dsn, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "worker", "--app", "halfapp:jobs", "--executor", "process"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("jobtui: error: the handler processes cannot load the app halfapp:jobs"), lines
    assert "raised RuntimeError: no config in this process" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_sync_handler_over_its_timeout_keeps_its_job_until_it_is_stopped(executor: str, db: Conn, spawn: Spawn) -> None:
    w = spawn("W", "--concurrency", "1", "--executor", executor)
    # The first sleeps 4 s, far past its 0.5 s timeout; the second is quick.
    runaway = enqueue(db, "slow_sync", {"sleep": 4, "key": "k-runaway"}, max_attempts=1)
    wait_until(lambda: runs(db, runaway), 10, "the runaway to start", w.log)
    began = time.monotonic()
    quick = enqueue(db, "slow_sync", {"sleep": 0.05, "key": "k-quick"}, max_attempts=1)
    wait_until(lambda: statuses(db, [runaway, quick]) == {runaway: "dead", quick: "done"}, 15, "outcomes", w.log)
    took = time.monotonic() - began
    row = get(db, runaway)
    assert row.last_error is not None and "ran over its timeout of 0.5s" in row.last_error, row.last_error
    assert effects(db, "k-quick") == [(quick, 1, "W")] and effects(db, "k-runaway") == []
    quick_started = db.execute("SELECT at FROM run_log WHERE job_id = %s AND event = 'start'", (quick,)).fetchone()
    runaway_dead = db.execute("SELECT finished_at FROM jobtui.job WHERE id = %s", (runaway,)).fetchone()
    assert quick_started is not None and runaway_dead is not None
    if executor == "thread":
        # A thread cannot be stopped: its job stays running, its slot taken, until it
        # returns; only then is the timeout written, and the next job claimed.
        assert took > 3, took
        wait_until(lambda: runs(db, runaway, "effect refused: LeaseLost"), 5, "its late effect refused", w.log)
        assert "the job stays running here until it returns" in w.log()
    else:
        # Its process is stopped within the grace; the next job runs at once.
        assert took < 3, took
        assert runs(db, runaway, "end") == [] and runs(db, runaway, "effect refused: LeaseLost") == []
    assert quick_started[0] >= runaway_dead[0]
