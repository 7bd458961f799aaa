"""A backlog too big to count on every refresh: the snapshot estimates it, says so, and reads
the archiver's minute rows (queue_minute) for the per-type figures and the last hour.

The cap is lowered for the test (a figure of configuration, not of the database), so a few
dozen real rows stand for millions.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from jobtui import Client
from jobtui.core import history
from jobtui.kernel import donehistory
from jobtui.kernel.domain import NewJob
from jobtui.reads import metrics
from jobtui.reads.metrics import snapshot
from tests.conftest import scalar
from tests.waits import wait_until

Conn = psycopg.Connection[Any]
CAP = 20


def away_from_minute_boundary(conn: Conn, margin: float = 3.0) -> None:
    """Wait, by the database's clock, into the next minute when it is less than `margin`
    seconds away."""

    def far_enough() -> bool:
        row = conn.execute("SELECT 60 - extract(second FROM now())").fetchone()
        assert row is not None
        return float(row[0]) >= margin

    wait_until(far_enough, margin + 30, "the next minute on the database's clock")


@pytest.fixture
def backlog_of_30(dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """30 ready jobs: 20 of `a` (5 of them delayed), 10 of `b` due for 10 minutes."""
    monkeypatch.setattr(metrics, "READY_EXACT_CAP", CAP)
    with Client(dsn) as q:
        q.enqueue_many([NewJob("a", {}) for _ in range(15)] + [NewJob("a", {}, delay=3600) for _ in range(5)])
        q.enqueue_many([NewJob("b", {}) for _ in range(10)])
    conn.execute("UPDATE jobtui.job SET run_at = now() - interval '10 minutes' WHERE type = 'b'")


def oldest_due_age(conn: Conn) -> float:
    due = "SELECT min(run_at) FROM jobtui.job WHERE status = 'ready' AND run_at <= now()"
    return float(scalar(conn, f"SELECT extract(epoch FROM now() - ({due}))::float8"))


def test_up_to_the_cap_every_ready_job_is_counted(dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "READY_EXACT_CAP", CAP)
    with Client(dsn) as q:
        q.enqueue_many([NewJob("a", {}) for _ in range(CAP)])
    snap = snapshot(conn)
    assert snap.ready_estimate is None and snap.ready == CAP
    assert snap.to_json()["totals"]["ready_exact"] is True


def test_above_the_cap_the_planner_estimates_and_the_age_stays_exact(conn: Conn, backlog_of_30: None) -> None:
    conn.execute("VACUUM ANALYZE jobtui.job")  # the index's row estimate and the statistics, as autovacuum
    snap = snapshot(conn)
    est = snap.ready_estimate
    assert (
        est is not None
        and est.source == "the planner's estimate of the ready index, split as the first ready jobs in claim order"
    )
    # Split as the first CAP + 1 entries of the ready index: the 10 of b (the oldest) and 11 of
    # a, scaled to the planner's 30; each type's age is exact (its first due job was read).
    by_type = est.by_type
    assert snap.ready == 30 and set(by_type) == {"a", "b"} and by_type["b"][0] >= 10 and by_type["a"][0] >= 11
    assert by_type["b"][2] == pytest.approx(oldest_due_age(conn), abs=2.0)
    assert snap.oldest_ready_age == pytest.approx(oldest_due_age(conn), abs=2.0)
    assert snap.oldest_ready_age is not None and snap.oldest_ready_age >= 600
    assert snap.to_json()["totals"]["ready_exact"] is False
    assert any(note.startswith("ready is an estimate") for note in snap.notes)


def test_the_archivers_minute_row_gives_the_split_by_type(conn: Conn, backlog_of_30: None) -> None:
    away_from_minute_boundary(conn)
    assert history.record_minute(conn) is True
    assert history.record_minute(conn) is False  # once per minute, whoever asks
    snap = snapshot(conn)
    est = snap.ready_estimate
    assert est is not None and est.source.endswith("by the archiver")
    assert (snap.ready, snap.ready_due) == (30, 25)
    counts = {t.type: (t.ready, t.ready_due) for t in snap.by_type}
    assert counts == {"a": (20, 15), "b": (10, 10)}
    assert len(snap.minutes) == 1 and snap.minutes[0].ready == 30


def archivers_away(conn: Conn) -> None:
    """The archiver's count of the minute, then no worker (so no archiver) for ten minutes,
    and a type with only done jobs, which the planner's statistics (every status) count."""
    away_from_minute_boundary(conn)
    assert history.record_minute(conn)
    conn.execute("UPDATE jobtui.queue_minute SET recorded_at = recorded_at - interval '10 minutes'")
    conn.execute(
        "INSERT INTO jobtui.job (type, status, finished_at)"
        " SELECT 'only_done', 'done', now() FROM generate_series(1, 40)"
    )
    conn.execute("VACUUM ANALYZE jobtui.job")


