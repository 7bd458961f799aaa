"""The queue's measures against real PostgreSQL: `metrics.snapshot()`, the hourly summaries,
the Prometheus endpoint and the dead-letter alert (callback, NOTIFY, log line).

Each test builds its jobs with `jobtui.Client` and moves them into place with direct SQL
(statuses, run_at, finished_at, attempts, errors, expired leases), then checks every figure
exactly. Figures that depend on the clock are computed from the snapshot's own `taken_at`,
which is the now() every one of its queries used, so a minute or hour boundary passing
during a test moves the expectation with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from jobtui import Client, FailOutcome, JobStatus, NewJob
from jobtui.core import queues
from jobtui.core import scheduler as sched
from jobtui.core.maintenance import Retention, summarise_hours, sweep
from jobtui.core.registry import Job, Jobs, ScheduleSpec
from jobtui.kernel.db import Call, statements
from jobtui.kernel.donehistory import DoneHistory
from jobtui.reads.metrics import LOCK_KINDS, QueueLocked, Snapshot, snapshot
from jobtui.reads.overview import read_with_snapshot
from jobtui.service import prometheus
from jobtui.service.prometheus import serve
from jobtui.worker import Worker
from tests.waits import until, wait_until

Conn = psycopg.Connection[Any]

KEYERROR_17 = "KeyError: 'user 17'\nTraceback (most recent call last):\n  File \"app.py\", line 12, in send"
KEYERROR_42 = "KeyError: 'user 42'"
UUID_ERROR = "ValueError: no order 3f2a9c1e-4b5d-4e6f-8a7b-9c0d1e2f3a4b"
HEX_ERROR_1 = "RuntimeError: handle 0xDEADbeef closed at step 12"
HEX_ERROR_2 = "RuntimeError: handle 0x1f closed at step 7"
LONG_HEX_ERROR = "ConnectionError: session 9f86d081884c7d65 expired"
LEASE_DEAD_ERROR = (
    "lease expired: worker w<n> stopped heartbeating during attempt <n> of <n>"
    " (attempts exhausted: the job may be crashing its worker)"
)
AGE_TOLERANCE = 5.0  # seconds the database clock may move between setting up and measuring


def execute(conn: Conn, query: str, *params: Any) -> None:
    conn.execute(query, params)


def calendar_minutes_between(earlier: datetime, later: datetime) -> int:
    """How many minute starts (UTC calendar minutes) lie after `earlier`, up to `later`."""

    def minute(at: datetime) -> datetime:
        return at.astimezone(UTC).replace(second=0, microsecond=0)

    return int((minute(later) - minute(earlier)) / timedelta(minutes=1))


def finished_at(conn: Conn, ids: list[int]) -> dict[int, datetime]:
    rows = conn.execute("SELECT id, finished_at FROM jobtui.job WHERE id = ANY(%s)", (ids,)).fetchall()
    return {int(r[0]): r[1] for r in rows}


def minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def away_from_hour_boundary(conn: Conn, margin: float = 5.0) -> None:
    """Wait, by the database's clock, past the next full hour when it is less than `margin`
    seconds away, for tests whose setup and measurement must fall in the same hour."""

    def far_enough() -> bool:
        left = conn.execute("SELECT extract(epoch FROM date_trunc('hour', now()) + interval '1 hour' - now())")
        row = left.fetchone()
        assert row is not None
        return float(row[0]) >= margin

    wait_until(far_enough, margin + 30, "the next hour on the database's clock")


def make_done(conn: Conn, q: Client, job_type: str, attempts: int, ago: str) -> int:
    """A done job that used `attempts` attempts and finished `ago` (an SQL interval) ago."""
    job_id = q.enqueue(job_type)
    execute(
        conn,
        "UPDATE jobtui.job SET status = 'done', attempts = %s, finished_at = now() - %s::interval WHERE id = %s",
        attempts,
        ago,
        job_id,
    )
    return job_id


def make_finished(conn: Conn, q: Client, job_type: str, status: str, attempts: int, ago: str, error: str) -> int:
    job_id = q.enqueue(job_type)
    execute(
        conn,
        "UPDATE jobtui.job SET status = %s, attempts = %s, finished_at = now() - %s::interval, last_error = %s "
        "WHERE id = %s",
        status,
        attempts,
        ago,
        error,
        job_id,
    )
    return job_id


@dataclass
class World:
    """The ids of the jobs `build_world` made, by role."""

    running_w1: list[int]
    running_expired: int
    running_w2: int
    crash_dead: int
    crash_ready: list[int]
    ready_old: int
    done_recent: dict[int, int]  # id -> attempts, finished within the last hour
    done_old: list[int]
    keyerror: tuple[int, int]  # (user 17, user 42)
    uuid_dead: int
    hex_dead: tuple[int, int]
    long_hex_dead: int
    failed: int


def build_world(dsn: str, conn: Conn) -> World:
    """Jobs in every state, with known ages, attempts and errors:

    type    ready (due)  oldest due  running (expired)  dead  failed
    crash   2 (0)        -           0                  1     0
    email   3 (2)        ~100 s      2 (1), worker w1   3     0
    report  1 (1)        ~30 s       1 (0), worker w2   3     1
    """
    with Client(dsn) as q:
        # Leases that expired and were reaped: the job on its last attempt goes dead.
        crash_dead = q.enqueue("crash", max_attempts=1)
        crash_ready = [q.enqueue("crash", max_attempts=5), q.enqueue("crash", max_attempts=5)]
        assert {j.id for j in q.claim(["crash"], worker="w3", limit=3)} == {crash_dead, *crash_ready}
        execute(conn, "UPDATE jobtui.job SET locked_until = now() - interval '1 second' WHERE type = 'crash'")
        reaped = {r.job_id: r.status for r in q.reap()}
        assert reaped == {crash_dead: JobStatus.DEAD, crash_ready[0]: JobStatus.READY, crash_ready[1]: JobStatus.READY}
        # Back to ready, but delayed: a type with no due job has no oldest-ready age.
        execute(conn, "UPDATE jobtui.job SET run_at = now() + interval '1 hour' WHERE id = ANY(%s)", crash_ready)
        # One expiry two hours ago, one 30 hours ago (outside the per-hour window).
        execute(
            conn,
            "UPDATE jobtui.lease_expiry SET reaped_at = now() - interval '2 hours' WHERE job_id = %s",
            crash_ready[0],
        )
        execute(
            conn,
            "UPDATE jobtui.lease_expiry SET reaped_at = now() - interval '30 hours' WHERE job_id = %s",
            crash_ready[1],
        )

        # Running: two for w1 (one of them past its lease, not reaped), one for w2.
        running_w1 = [q.enqueue("email"), q.enqueue("email")]
        running_w2 = q.enqueue("report")
        assert {j.id for j in q.claim(["email"], worker="w1", limit=2)} == set(running_w1)
        assert [j.id for j in q.claim(["report"], worker="w2", limit=1)] == [running_w2]
        execute(
            conn,
            "UPDATE jobtui.job SET heartbeat_at = now() - interval '40 seconds' WHERE id = ANY(%s)",
            running_w1,
        )
        execute(conn, "UPDATE jobtui.job SET locked_until = now() - interval '5 seconds' WHERE id = %s", running_w1[1])

        # Ready: two due email jobs (100 s and 20 s late) and a delayed one; one due report.
        ready_old = q.enqueue("email")
        execute(conn, "UPDATE jobtui.job SET run_at = now() - interval '100 seconds' WHERE id = %s", ready_old)
        execute(conn, "UPDATE jobtui.job SET run_at = now() - interval '20 seconds' WHERE id = %s", q.enqueue("email"))
        q.enqueue("email", delay=3600)
        execute(conn, "UPDATE jobtui.job SET run_at = now() - interval '30 seconds' WHERE id = %s", q.enqueue("report"))

        # Done: five in the last hour (attempts 1, 1, 1, 2, 3), two before it.
        done_recent = {
            make_done(conn, q, "email", 1, "5 seconds"): 1,
            make_done(conn, q, "email", 1, "70 seconds"): 1,
            make_done(conn, q, "report", 1, "130 seconds"): 1,
            make_done(conn, q, "email", 2, "10 seconds"): 2,
            make_done(conn, q, "report", 3, "30 minutes"): 3,
        }
        done_old = [make_done(conn, q, "email", 5, "2 hours"), make_done(conn, q, "email", 1, "3 days")]

        # Dead and failed, with errors that group by fingerprint.
        k17 = make_finished(conn, q, "email", "dead", 3, "10 minutes", KEYERROR_17)
        k42 = make_finished(conn, q, "email", "dead", 4, "2 days", KEYERROR_42)
        uuid_dead = make_finished(conn, q, "email", "dead", 2, "5 minutes", UUID_ERROR)
        hex1 = make_finished(conn, q, "report", "dead", 1, "15 minutes", HEX_ERROR_1)
        hex2 = make_finished(conn, q, "report", "dead", 1, "3 hours", HEX_ERROR_2)
        long_hex = make_finished(conn, q, "report", "dead", 6, "30 minutes", LONG_HEX_ERROR)
        failed = make_finished(conn, q, "report", "failed", 1, "1 minute", "Permanent: invalid address")

    # Schedules: one that missed 7 slots while no scheduler ran, one paused.
    sched.upsert(conn, ScheduleSpec("nightly", "0 3 * * *", "report"), source="cli")
    sched.upsert(conn, ScheduleSpec("every-minute", "* * * * *", "email", offset=0.0, grace=5.0), source="cli")
    execute(
        conn,
        "UPDATE jobtui.schedule SET missed_count = 7, backfilled_count = 2, missed_slots = %s::jsonb"
        " WHERE name = 'nightly'",
        json.dumps(["2024-01-01T03:00:00+00:00", "2024-01-02T03:00:00+00:00"]),
    )
    assert sched.pause(conn, "every-minute")
    return World(
        running_w1=running_w1,
        running_expired=running_w1[1],
        running_w2=running_w2,
        crash_dead=crash_dead,
        crash_ready=crash_ready,
        ready_old=ready_old,
        done_recent=done_recent,
        done_old=done_old,
        keyerror=(k17, k42),
        uuid_dead=uuid_dead,
        hex_dead=(hex1, hex2),
        long_hex_dead=long_hex,
        failed=failed,
    )


@pytest.fixture
def world(dsn: str, conn: Conn) -> World:
    return build_world(dsn, conn)


# -- snapshot -----------------------------------------------------------------------------


def by_type(snap: Snapshot) -> dict[str, Any]:
    return {t.type: t for t in snap.by_type}


def test_counts_and_oldest_ready_age_by_type(conn: Conn, world: World) -> None:
    snap = snapshot(conn)
    types = by_type(snap)
    assert sorted(types) == ["crash", "email", "report"]
    counts = {t: (c.ready, c.ready_due, c.running, c.dead, c.failed) for t, c in types.items()}
    assert counts == {
        "crash": (2, 0, 0, 1, 0),
        "email": (3, 2, 2, 3, 0),
        "report": (1, 1, 1, 3, 1),
    }
    # Only due jobs count: crash's ready jobs are delayed, so it has no age at all.
    assert types["crash"].oldest_ready_age is None
    email_age, report_age = types["email"].oldest_ready_age, types["report"].oldest_ready_age
    assert email_age is not None and 100 <= email_age < 100 + AGE_TOLERANCE
    assert report_age is not None and 30 <= report_age < 30 + AGE_TOLERANCE
    assert snap.oldest_ready_age == email_age
    assert (snap.ready, snap.ready_due, snap.running_count, snap.dead_count, snap.failed_count) == (6, 3, 3, 7, 1)


def test_running_by_type_and_worker_counts_expired_leases(conn: Conn, world: World) -> None:
    snap = snapshot(conn)
    groups = {(g.type, g.worker): g for g in snap.running}
    assert {k: (g.jobs, g.expired) for k, g in groups.items()} == {("email", "w1"): (2, 1), ("report", "w2"): (1, 0)}
    w1_heartbeat = groups["email", "w1"].oldest_heartbeat_age
    w2_heartbeat = groups["report", "w2"].oldest_heartbeat_age
    assert w1_heartbeat is not None and 40 <= w1_heartbeat < 40 + AGE_TOLERANCE
    assert w2_heartbeat is not None and 0 <= w2_heartbeat < AGE_TOLERANCE
    assert snap.expired_leases == 1


def test_done_per_minute_and_attempts_of_the_last_hour(conn: Conn, world: World) -> None:
    snap = snapshot(conn)
    finished = finished_at(conn, list(world.done_recent) + world.done_old)
    now = snap.taken_at
    expected_minutes = [0] * 60
    for job_id in world.done_recent:
        expected_minutes[calendar_minutes_between(finished[job_id], now)] += 1
    for job_id in world.done_old:
        assert now - finished[job_id] > timedelta(hours=1)
    assert snap.done_per_minute == expected_minutes
    assert sum(snap.done_per_minute) == 5
    assert snap.done_last_minute == sum(1 for i in world.done_recent if now - finished[i] < timedelta(seconds=60))
    assert snap.attempts_last_hour["done"] == {1: 3, 2: 1, 3: 1}
    # Dead and failed jobs that finished in the last hour, by attempts: the reaped crash
    # job (1), KeyError 17 (3), the UUID one (2), a hex one (1), the long hex one (6) and
    # the failed one (1); KeyError 42 and the other hex one are older.
    assert snap.attempts_last_hour["dead_or_failed"] == {1: 3, 2: 1, 3: 1, 6: 1}
    # The same, by type: the buckets of each type add up to the figures above.
    assert snap.attempts_by_type == {
        "done": {"email": {1: 2, 2: 1}, "report": {1: 1, 3: 1}},
        "dead_or_failed": {"crash": {1: 1}, "email": {2: 1, 3: 1}, "report": {1: 2, 6: 1}},
    }


def test_lease_expirations_per_hour_total_and_recent(conn: Conn, world: World) -> None:
    snap = snapshot(conn)
    rows = conn.execute("SELECT job_id, reaped_at FROM jobtui.lease_expiry").fetchall()
    reaped = {int(job_id): at for job_id, at in rows}
    expected = [0] * 24
    for at in reaped.values():
        hours_ago = int((hour(snap.taken_at) - hour(at)).total_seconds()) // 3600
        if snap.taken_at - at < timedelta(hours=24):
            expected[hours_ago] += 1
    assert snap.lease_expiries_per_hour == expected
    assert sum(expected) == 2  # the 30-hour-old expiry is outside the window
    assert snap.lease_expiries_last_hour == expected[0]
    assert snap.lease_expirations_total == 3
    recent = [(e.job_id, e.type, e.worker, e.attempt, e.outcome) for e in snap.recent_expiries]
    assert recent == [
        (world.crash_dead, "crash", "w3", 1, "dead"),
        (world.crash_ready[0], "crash", "w3", 1, "ready"),
        (world.crash_ready[1], "crash", "w3", 1, "ready"),
    ]
    assert all(e.expired_at < e.reaped_at for e in snap.recent_expiries[:1])
    assert [e.job_id for e in snapshot(conn, recent_expiries=1).recent_expiries] == [world.crash_dead]


def test_dead_groups_by_type_and_fingerprint(conn: Conn, world: World) -> None:
    snap = snapshot(conn)
    groups = {(g.status, g.type, g.fingerprint): g for g in snap.dead}
    assert {k: g.jobs for k, g in groups.items()} == {
        ("dead", "email", "KeyError: 'user <n>'"): 2,
        ("dead", "email", "ValueError: no order <uuid>"): 1,
        ("dead", "report", "RuntimeError: handle <hex> closed at step <n>"): 2,
        ("dead", "report", "ConnectionError: session <hex> expired"): 1,
        ("failed", "report", "Permanent: invalid address"): 1,
        ("dead", "crash", LEASE_DEAD_ERROR): 1,
    }
    # The biggest groups come first.
    assert [g.jobs for g in snap.dead][:2] == [2, 2]
    k17, k42 = world.keyerror
    keyerror = groups["dead", "email", "KeyError: 'user <n>'"]
    finished = finished_at(conn, [k17, k42])
    assert (keyerror.first_seen, keyerror.last_seen) == (finished[k42], finished[k17])
    assert (keyerror.latest_job_id, keyerror.latest_attempts) == (k42, 4)
    hexes = groups["dead", "report", "RuntimeError: handle <hex> closed at step <n>"]
    assert (hexes.latest_job_id, hexes.latest_attempts) == (world.hex_dead[1], 1)


def test_missed_slots_per_schedule(conn: Conn, world: World) -> None:
    snap = snapshot(conn)
    assert [s.name for s in snap.schedules] == ["every-minute", "nightly"]
    every, nightly = snap.schedules
    assert (nightly.job_type, nightly.cron, nightly.paused, nightly.missed, nightly.skipped) == (
        "report",
        "0 3 * * *",
        False,
        7,
        0,
    )
    assert (nightly.backfilled, nightly.grace, every.backfilled, every.grace) == (2, 30.0, 0, 5.0)
    assert nightly.missed_slots == ["2024-01-01T03:00:00+00:00", "2024-01-02T03:00:00+00:00"]
    assert 0 < nightly.next_in <= 86400
    assert nightly.next_in == pytest.approx((nightly.next_run_at - snap.taken_at).total_seconds(), abs=1e-3)
    assert (every.paused, every.missed, every.missed_slots) == (True, 0, [])
    assert snap.missed_slots == 7


def test_tables_and_done_estimate(conn: Conn, world: World) -> None:
    execute(conn, "ANALYZE jobtui.job")
    snap = snapshot(conn)
    assert {t.table for t in snap.tables} >= {"job", "job_archive", "lease_expiry", "schedule", "audit", "stats_hourly"}
    job = next(t for t in snap.tables if t.table == "job")
    total = conn.execute("SELECT count(*) FROM jobtui.job").fetchone()
    assert total is not None and job.rows_estimate == total[0] == 24
    # Everything not counted exactly is done: 7 done jobs, from the planner's estimate.
    assert snap.done_estimate == 7
    data = json.loads(json.dumps(snap.to_json(), default=str))
    assert data["totals"] == {
        "ready": 6,
        "ready_due": 3,
        "ready_exact": True,
        "running": 3,
        "dead": 7,
        "failed": 1,
        "done_estimate": 7,
        "oldest_ready_age": snap.oldest_ready_age,
        "expired_leases": 1,
        "lease_expiries_last_hour": snap.lease_expiries_per_hour[0],
        "missed_slots": 7,
        "done_last_minute": snap.done_last_minute,
    }


def test_empty_queue(conn: Conn) -> None:
    snap = snapshot(conn)
    assert snap.by_type == [] and snap.running == [] and snap.dead == [] and snap.schedules == []
    assert snap.oldest_ready_age is None
    assert snap.done_per_minute == [0] * 60 and snap.lease_expiries_per_hour == [0] * 24
    assert snap.attempts_last_hour == {"done": {}} and snap.attempts_last_day == {}
    assert (snap.lease_expirations_total, snap.lock_waits, snap.done_estimate) == (0, 0, 0)
    assert snap.oldest_xact_age is None and snap.oldest_xact_pid is None


FAKE_NOW = "2024-05-01 12:05:59.7+00"


def fake_now(conn: Conn, at: str) -> None:
    """Replace the database's now() for this connection (a function earlier on the
    search_path than pg_catalog's), so a minute boundary is hit every time."""
    execute(conn, "CREATE SCHEMA IF NOT EXISTS faketime")
    execute(
        conn,
        "CREATE OR REPLACE FUNCTION faketime.now() RETURNS timestamptz LANGUAGE sql STABLE "
        f"AS $$ SELECT '{at}'::timestamptz $$",
    )
    execute(conn, "SET search_path = faketime, pg_catalog, public")


