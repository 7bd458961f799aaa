"""The ready backlog at any size, and the queue's last hour minute by minute.

A snapshot counts the ready jobs exactly while there are at most READY_EXACT_CAP of them:
that count reads at most so many index entries. Above, counting them would take longer
the bigger the backlog, exactly when the database is struggling, so the snapshot reads
what stays cheap instead: the oldest due job's age (the first entry of the ready index),
and the size and per-type split from the newest `queue_minute` row, which the archiver
writes once a minute (or, without one, the planner's estimate of the ready index). Such a
figure is an estimate and says so (`ReadyEstimate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

# The ready jobs a read on a timer counts exactly, in claim order. Their index entries hold the
# type, but in a table no vacuum has reached each entry still visits its row, and in claim
# order each next row may sit on a page of its own: the cap bounds the pages such a read
# touches whatever the table's order. Above it, figures are estimates (ReadyEstimate).
READY_EXACT_CAP = 1_000
# The done jobs of the last minute a read on a timer visits (their rows too may be scattered);
# past that, their rate over the seconds they span.
DONE_SAMPLE = 500
# A minute row older than this no longer describes the backlog; the planner's estimate does.
MINUTE_ROW_FRESH = 300.0
PLANNER = "the planner's estimate of the ready index"

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class MinuteFigures:
    """One minute of the queue's history (a queue_minute row)."""

    minute: datetime
    ready: int
    ready_due: int
    oldest_ready_age: float | None
    done: int
    dead: int  # dead or failed within the minute
    lease_expiries: int


@dataclass(frozen=True, slots=True)
class ReadyEstimate:
    """The ready jobs when too many to count on every refresh."""

    ready: int
    ready_due: int
    oldest_ready_age: float | None  # exact: read from the ready index
    source: str  # where `ready` comes from, in words
    # Per type (ready, due, oldest age), estimated as `source` says (ready_figures).
    by_type: dict[str, tuple[int, int, float | None]]


@dataclass(frozen=True, slots=True)
class ReadyByType:
    """The ready jobs of each type as a queue overview read them (ready, due, oldest due age),
    for a snapshot taken beside it: the snapshot then does not read the ready index's head a
    second time, and both say the same of every type."""

    by_type: dict[str, tuple[int, int, float | None]]
    counted: bool  # every ready job was read; else the figures are estimates
    source: str  # where the estimates come from, in words ('' when counted)


def minutes(rows: list[Row]) -> list[MinuteFigures]:
    """The minute rows, oldest first."""
    return [
        MinuteFigures(
            r["minute"],
            int(r["ready"]),
            int(r["ready_due"]),
            None if r["oldest_ready_age"] is None else float(r["oldest_ready_age"]),
            int(r["done"]),
            int(r["dead"]),
            int(r["lease_expiries"]),
        )
        for r in rows
    ]


def _head(rows: list[Row]) -> tuple[dict[str, tuple[int, int, float | None]], float | None]:
    """The first entries of the ready index by type (ready, due, oldest due age), and the age of
    the newest of them (negative: delayed)."""
    by_type = {
        str(r["type"]): (int(r["ready"]), int(r["due"]), None if r["oldest_age"] is None else float(r["oldest_age"]))
        for r in rows
    }
    newest = next((float(r["newest_age"]) for r in rows if r["newest_age"] is not None), None)
    return by_type, newest