def test_with_the_archivers_away_the_planners_size_keeps_the_last_counts_split(conn: Conn, backlog_of_30: None) -> None:
    archivers_away(conn)
    snap = snapshot(conn)
    est = snap.ready_estimate
    assert est is not None and "split as the archiver counted at" in est.source, est
    assert (snap.ready, snap.ready_due) == (30, 25)
    counts = {t.type: (t.ready, t.ready_due) for t in snap.by_type if t.ready}
    assert counts == {"a": (20, 15), "b": (10, 10)}
    # Each type's age is the one read with the first entries of the ready index (exact: the
    # same as the Queues pane's), not the old count's.
    ages = {t.type: t.oldest_ready_age for t in snap.by_type if t.ready}
    assert ages["b"] == pytest.approx(oldest_due_age(conn), abs=2.0) and ages["a"] is not None and ages["a"] < 60


def test_a_minute_row_counts_what_finished_within_its_minute(dsn: str, conn: Conn) -> None:
    away_from_minute_boundary(conn)
    with Client(dsn) as q:
        ids = q.enqueue_many([NewJob("a", {}) for _ in range(6)])
    last_minute = "date_bin('1 minute', now(), timestamptz '2000-01-01') - interval '30 seconds'"
    earlier = "date_bin('1 minute', now(), timestamptz '2000-01-01') - interval '90 seconds'"
    conn.execute(f"UPDATE jobtui.job SET status = 'done', finished_at = {last_minute} WHERE id = ANY(%s)", (ids[:3],))
    conn.execute(f"UPDATE jobtui.job SET status = 'done', finished_at = {earlier} WHERE id = %s", (ids[3],))
    conn.execute(f"UPDATE jobtui.job SET status = 'dead', finished_at = {last_minute} WHERE id = %s", (ids[4],))
    conn.execute(
        "INSERT INTO jobtui.lease_expiry (job_id, job_type, attempt, expired_at, reaped_at, outcome)"
        f" VALUES (%s, 'a', 1, {last_minute}, {last_minute}, 'ready')",
        (ids[5],),
    )
    assert history.record_minute(conn)
    snap = snapshot(conn)
    (row,) = snap.minutes
    assert (row.ready, row.done, row.dead, row.lease_expiries) == (1, 3, 1, 1)
    assert row.minute == donehistory.calendar_minute(snap.taken_at) - donehistory.MINUTE


def test_minute_rows_older_than_a_day_are_pruned(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO jobtui.queue_minute (minute, ready, ready_due, done, dead, lease_expiries)"
        " VALUES (now() - interval '25 hours', 1, 1, 0, 0, 0), (now() - interval '23 hours', 2, 2, 0, 0, 0)"
    )
    history.record_minute(conn)
    row = conn.execute("SELECT array_agg(ready ORDER BY minute) FROM jobtui.queue_minute").fetchone()
    assert row is not None and row[0] == [2, 0]