def make_done_at(conn: Conn, q: Client, attempts: int, at: str) -> int:
    job_id = q.enqueue("t")
    execute(
        conn,
        "UPDATE jobtui.job SET status = 'done', attempts = %s, finished_at = %s WHERE id = %s",
        attempts,
        at,
        job_id,
    )
    return job_id


def test_done_per_minute_counts_calendar_minutes_at_a_minute_boundary(dsn: str, conn: Conn) -> None:
    """Calendar minutes: bucket 0 is the minute now() is in; done_last_minute the 60 s before now()."""
    with Client(dsn) as q:
        expected = {
            "2024-05-01 12:05:10+00": 0,  # 49.7 s before now(), this minute
            "2024-05-01 12:04:59.9+00": 1,  # 59.8 s: the minute before, but within 60 seconds
            "2024-05-01 12:04:00+00": 1,  # 119.7 s
            "2024-05-01 12:03:59.99+00": 2,
            "2024-05-01 11:06:30+00": 59,
            "2024-05-01 11:05:59+00": None,  # before the 60 minutes shown
        }
        for attempts, at in enumerate(expected, start=1):
            make_done_at(conn, q, attempts, at)
    fake_now(conn, FAKE_NOW)
    snap = snapshot(conn)
    assert snap.taken_at.isoformat() == "2024-05-01T12:05:59.700000+00:00"
    buckets = Counter(b for b in expected.values() if b is not None)
    assert snap.done_per_minute == [buckets.get(i, 0) for i in range(60)]
    assert snap.done_last_minute == 2
    assert snap.attempts_last_hour["done"] == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1}