def estimate(
    size: Row, head_rows: list[Row], minute_rows: list[Row], taken_at: datetime, cap: int = READY_EXACT_CAP
) -> ReadyEstimate | None:
    """None when the ready jobs were few enough to count (the first cap + 1 entries of the ready
    index, `head_rows` by type, hold at most cap), else the best estimate: the newest minute
    row's count while it is fresh; else the planner's, split by type and due as the newest
    minute row was (the archiver's count, however old, describes the backlog better than the
    planner's statistics of every status), or without one as the entries read; never below
    what they held. A type's oldest age is the one read when one of its due jobs was among the
    entries (exact, as in the queue overview), else the minute row's aged by the row's age."""
    head, newest_age = _head(head_rows)
    counted = sum(ready for ready, _, _ in head.values())
    if counted <= cap:
        return None
    all_due_seen = newest_age is not None and newest_age < 0
    oldest = None if size["oldest_age"] is None else float(size["oldest_age"])
    newest = minute_rows[-1] if minute_rows else None
    row_age = None if newest is None else (taken_at - newest["recorded_at"]).total_seconds()
    split: dict[str, tuple[int, int, float | None]]

    def merged(row: dict[str, Any], scale: float, aged: bool) -> dict[str, tuple[int, int, float | None]]:
        out: dict[str, tuple[int, int, float | None]] = {}
        for t in {*head, *(str(k) for k in row)}:
            h_ready, h_due, h_age = head.get(t, (0, 0, None))
            v = row.get(t)
            if v is None:
                out[t] = (h_ready, h_due if all_due_seen else max(h_due, h_ready), h_age)
                continue
            ready, due = max(h_ready, round(int(v[0]) * scale)), max(h_due, round(int(v[1]) * scale))
            age = h_age
            if age is None and aged and not all_due_seen and v[2] is not None and row_age is not None:
                age = float(v[2]) + row_age
                age = age if newest_age is None else min(age, newest_age)
            out[t] = (ready, h_due if all_due_seen else due, age)
        return out

    if newest is not None and row_age is not None and row_age <= MINUTE_ROW_FRESH:
        ready = max(counted, int(newest["ready"]))
        due_share = int(newest["ready_due"]) / int(newest["ready"]) if int(newest["ready"]) else 1.0
        at = newest["recorded_at"]
        split = merged(newest["by_type"] or {}, 1.0, True)
        return ReadyEstimate(
            ready, round(ready * due_share), oldest, f"counted at {at:%H:%M:%S} UTC by the archiver", split
        )
    ready = max(counted, int(size["index_estimate"] or 0))
    if newest is not None and int(newest["ready"]) > 0 and newest["by_type"]:
        # Workers (and their archivers) have been away: the planner's size, in the shares of
        # the last count.
        share = ready / int(newest["ready"])
        at = newest["recorded_at"]
        source = f"{PLANNER}, split as the archiver counted at {at:%H:%M:%S} UTC"
        split = merged(newest["by_type"], share, False)
        return ReadyEstimate(ready, round(int(newest["ready_due"]) * share), oldest, source, split)
    # No count at all: the shares of the entries read, a sample of the ready jobs in claim
    # order. A type with no ready job is not among them, so it is never given a backlog (the
    # planner's statistics of the type column mix every status).
    scale = ready / counted
    split = {
        t: (max(r, round(r * scale)), d if all_due_seen else max(d, round(r * scale)), age)
        for t, (r, d, age) in head.items()
    }
    return ReadyEstimate(ready, ready, oldest, f"{PLANNER}, split as the first ready jobs in claim order", split)


def ready_figures(
    given: ReadyByType | None,
    head_rows: list[Row],
    size: Row,
    minute_rows: list[Row],
    taken_at: datetime,
    cap: int = READY_EXACT_CAP,
) -> tuple[ReadyEstimate | None, dict[str, tuple[int, int, float | None]]]:
    """The ready jobs' estimate (None when counted) and their figures by type: a queue
    overview's when `given`, else those of the snapshot's own read of the ready index's head
    (the first `cap` + 1 entries)."""
    if given is not None:
        if given.counted:
            return None, given.by_type
        oldest = None if size["oldest_age"] is None else float(size["oldest_age"])
        ready = sum(r for r, _, _ in given.by_type.values())
        due = sum(d for _, d, _ in given.by_type.values())
        return ReadyEstimate(ready, due, oldest, given.source, given.by_type), given.by_type
    est = estimate(size, head_rows, minute_rows, taken_at, cap)
    if est is not None:
        return est, est.by_type
    return None, _head(head_rows)[0]
