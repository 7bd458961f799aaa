"""A real database with known jobs for the console's pilot tests, and polling helpers.

`seed(dsn)` makes, through jobtui.Client, the scheduler API and plain SQL:

    ready      email.send x4 due, x2 delayed; sms.send x1 due
    running    report.build x2 on worker-a:1 (long leases); image.resize x1 on ghost:9 whose
               lease expired 30 s ago
    dead       invoice.render x3 "KeyError: customer <n> has no billing address"
               webhook.deliver x2 "ConnectionError: ... reset by peer"
    failed     invoice.render x1 "Permanent: currency XYZ ..."
    schedules  hourly.ping (email.send, 0 * * * *), nightly.report (report.build, 0 3 * * *)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from jobtui.clients.client import Client
from jobtui.core import scheduler
from jobtui.core.registry import ScheduleSpec
from jobtui.kernel.domain import NewJob

BILLING = "KeyError: customer <n> has no billing address"
RESET = "ConnectionError: POST https://hooks.example.com/<n>: connection reset by peer"


@dataclass
class Seeded:
    ready: list[int]
    delayed: list[int]
    sms: int
    running: list[int]  # report.build on worker-a:1, lease held
    expired: int  # image.resize on ghost:9, lease expired
    dead_billing: list[int]
    dead_reset: list[int]
    failed: int


def _dead(conn: psycopg.Connection[Any], job_type: str, error: str, status: str = "dead", attempts: int = 3) -> int:
    row = conn.execute(
        """
        INSERT INTO jobtui.job (type, payload, status, attempts, max_attempts, locked_by, last_error,
                                started_at, finished_at)
        VALUES (%s, '{}', %s, %s, %s, 'worker-b:2', %s, now() - interval '2 min', now() - interval '1 min')
        RETURNING id
        """,
        (job_type, status, attempts, attempts, error),
    ).fetchone()
    assert row is not None
    return int(row[0])


def seed(dsn: str) -> Seeded:
    with Client(dsn, max_connections=1) as queue:
        ready = queue.enqueue_many([NewJob("email.send", {"to": f"user{i}@example.com"}) for i in range(4)])
        delayed = queue.enqueue_many([NewJob("email.send", {"to": "later@example.com"}, delay=3600)] * 2)
        sms = queue.enqueue("sms.send", {"to": "+15550100"})
        running = queue.enqueue_many([NewJob("report.build", {"seconds": 30})] * 2)
        assert {c.id for c in queue.claim(["report.build"], worker="worker-a:1", limit=2, lease=600)} == set(running)
        expired = queue.enqueue("image.resize", {"image": 7}, max_attempts=2)
        assert [c.id for c in queue.claim(["image.resize"], worker="ghost:9", lease=600)] == [expired]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE jobtui.job SET locked_until = now() - interval '30 s', heartbeat_at = now() - interval '45 s'"
            " WHERE id = %s",
            (expired,),
        )
        billing = [_dead(conn, "invoice.render", BILLING.replace("<n>", str(n))) for n in (11, 12, 13)]
        reset = [_dead(conn, "webhook.deliver", RESET.replace("<n>", str(n)), attempts=6) for n in (1, 2)]
        failed = _dead(conn, "invoice.render", "Permanent: currency XYZ of invoice 9 is not supported", "failed", 1)
        with conn.transaction():
            scheduler.upsert(conn, ScheduleSpec("hourly.ping", "0 * * * *", "email.send"), source="cli")
            scheduler.upsert(conn, ScheduleSpec("nightly.report", "0 3 * * *", "report.build"), source="cli")
    return Seeded(ready, delayed, sms, running, expired, billing, reset, failed)


def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(sql, params).fetchall())


def statuses(dsn: str, ids: list[int]) -> dict[int, str]:
    return {i: s for i, s in query(dsn, "SELECT id, status FROM jobtui.job WHERE id = ANY(%s)", ids)}


def audit(dsn: str) -> list[tuple[str, str, str, list[int], int]]:
    """(actor, action, target, job_ids, rows) of every audit row, oldest first."""
    return [tuple(r) for r in query(dsn, "SELECT actor, action, target, job_ids, rows FROM jobtui.audit ORDER BY id")]


async def wait_for(pilot: Any, condition: Callable[[], Any], timeout: float = 10.0, what: str = "") -> None:
    """Poll `condition` between pilot pauses until it is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await pilot.pause(0.05)


async def stays(pilot: Any, condition: Callable[[], Any], seconds: float = 0.8) -> None:
    """Assert `condition` holds throughout `seconds` (for 'nothing changes')."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert condition()
        await pilot.pause(0.05)
    assert condition()