def tally_at(
    conn: Conn, minute: str, attempts: int, jobs: int, worker: str = "w1", span: tuple[str, str] | None = None
) -> None:
    """Jobs deleted at completion, as a deleting complete counts them (see test_queue); they
    ran from `span`'s first start to its last finish, by default the minute's first half."""
    first, last = span or (minute, f"{minute[:17]}30{minute[19:]}")
    execute(
        conn,
        "INSERT INTO jobtui.done_tally (minute, type, attempts, worker, jobs, first_started_at, last_finished_at)"
        " VALUES (%s, 't', %s, %s, %s, %s, %s)",
        minute, attempts, worker, jobs, first, last,
    )  # fmt: skip


def test_jobs_deleted_at_completion_count_in_the_done_figures(dsn: str, conn: Conn) -> None:
    """Tallied jobs add to their minute's bucket and attempts beside the done rows; in the last
    60 seconds they count by the share of their span (first start to last finish) inside them."""
    with Client(dsn) as q:
        make_done_at(conn, q, 1, "2024-05-01 12:05:10+00")
        make_done_at(conn, q, 1, "2024-05-01 12:04:30+00")
    tally_at(conn, "2024-05-01 12:05:00+00", 1, 40)  # this minute: all 40 within the last 60 s
    tally_at(conn, "2024-05-01 12:05:00+00", 2, 3, worker="w2")
    # Ran 12:04:39.9-12:04:59.9; now() - 60 s is 12:04:59.7: 0.2 s of its 20 inside, 1 job.
    tally_at(conn, "2024-05-01 12:04:00+00", 1, 100, span=("2024-05-01 12:04:39.9+00", "2024-05-01 12:04:59.9+00"))
    # Ran within the last 60 seconds although its minute mostly did not: all 10 count.
    tally_at(conn, "2024-05-01 12:04:00+00", 4, 10, span=("2024-05-01 12:04:59.8+00", "2024-05-01 12:04:59.95+00"))
    tally_at(conn, "2024-05-01 11:30:00+00", 3, 7)
    tally_at(conn, "2024-05-01 11:05:00+00", 1, 1000)  # before the 60 minutes shown
    fake_now(conn, FAKE_NOW)
    snap = snapshot(conn)
    assert snap.done_per_minute[0] == 1 + 40 + 3 and snap.done_per_minute[1] == 1 + 100 + 10
    assert snap.done_per_minute[35] == 7 and sum(snap.done_per_minute) == 162
    assert snap.attempts_last_hour["done"] == {1: 142, 2: 3, 3: 7, 4: 10}
    assert snap.done_last_minute == 1 + 40 + 3 + 1 + 10  # 12:05:10, this minute's tallies, 1 of 100, 10

    # A reader's history reads tallies as it reads done rows: the same figures as a full read.
    history = DoneHistory()
    assert snapshot(conn, history=history).done_per_minute == snap.done_per_minute
    tally_at(conn, "2024-05-01 12:06:00+00", 1, 5)
    fake_now(conn, "2024-05-01 12:06:20+00")
    warm, cold = snapshot(conn, history=history), snapshot(conn)
    assert warm.done_per_minute == cold.done_per_minute and warm.done_per_minute[0] == 5
    assert warm.done_last_minute == cold.done_last_minute


