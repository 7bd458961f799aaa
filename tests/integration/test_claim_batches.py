"""How a worker's producer claims under a backlog, against real PostgreSQL and a real worker
process: a claim's cost is mostly per statement, so while jobs wait, a producer gathers free
slots (half its pool, or a few milliseconds) and claims them together rather than one by one
as each job ends; with no backlog it claims at once."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from typing import Any

import psycopg

from jobtui.clients.client import Client
from jobtui.kernel.domain import NewJob
from tests.integration.test_levers import count
from tests.waits import wait_until
from tests.workers import WorkerProcess

Conn = psycopg.Connection[Any]
Spawn = Callable[..., WorkerProcess]


def claim_sizes(worker: WorkerProcess) -> list[int]:
    """The jobs each answered claim took, in order, from the worker's DEBUG lines."""
    return [int(n) for n in re.findall(r"producer every queue: claim \d+ answered with (\d+) job", worker.log())]


def test_under_a_backlog_claims_gather_free_slots_not_one_per_ended_job(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    # Jobs of 2 to 20 ms: with 40 slots they end one by one, about four a millisecond.
    with Client(app_dsn) as q:
        q.enqueue_many([NewJob("brief", {"sleep": 0.002 * (1 + i % 10)}) for i in range(3000)])
    worker = spawn("A", "--concurrency", "40", "--verbose", "--no-scheduler")
    wait_until(lambda: count(db, "status = 'done'") == 3000, 120, "the backlog drained", worker.log)
    sizes = claim_sizes(worker)
    under_backlog = sizes[1:-3]  # the first claim fills the pool; the last ones find the end
    assert len(under_backlog) > 10, sizes
    # Half the pool is 20; slot by slot, most claims would take two to four jobs.
    assert statistics.median(under_backlog) >= 10, sizes


def test_with_no_backlog_a_job_is_claimed_at_once(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    # A poll of 10 s: only the enqueue's wake-up can start the job within the second.
    worker = spawn("A", "--concurrency", "20", "--poll", "10s", "--verbose", "--no-scheduler")
    with Client(app_dsn) as q:
        job = q.enqueue("brief", {"sleep": 0.0})
    wait_until(lambda: count(db, "id = %s AND status = 'done'", job) == 1, 10, "the job done", worker.log)
    row = db.execute("SELECT started_at - created_at FROM jobtui.job WHERE id = %s", (job,)).fetchone()
    assert row is not None and row[0].total_seconds() < 1.0, row
