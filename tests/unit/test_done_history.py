"""DoneHistory: which minutes of done jobs a reader keeps between snapshots."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from jobtui.kernel.donehistory import UNSETTLED_MINUTES, DoneHistory

T = datetime(2024, 5, 1, 12, 30, 20, tzinfo=UTC)
M = timedelta(minutes=1)


def minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def row(at: datetime, job_type: str, attempts: int, jobs: int, recent: int) -> dict[str, Any]:
    """A row of metrics_done_minutes, by its column names."""
    return {"minute": at, "type": job_type, "attempts": attempts, "jobs": jobs, "recent": recent}


def test_minutes_settle_after_the_unsettled_window() -> None:
    history = DoneHistory()
    assert history.read_from is None  # the first snapshot reads the whole hour
    rows = [row(minute(T) - 20 * M, "a", 1, 7, 0), row(minute(T) - 2 * M, "a", 1, 3, 0), row(minute(T), "a", 2, 1, 1)]
    rows.append(row(minute(T), "b", 2, 4, 4))  # another type, same attempts: counted apart
    minutes = history.update(T, rows)
    assert minutes == {
        minute(T) - 20 * M: {("a", 1): 7},
        minute(T) - 2 * M: {("a", 1): 3},
        minute(T): {("a", 2): 1, ("b", 2): 4},
    }
    assert history.read_from == minute(T) - UNSETTLED_MINUTES * M
    # The next snapshot re-reads only from read_from: the 20-minute-old minute is kept.
    later = T + 30 * timedelta(seconds=1)
    minutes = history.update(later, [row(minute(T) - 2 * M, "a", 1, 4, 0)])
    assert minutes == {minute(T) - 20 * M: {("a", 1): 7}, minute(T) - 2 * M: {("a", 1): 4}}


def test_an_open_transaction_keeps_its_minutes_unsettled() -> None:
    """An outcome statement waiting on a lock stamps its rows with its start and commits
    later: while a transaction that old is open, its minutes are read again every time."""
    history = DoneHistory()
    opened = T - 42 * M
    history.update(T, [row(minute(T) - 50 * M, "a", 1, 5, 0)], oldest_open=opened)
    assert history.read_from == minute(opened)
    # The lock is gone; its rows committed, stamped 41 minutes ago: they are counted.
    minutes = history.update(T + M, [row(minute(T) - 41 * M, "a", 1, 100, 0)])
    assert minutes == {minute(T) - 50 * M: {("a", 1): 5}, minute(T) - 41 * M: {("a", 1): 100}}
    assert history.read_from == minute(T + M) - UNSETTLED_MINUTES * M


def test_minutes_leave_the_hour_shown() -> None:
    history = DoneHistory()
    history.update(T, [row(minute(T) - 59 * M, "a", 1, 2, 0)])
    assert history.update(T + M, []) == {}