def test_a_deleting_worker_shows_in_the_throughput_and_the_hourly_summary(dsn: str, conn: Conn) -> None:
    away_from_hour_boundary(conn)
    with Client(dsn) as q:
        ids = [q.enqueue("t") for _ in range(4)]
        jobs = q.claim(["t"], worker="w1", limit=4)
        assert q.complete([j.lease for j in jobs], delete=True) == set(ids)
    snap = snapshot(conn)
    assert snap.done_per_minute[0] == 4 and snap.done_last_minute == 4
    assert snap.attempts_last_hour["done"] == {1: 4}
    # Tallies two hours ago are summarised with that hour's done rows; the prune keeps a day.
    execute(conn, "UPDATE jobtui.done_tally SET minute = date_trunc('hour', now()) - interval '2 hours'")
    tally_at(conn, "2024-05-01 12:00:00+00", 1, 9)  # long ago: pruned
    with Client(dsn) as q:
        job_id = q.enqueue("t")
    execute(
        conn,
        "UPDATE jobtui.job SET status = 'done', attempts = 1,"
        " finished_at = date_trunc('hour', now()) - interval '2 hours' + interval '5 minutes' WHERE id = %s",
        job_id,
    )
    assert summarise_hours(conn) == 24
    assert snapshot(conn).attempts_last_day == {"done": {1: 5}}
    minutes = conn.execute("SELECT count(*), sum(jobs) FROM jobtui.done_tally").fetchone()
    assert minutes == (1, 4)


def test_a_done_history_rereads_only_the_unsettled_minutes(dsn: str, conn: Conn) -> None:
    """A reader's DoneHistory keeps the minutes that ended over UNSETTLED_MINUTES ago and reads
    only the later ones: the same figures as a full read, minus a row written into a settled
    minute behind its back (which is how the test sees that settled minutes are not read)."""
    with Client(dsn) as q:
        make_done_at(conn, q, 1, "2024-05-01 11:10:00+00")
        make_done_at(conn, q, 2, "2024-05-01 11:59:30+00")
        make_done_at(conn, q, 1, "2024-05-01 12:05:10+00")
        fake_now(conn, FAKE_NOW)
        history = DoneHistory()
        first = snapshot(conn, history=history)
        assert first.done_per_minute == snapshot(conn).done_per_minute
        assert history.read_from == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

        make_done_at(conn, q, 3, "2024-05-01 12:06:20+00")  # a new minute
        make_done_at(conn, q, 1, "2024-05-01 12:01:00+00")  # unsettled when first was taken: read again
        make_done_at(conn, q, 1, "2024-05-01 11:30:00+00")  # settled: not read again
    fake_now(conn, "2024-05-01 12:07:00.5+00")
    warm, cold = snapshot(conn, history=history), snapshot(conn)
    behind_its_back = 37  # 11:30 is 37 minutes before 12:07
    assert cold.done_per_minute[behind_its_back] == 1 and warm.done_per_minute[behind_its_back] == 0
    cold_minutes = list(cold.done_per_minute)
    cold_minutes[behind_its_back] = 0
    assert warm.done_per_minute == cold_minutes
    assert sum(warm.done_per_minute) == 5 and warm.done_per_minute[57] == 1  # 11:10 still shown
    assert warm.attempts_last_hour["done"] == {1: 3, 2: 1, 3: 1}
    assert warm.done_last_minute == cold.done_last_minute == 1  # 12:06:20

    fake_now(conn, "2024-05-01 12:10:30+00")  # 11:10 leaves the hour shown
    later = snapshot(conn, history=history)
    assert sum(later.done_per_minute) == 4 and later.attempts_last_hour["done"] == {1: 2, 2: 1, 3: 1}


# -- locks and transactions ---------------------------------------------------------------


