"""A cancel is a fact in the job's row, written by the audited `jobtui cancel`; the notification
on the schema's channel is only a hint to look. PostgreSQL checks no privilege for NOTIFY, so
any role that can connect may send `cancel <id>`: from the read-only role and from the worker
role, forged ones change nothing, and a real cancel still stops its job at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from jobtui.clients.client import Client
from jobtui.core.bulk import Bulk
from jobtui.kernel.domain import NewJob
from jobtui.kernel.jobfilter import JobFilter
from tests.roles import Roles, grant_roles
from tests.waits import wait_until
from tests.workers import WorkerProcess

Conn = psycopg.Connection[Any]


@pytest.fixture
def roles(app_dsn: str) -> Iterator[Roles]:
    with grant_roles(app_dsn) as made:
        yield made


def events(conn: Conn, job_id: int) -> list[str]:
    rows = conn.execute("SELECT event FROM run_log WHERE job_id = %s ORDER BY id", (job_id,)).fetchall()
    return [str(r[0]) for r in rows]


def job_row(conn: Conn, job_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT status, attempts, lease_token, locked_by, last_error, errors FROM jobtui.job WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


def forge(dsn: str, ids: list[int]) -> None:
    """Every way a session can send the cancel notification, for each id."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for job_id in ids:
            conn.execute("SELECT pg_notify('jobtui.job', %s)", (f"cancel {job_id}",))
            conn.execute(f"NOTIFY \"jobtui.job\", 'cancel {job_id}'")


def test_forged_cancel_notifications_change_nothing(
    db: Conn, app_dsn: str, roles: Roles, spawn: Any
) -> None:  # fmt: skip
    worker: WorkerProcess = spawn("A", "--no-scheduler", "--concurrency", "4", lease="3s")
    with Client(app_dsn) as q:
        ids = q.enqueue_many([NewJob("nap", {"sleep": 4}), NewJob("nap_sync", {"sleep": 4, "key": "forged"})])
        [sentinel] = q.enqueue_many([NewJob("nap", {"sleep": 60})])
    running = [*ids, sentinel]
    wait_until(lambda: all(events(db, i) == ["start"] for i in running), 15, "the jobs running", worker.log)
    before = {i: job_row(db, i) for i in ids}
    for dsn in (roles.readonly_dsn, roles.worker_dsn):
        forge(dsn, ids)
    # A real cancel, sent after the forged ones: notifications reach the listener in commit
    # order and it hands each on before it reads the next, so once this one has stopped its
    # job the forged ones were handed on before it.
    with Client(app_dsn) as q:
        assert q.cancel([sentinel], actor="olga") == [sentinel]
    wait_until(lambda: "cancelled" in events(db, sentinel), 5, "the real cancel acted on", worker.log)
    for job_id in ids:
        assert events(db, job_id) == ["start"], worker.log()
        assert job_row(db, job_id) == before[job_id]  # still running, same lease, no error recorded
    wait_until(lambda: all(events(db, i) == ["start", "end"] for i in ids), 15, "both jobs finished", worker.log)
    wait_until(
        lambda: (
            db.execute("SELECT count(*) FROM jobtui.job WHERE id = ANY(%s) AND status = 'done'", (ids,)).fetchone()
            == (2,)
        ),
        10,
        "both jobs done",
        worker.log,
    )
    rows = db.execute("SELECT attempts, errors FROM jobtui.job WHERE id = ANY(%s)", (ids,)).fetchall()
    assert rows == [(1, [])] * 2
    assert db.execute("SELECT count(*) FROM effect_log WHERE key = 'forged'").fetchone() == (1,)
    told = [line for line in worker.log().splitlines() if "cancelled" in line]
    assert told and all(f"job {sentinel} " in line for line in told), told  # the real cancel only


def test_a_real_cancel_still_stops_its_job_at_once(db: Conn, app_dsn: str, roles: Roles, spawn: Any) -> None:
    worker: WorkerProcess = spawn("A", "--no-scheduler", lease="30s")  # no heartbeat for 10 s
    with Client(app_dsn) as q:
        job = q.enqueue("nap", {"sleep": 60})
    wait_until(lambda: events(db, job) == ["start"], 15, "the job running", worker.log)
    with Client(roles.worker_dsn) as q:
        assert q.cancel([job], actor="olga") == [job]
    wait_until(lambda: "cancelled" in events(db, job), 2, "the handler cancelled", worker.log)
    assert job_row(db, job)[0] == "failed"


def test_a_bulk_cancel_leaves_the_fact_a_worker_stops_on(db: Conn, app_dsn: str, spawn: Any) -> None:
    """A bulk cancel writes in each row what `cancel` writes: its running jobs' handlers, sync
    and async, stop at the next heartbeat's answer, hinted at once by its notifications."""
    worker: WorkerProcess = spawn("A", "--no-scheduler", "--concurrency", "4", lease="30s")  # no heartbeat for 10 s
    with Client(app_dsn) as q:
        ids = q.enqueue_many([NewJob("nap", {"sleep": 60}), NewJob("nap_sync", {"sleep": 60, "key": "bulk"})])
    wait_until(lambda: all(events(db, i) == ["start"] for i in ids), 15, "both jobs running", worker.log)
    job = Bulk(db, "cancel", JobFilter(types=("nap", "nap_sync")), actor="olga")
    assert job.run(job.start()).changed == 2
    wait_until(lambda: all("cancelled" in events(db, i) for i in ids), 3, "both handlers cancelled", worker.log)
    assert [job_row(db, i)[0] for i in ids] == ["failed", "failed"]