def _blocked_session(dsn: str, statement: str, started: threading.Event, errors: list[BaseException]) -> None:
    try:
        with psycopg.connect(dsn, autocommit=True) as blocked:
            started.set()
            blocked.execute(statement)
    except BaseException as exc:  # reported to the test
        errors.append(exc)


def _wait_until_waiting(conn: Conn, count: int) -> None:
    """Wait until `count` locks are waited for by sessions of this database (a transaction
    id's lock names no database, so the sessions say whose it is)."""

    def waiting() -> bool:
        return len(_waiting_kinds(conn)) >= count

    wait_until(waiting, 30, f"{count} session(s) waiting for a lock")


def _waited(conn: Conn, seconds: float) -> None:
    """Wait until every session waiting for a lock in this database has waited `seconds`, by
    the database's clock, reckoned as the snapshot reckons it."""

    def long_enough() -> bool:
        row = conn.execute(
            "SELECT coalesce(bool_and(clock_timestamp() - coalesce(l.waitstart, a.query_start)"
            " >= make_interval(secs => %s)), false)"
            " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND a.datname = current_database()",
            (seconds,),
        ).fetchone()
        return row is not None and bool(row[0])

    wait_until(long_enough, seconds + 30, f"the lock waits to last {seconds}s")


def test_lock_waits(dsn: str, conn: Conn, holder: Conn) -> None:
    with Client(dsn) as q:
        job_id = q.enqueue("t")
    # SHARE blocks writers (an UPDATE waits) but not readers, so the snapshot itself runs.
    holder.execute("LOCK TABLE jobtui.job IN SHARE MODE")
    started, errors = threading.Event(), list[BaseException]()
    thread = threading.Thread(
        target=_blocked_session,
        args=(dsn, f"UPDATE jobtui.job SET payload = '{{}}' WHERE id = {job_id}", started, errors),
    )
    thread.start()
    try:
        _wait_until_waiting(conn, 1)
        _waited(conn, 0.2)
        snap = snapshot(conn)
        assert snap.lock_waits == 1
        assert 0.2 <= snap.longest_lock_wait < 10
        assert snap.lock_waits_by_kind["relation"] == 1  # LOCK TABLE: a wait for the table itself
        # The lock holder's transaction is the oldest open one.
        assert snap.oldest_xact_pid == holder.info.backend_pid
    finally:
        holder.rollback()
        thread.join(10)
    assert not errors and not thread.is_alive()
    assert snapshot(conn).lock_waits == 0


def _waiting_kinds(conn: Conn) -> list[str]:
    rows = conn.execute(
        "SELECT l.locktype FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE NOT l.granted AND a.datname = current_database() ORDER BY 1"
    ).fetchall()
    return [str(r[0]) for r in rows]


def test_row_lock_waits_are_counted_by_kind(dsn: str, conn: Conn, holder: Conn) -> None:
    """A job row held FOR UPDATE in an open transaction: the next session wanting the row
    waits for the holder's transaction id, the one after it for the row's tuple lock. Neither
    lock names the job table; both waits are counted, each with its kind and its duration."""
    with Client(dsn) as q:
        job_id = q.enqueue("t")
    # An application table in the same database: a row lock there is not jobtui's business.
    conn.execute("CREATE TABLE app_orders (id int PRIMARY KEY)")
    conn.execute("INSERT INTO app_orders VALUES (1)")
    assert holder.execute("SELECT id FROM jobtui.job WHERE id = %s FOR UPDATE", (job_id,)).fetchall() == [(job_id,)]
    holder.execute("SELECT id FROM app_orders WHERE id = 1 FOR UPDATE")
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []
    statements = [
        f"SELECT id FROM jobtui.job WHERE id = {job_id} FOR UPDATE",
        f"UPDATE jobtui.job SET payload = '{{}}' WHERE id = {job_id}",
        "UPDATE app_orders SET id = 1 WHERE id = 1",
    ]
    try:
        for n, statement in enumerate(statements, start=1):
            started = threading.Event()
            thread = threading.Thread(target=_blocked_session, args=(dsn, statement, started, errors))
            thread.start()
            threads.append(thread)
            # One at a time: the second job session queues behind the first.
            _wait_until_waiting(conn, n)
        assert _waiting_kinds(conn) == ["transactionid", "transactionid", "tuple"]
        _waited(conn, 0.3)
        snap = snapshot(conn)
        assert snap.lock_waits == 2, snap.lock_waits_by_kind  # the app table's wait is left out
        assert snap.lock_waits_by_kind == {
            "relation": 0, "transactionid": 1, "tuple": 1, "advisory": 0, "queue_limit": 0, "rate_limit": 0,
            "other": 0,
        }  # fmt: skip
        longest = snap.longest_lock_wait_by_kind
        assert 0.3 <= longest["tuple"] <= longest["transactionid"] < 10, longest
        assert longest["relation"] == longest["advisory"] == longest["other"] == 0
        assert snap.longest_lock_wait == longest["transactionid"]
        stats = snap.to_json()
        assert stats["lock_waits_by_kind"]["transactionid"] == 1
    finally:
        holder.rollback()
        for thread in threads:
            thread.join(10)
    assert not errors and not any(t.is_alive() for t in threads)
    after = snapshot(conn)
    assert after.lock_waits == 0 and set(after.lock_waits_by_kind.values()) == {0}


def test_a_migration_waiting_for_another_is_an_advisory_lock_wait(dsn: str, conn: Conn, holder: Conn) -> None:
    from jobtui.kernel.migrate import _lock_key, migrate

    holder.execute("SELECT pg_advisory_lock(%s)", (_lock_key("jobtui"),))
    started, errors = threading.Event(), list[BaseException]()
    thread = threading.Thread(
        target=_blocked_session, args=(dsn, f"SELECT pg_advisory_lock({_lock_key('jobtui')})", started, errors)
    )
    thread.start()
    try:
        _wait_until_waiting(conn, 1)
        snap = snapshot(conn)
        assert (snap.lock_waits, snap.lock_waits_by_kind["advisory"]) == (1, 1)
        # For another schema's tables, this migration lock is not theirs.
        migrate(conn, "jobtui_other")
        assert snapshot(conn, "jobtui_other").lock_waits == 0
    finally:
        holder.execute("SELECT pg_advisory_unlock_all()")
        holder.rollback()
        thread.join(10)
    assert not errors and not thread.is_alive()


def _calm_lock_waits(conn: Conn) -> tuple[Snapshot, dict[str, float]]:
    """A snapshot, none of whose lock waits is alarming, and the lock waits by kind that
    Prometheus is given of it."""
    snap = snapshot(conn)
    assert snap.alarming_lock_waits == 0
    families = {m.name: m for m in prometheus.families(snap)}
    return snap, {s.labels["kind"]: s.value for s in families["jobtui_lock_waits"].samples}


def test_a_claim_waiting_its_turn_under_a_queue_limit_is_its_own_kind(dsn: str, conn: Conn, holder: Conn) -> None:
    """claim_limited counts a limited queue's running jobs under a lock the claims of that queue
    take in turn: the next claim waits for it. That wait is the limit at work, not an alarm."""
    from jobtui.core.claims import claim_call
    from jobtui.kernel.db import run

    with Client(dsn) as q:
        q.enqueue_many([NewJob("t", {}, queue="lim") for _ in range(4)])
    queues.set_limit(conn, "lim", 2, actor="olga")
    claim = claim_call(["t"], worker="w1", limit=1, queue="lim")
    assert len(run(holder, claim)) == 1  # the holder's claim keeps the queue's lock until it commits
    errors = list[BaseException]()
    statement = statements("jobtui")["claim_take"].as_string(None)
    params = {**claim.params, "worker": "w2"}
    thread = threading.Thread(target=_blocked_claim, args=(dsn, statement, params, errors))
    thread.start()
    try:
        _wait_until_waiting(conn, 1)
        snap, waits = _calm_lock_waits(conn)
        kinds = snap.lock_waits_by_kind
        assert (snap.lock_waits, kinds["queue_limit"], kinds["advisory"]) == (1, 1, 0)
        assert waits["queue_limit"] == 1 and waits["advisory"] == 0
    finally:
        holder.rollback()
        thread.join(10)
    assert not errors and not thread.is_alive()


def test_claims_taking_their_turn_at_a_rates_bucket_are_their_own_kind(dsn: str, conn: Conn, holder: Conn) -> None:
    """claim_rated locks a rated type's token bucket until its claim commits: the next claims of
    that type wait for it, the first for the holder's transaction, the others for the row's
    tuple. Those waits are the rate at work, not an alarm."""
    from jobtui.core.claims import claim_call
    from jobtui.kernel.db import run

    with Client(dsn) as q:
        q.enqueue_many([NewJob("t", {}) for _ in range(6)])
    queues.set_rate(conn, "type", "t", 1000.0, actor="olga")
    claim = claim_call(["t"], worker="w1", limit=1)
    assert len(run(holder, claim)) == 1  # the holder's claim keeps the bucket's row until it commits
    errors = list[BaseException]()
    statement = statements("jobtui")["claim_take"].as_string(None)
    threads = []
    for worker in ("w2", "w3"):
        thread = threading.Thread(
            target=_blocked_claim, args=(dsn, statement, {**claim.params, "worker": worker}, errors)
        )
        thread.start()
        threads.append(thread)
        _wait_until_waiting(conn, len(threads))
    try:
        assert _waiting_kinds(conn) == ["transactionid", "tuple"]
        snap, waits = _calm_lock_waits(conn)
        kinds = snap.lock_waits_by_kind
        assert (snap.lock_waits, kinds["rate_limit"], kinds["transactionid"], kinds["tuple"]) == (2, 2, 0, 0), kinds
        assert waits["rate_limit"] == 2 and waits["transactionid"] == 0
    finally:
        holder.rollback()
        for thread in threads:
            thread.join(10)
    assert not errors and not any(t.is_alive() for t in threads)


def _blocked_claim(dsn: str, statement: str, params: dict[str, Any], errors: list[BaseException]) -> None:
    try:
        with psycopg.connect(dsn, autocommit=True) as blocked:
            blocked.execute(statement, params, binary=True)
    except BaseException as exc:  # reported to the test
        errors.append(exc)


@contextmanager
def locked_out(dsn: str, conn: Conn, holder: Conn) -> Iterator[None]:
    """The job table held in ACCESS EXCLUSIVE mode by `holder`'s open transaction, with a
    reader queued behind it, as an ALTER TABLE or VACUUM FULL stuck behind a long transaction
    leaves every reader; released at the end, the queued reader finished."""
    holder.execute("LOCK TABLE jobtui.job IN ACCESS EXCLUSIVE MODE")
    started, errors = threading.Event(), list[BaseException]()
    thread = threading.Thread(target=_blocked_session, args=(dsn, "SELECT count(*) FROM jobtui.job", started, errors))
    thread.start()
    try:
        _wait_until_waiting(conn, 1)
        yield
    finally:
        holder.rollback()
        thread.join(10)
    assert not errors and not thread.is_alive()


def test_snapshot_gives_up_behind_an_access_exclusive_lock(dsn: str, conn: Conn, holder: Conn) -> None:
    """An ALTER TABLE or VACUUM FULL stuck behind a long transaction blocks every reader:
    the snapshot says so after its lock timeout instead of waiting with them."""
    with locked_out(dsn, conn, holder):
        began = time.monotonic()
        with pytest.raises(QueueLocked) as caught:
            snapshot(conn, lock_timeout=0.3)
        assert time.monotonic() - began < 5
        message = str(caught.value)
        assert "stayed locked for over 0.3s: 1 session(s) wait for locks on it" in message
        assert f"the oldest open transaction is pid {holder.info.backend_pid}" in message
    # The connection is usable again and the lock timeout did not outlive the snapshot.
    assert snapshot(conn).lock_waits == 0
    row = conn.execute("SHOW lock_timeout").fetchone()
    assert row is not None and row[0] == "0"


def test_the_overview_and_snapshot_together_give_up_behind_the_lock_too(dsn: str, conn: Conn, holder: Conn) -> None:
    """What the console, `stats`, `why` and the scrape read (the queue overview, then the
    snapshot) says QueueLocked as the snapshot alone does, not a bare lock timeout."""
    with locked_out(dsn, conn, holder), pytest.raises(QueueLocked) as caught:
        read_with_snapshot(conn)
    assert "1 session(s) wait for locks on it" in str(caught.value), caught.value
    assert f"the oldest open transaction is pid {holder.info.backend_pid}" in str(caught.value)
    view, snap = read_with_snapshot(conn)
    assert view.counted and snap.lock_waits == 0


@pytest.mark.parametrize("isolation", [psycopg.IsolationLevel.READ_COMMITTED, psycopg.IsolationLevel.REPEATABLE_READ])
def test_oldest_transaction_after_a_select(dsn: str, conn: Conn, isolation: psycopg.IsolationLevel) -> None:
    assert snapshot(conn).oldest_xact_age is None
    with psycopg.connect(dsn) as other:
        other.isolation_level = isolation
        other.execute("SELECT count(*) FROM jobtui.job").fetchall()
        pid = other.info.backend_pid
        aged = "SELECT now() - xact_start >= interval '0.3 seconds' FROM pg_stat_activity WHERE pid = %s"
        wait_until(lambda: conn.execute(aged, (pid,)).fetchone() == (True,), 30, "the transaction 0.3s old")
        snap = snapshot(conn)
        assert snap.oldest_xact_pid == other.info.backend_pid
        assert snap.oldest_xact_age is not None and 0.3 <= snap.oldest_xact_age < 10
        other.rollback()
    assert snapshot(conn).oldest_xact_age is None


def test_oldest_transaction_that_wrote(dsn: str, conn: Conn) -> None:
    """Idle after an UPDATE (READ COMMITTED): no snapshot, but its transaction id holds
    back vacuum."""
    with Client(dsn) as q:
        job_id = q.enqueue("t")
    with psycopg.connect(dsn) as other:
        other.execute("UPDATE jobtui.job SET payload = '{\"x\": 1}' WHERE id = %s", (job_id,))
        snap = snapshot(conn)
        assert snap.oldest_xact_pid == other.info.backend_pid
        other.rollback()
    assert snapshot(conn).oldest_xact_pid is None


# -- hourly summaries ---------------------------------------------------------------------


def test_summarised_hours_give_the_day_distribution_and_survive_archiving(dsn: str, conn: Conn) -> None:
    away_from_hour_boundary(conn)
    hour_ago = "date_trunc('hour', now()) - interval '{} hours' + interval '{} minutes'"
    with Client(dsn) as q:
        placed = [
            ("done", 1, hour_ago.format(2, 10)),
            ("done", 1, hour_ago.format(2, 50)),
            ("done", 2, hour_ago.format(3, 5)),
            ("done", 4, "now() - interval '30 hours'"),  # older than the day
            ("done", 1, "now()"),  # this hour is not complete yet
            ("dead", 3, hour_ago.format(2, 20)),
            ("failed", 1, hour_ago.format(5, 0)),
        ]
        for status, attempts, at in placed:
            job_id = q.enqueue("t")
            execute(
                conn,
                f"UPDATE jobtui.job SET status = %s, attempts = %s, finished_at = {at} WHERE id = %s",
                status,
                attempts,
                job_id,
            )
    assert snapshot(conn).attempts_last_day == {}
    assert summarise_hours(conn) == 24
    day = {"done": {1: 2, 2: 1}, "dead": {3: 1}, "failed": {1: 1}}
    assert snapshot(conn).attempts_last_day == day
    # Each hour is summarised once: a second run adds nothing.
    assert summarise_hours(conn) == 0
    assert snapshot(conn).attempts_last_day == day
    # Archiving removes the done rows older than an hour; the day's figures stay.
    swept = sweep(conn, Retention(done=3600, dead=30 * 86400, archive=None))
    assert (swept.archived, swept.deleted_done, swept.deleted_dead, swept.deleted_archive) == (4, 0, 0, 0)
    assert snapshot(conn).attempts_last_day == day
    row = conn.execute("SELECT count(*) FROM jobtui.job WHERE status = 'done'").fetchone()
    assert row is not None and row[0] == 1


# -- Prometheus ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of http://127.0.0.1:PORT/metrics, by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return samples


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


@pytest.fixture
def metrics_server(dsn: str) -> Iterator[int]:
    port = free_port()
    server = serve(dsn, port, addr="127.0.0.1")
    yield port
    server.shutdown()
    server.server_close()


def test_prometheus_endpoint(dsn: str, conn: Conn, world: World, metrics_server: int) -> None:
    samples = scrape(metrics_server)
    assert samples["jobtui_up", ()] == 1
    age = samples["jobtui_oldest_ready_age_seconds", (("type", "email"),)]
    assert 100 <= age < 100 + AGE_TOLERANCE
    assert samples["jobtui_oldest_ready_age_seconds", (("type", "crash"),)] == 0
    assert samples["jobtui_oldest_ready_age_max_seconds", ()] == age
    jobs = {labels: v for (name, labels), v in samples.items() if name == "jobtui_jobs"}
    assert jobs == {
        (("status", status), ("type", job_type)): float(n)
        for job_type, figures in {"crash": (2, 0, 1, 0), "email": (3, 2, 3, 0), "report": (1, 1, 3, 1)}.items()
        for status, n in zip(("ready", "running", "dead", "failed"), figures, strict=True)
    }
    assert samples["jobtui_lease_expirations_total", ()] == 3
    assert samples["jobtui_expired_leases", ()] == 1
    assert samples["jobtui_missed_slots_total", (("schedule", "nightly"),)] == 7
    assert samples["jobtui_missed_slots_total", (("schedule", "every-minute"),)] == 0
    assert samples["jobtui_backfilled_slots_total", (("schedule", "nightly"),)] == 2
    assert samples["jobtui_schedule_paused", (("schedule", "every-minute"),)] == 1
    attempts = {
        (dict(labels)["status"], dict(labels)["type"], dict(labels)["attempts"]): v
        for (name, labels), v in samples.items()
        if name == "jobtui_jobs_finished_last_hour"
    }
    assert attempts == {
        ("done", "email", "1"): 2,
        ("done", "email", "2"): 1,
        ("done", "report", "1"): 1,
        ("done", "report", "3"): 1,
        ("dead_or_failed", "crash", "1"): 1,
        ("dead_or_failed", "email", "2"): 1,
        ("dead_or_failed", "email", "3"): 1,
        ("dead_or_failed", "report", "1"): 2,
        ("dead_or_failed", "report", "6"): 1,
    }
    for kind in LOCK_KINDS:
        assert samples["jobtui_lock_waits", (("kind", kind),)] == 0
        assert samples["jobtui_lock_wait_longest_seconds", (("kind", kind),)] == 0
    assert ("jobtui_table_dead_tuples", (("table", "job"),)) in samples
    # The exposition's own lines, as Prometheus reads them.
    text = scrape_text(metrics_server)
    for line in (
        'jobtui_jobs{status="dead",type="email"} 3.0',
        'jobtui_jobs{status="failed",type="report"} 1.0',
        "jobtui_lease_expirations_total 3.0",
        'jobtui_missed_slots_total{schedule="nightly"} 7.0',
        "jobtui_up 1.0",
    ):
        assert line in text.splitlines()
    # The help of the lock waits names every kind they are counted by.
    [help_line] = [h for h in text.splitlines() if h.startswith("# HELP jobtui_lock_waits ")]
    assert all(kind in help_line for kind in LOCK_KINDS), help_line


def test_prometheus_labels_jobs_by_queue_and_says_what_is_paused(dsn: str, conn: Conn, metrics_server: int) -> None:
    with Client(dsn) as q:
        q.enqueue("t", queue="mail")
        q.enqueue("t", queue="mail")
        q.enqueue("u")
    queues.pause(conn, "queue", "mail", actor="op")
    queues.set_limit(conn, "default", 4, actor="op")
    samples = scrape(metrics_server)
    assert samples["jobtui_queue_jobs", (("queue", "mail"), ("status", "ready"))] == 2
    assert samples["jobtui_queue_jobs", (("queue", "default"), ("status", "ready"))] == 1
    assert samples["jobtui_queue_oldest_ready_age_seconds", (("queue", "mail"),)] >= 0
    assert samples["jobtui_queue_limit", (("queue", "default"),)] == 4
    assert ("jobtui_queue_limit", (("queue", "mail"),)) not in samples
    assert samples["jobtui_paused", (("kind", "queue"), ("name", "mail"))] == 1
    assert samples["jobtui_paused", (("kind", "type"), ("name", "t"))] == 0


def test_prometheus_labels_show_the_databases_text_without_terminal_escapes(dsn: str, metrics_server: int) -> None:
    """A type, queue or schedule name is the database's text, and `curl /metrics` prints it:
    no control or format character reaches the exposition raw; each is a visible escape, as
    the console shows it."""
    hostile_type, hostile_queue = "evil\x1b]0;pwned\x07\x1b[2J\u202e", "q\x9b31mred"
    with Client(dsn) as q:
        q.enqueue(hostile_type, queue=hostile_queue)
        # A name that holds a backslash and the characters of an escape keeps a label of its own.
        q.enqueue("mail\x1bsend")
        q.enqueue("mail\\x1bsend")
        q.enqueue("mail\\x1bsend")
    text = scrape_text(metrics_server)
    assert not any(ch in text for ch in "\x1b\x07\x9b\u202e"), [line for line in text.splitlines() if "evil" in line]
    samples = scrape(metrics_server)
    assert samples["jobtui_jobs", (("status", "ready"), ("type", "evil\\x1b]0;pwned\\x07\\x1b[2J\\u202e"))] == 1
    assert samples["jobtui_queue_jobs", (("queue", "q\\x9b31mred"), ("status", "ready"))] == 1
    assert samples["jobtui_jobs", (("status", "ready"), ("type", "mail\\x1bsend"))] == 1
    assert samples["jobtui_jobs", (("status", "ready"), ("type", "mail\\\\x1bsend"))] == 2
    series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(series) == len(set(series)), "two series share their name and labels"


def test_prometheus_scrapes_within_a_second_share_one_snapshot(
    dsn: str, metrics_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three seconds, not one: on a loaded machine two scrapes may come more than a second apart.
    monkeypatch.setattr(prometheus, "CACHE_SECONDS", 3.0)
    ready = ("jobtui_jobs", (("status", "ready"), ("type", "t")))
    with Client(dsn) as q:
        q.enqueue("t")
        shown = time.monotonic()
        first = scrape(metrics_server)[ready]
        q.enqueue("t")
        assert scrape(metrics_server)[ready] == first == 1
        assert time.monotonic() - shown < 3.0, "the second scrape came too late to share the snapshot"
        # The snapshot ages out: a later scrape takes a new one.
        wait_until(lambda: scrape(metrics_server)[ready] == 2, 30, "a scrape of a new snapshot")


def test_prometheus_answers_when_the_database_does_not() -> None:
    port = free_port()
    server = serve("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=3", port, addr="127.0.0.1")
    try:
        samples = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    assert samples[("jobtui_up", ())] == 0
    assert not any(name.startswith("jobtui_jobs") for name, _ in samples)


# -- dead-letter alert --------------------------------------------------------------------


async def _listen_dead(dsn: str) -> psycopg.AsyncConnection[Any]:
    listener = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier("jobtui.dead")))
    return listener


async def _notifications(listener: psycopg.AsyncConnection[Any], n: int) -> list[Any]:
    got = []
    async for notify in listener.notifies(timeout=15, stop_after=n):
        got.append(notify)
    return got


def _alert_jobs(seen: list[FailOutcome]) -> Jobs:
    jobs = Jobs()

    @jobs.handler("alert.fail", max_attempts=1)
    def fail(job: Job) -> None:
        raise RuntimeError(f"payment 42 declined for order {job.payload['order']}")

    @jobs.handler("alert.crash")
    def never(job: Job) -> None:  # its job is claimed by a worker that then vanishes
        raise AssertionError("not run")

    @jobs.on_dead
    def broken(outcome: FailOutcome) -> None:
        raise ValueError("a callback that fails must not stop the others or the worker")

    jobs.on_dead(seen.append)
    return jobs


async def _dead_notice(worker: Worker, listener: psycopg.AsyncConnection[Any], seen: list[FailOutcome]) -> Any:
    """Run `worker` until the dead notice arrives on `listener` and the on_dead callback ran;
    the notice's payload."""
    task = asyncio.create_task(worker.run())
    try:
        [notify] = await _notifications(listener, 1)
        await until(lambda: seen, 30, "the on_dead callback")
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)
        await listener.close()
    assert notify.channel == "jobtui.dead"
    return json.loads(notify.payload)


async def test_dead_letter_alert_when_the_last_attempt_fails(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobtui.worker")
    seen: list[FailOutcome] = []
    listener = await _listen_dead(dsn)
    worker = Worker(_alert_jobs(seen), dsn, concurrency=2, scheduler=False, retention=None, poll_interval=0.1)
    with Client(dsn) as q:
        job_id = q.enqueue("alert.fail", {"order": 7}, max_attempts=1)
    assert await _dead_notice(worker, listener, seen) == {
        "id": job_id,
        "type": "alert.fail",
        "attempts": 1,
        "error": "RuntimeError: payment 42 declined for order 7",
    }
    assert seen == [FailOutcome(job_id, JobStatus.DEAD, "alert.fail", 1, 1, worker.worker_id, "default")]
    errors = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "jobtui.worker" and r.levelno >= 40]
    assert ("ERROR", f"job {job_id} (alert.fail) is dead after 1 of 1 attempts") in errors
    assert ("ERROR", f"on_dead callback failed for job {job_id}") in errors
    assert worker.counts["dead"] == 1
    with Client(dsn) as q:
        row = q.get(job_id)
    assert row is not None and row.status is JobStatus.DEAD


async def test_dead_letter_alert_when_the_reaper_ends_a_crash_loop(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobtui.worker")
    seen: list[FailOutcome] = []
    listener = await _listen_dead(dsn)
    with Client(dsn) as q:
        job_id = q.enqueue("alert.crash", max_attempts=1)
        [claimed] = q.claim(["alert.crash"], worker="ghost", limit=1)
        assert claimed.id == job_id
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("UPDATE jobtui.job SET locked_until = now() - interval '1 second' WHERE id = %s", (job_id,))
    worker = Worker(_alert_jobs(seen), dsn, scheduler=False, retention=None, poll_interval=0.1, reap_interval=0.1)
    assert await _dead_notice(worker, listener, seen) == {
        "id": job_id,
        "type": "alert.crash",
        "attempts": 1,
        "error": "lease expired: worker ghost stopped heartbeating during attempt 1 of 1"
        " (attempts exhausted: the job may be crashing its worker)",
    }
    assert seen == [FailOutcome(job_id, JobStatus.DEAD, "alert.crash", 1, 1, "ghost", "default")]
    messages = [r.getMessage() for r in caplog.records if r.name == "jobtui.worker" and r.levelname == "ERROR"]
    assert f"job {job_id} (alert.crash) is dead after 1 of 1 attempts" in messages


def test_reaper_dead_notifies_without_a_worker(dsn: str) -> None:
    """`Client.reap` (any reaper) sends the alert: the trigger, not the worker, sends it."""
    with psycopg.connect(dsn, autocommit=True) as listener, Client(dsn) as q:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier("jobtui.dead")))
        dead = q.enqueue("crash", max_attempts=1)
        retry = q.enqueue("crash", max_attempts=2)
        q.claim(["crash"], worker="w9", limit=2)
        listener.execute("UPDATE jobtui.job SET locked_until = now() - interval '1 second'")
        assert {r.job_id: r.status for r in q.reap()} == {dead: JobStatus.DEAD, retry: JobStatus.READY}
        # A marker sent after the reap committed: every alert of the reap arrives before it.
        q.run(Call("job_notify_ready", {"channel": "jobtui.dead"}, lambda rows: None))
        got = list(listener.notifies(timeout=10, stop_after=2))
    assert [n.payload and json.loads(n.payload)["id"] for n in got] == [dead, ""]
