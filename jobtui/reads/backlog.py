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

import psycopg

from jobtui.kernel.db import Call, Rows, run
from jobtui.kernel.domain import DEFAULT_SCHEMA

READY_EXACT_CAP = 20_000
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
    # Per type (ready, due, oldest age), as counted at the newest minute row; empty without one.
    by_type: dict[str, tuple[int, int, float | None]]


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


def estimate(size: Row, minute_rows: list[Row], taken_at: datetime, cap: int = READY_EXACT_CAP) -> ReadyEstimate | None:
    """None when the ready jobs were few enough to count (`size["counted"] <= cap`), else the
    best estimate: the newest minute row's count while it is fresh; else the planner's, split
    by type and due as the newest minute row was (the archiver's count, however old, describes
    the backlog better than the planner's statistics of every status); never below what the
    probe counted."""
    counted = int(size["counted"])
    if counted <= cap:
        return None
    oldest = None if size["oldest_age"] is None else float(size["oldest_age"])
    newest = minute_rows[-1] if minute_rows else None
    if newest is not None and (taken_at - newest["recorded_at"]).total_seconds() <= MINUTE_ROW_FRESH:
        ready = max(counted, int(newest["ready"]))
        due_share = int(newest["ready_due"]) / int(newest["ready"]) if int(newest["ready"]) else 1.0
        at = newest["recorded_at"]
        by_type = {
            str(t): (int(v[0]), int(v[1]), None if v[2] is None else float(v[2]))
            for t, v in (newest["by_type"] or {}).items()
        }
        return ReadyEstimate(
            ready, round(ready * due_share), oldest, f"counted at {at:%H:%M:%S} UTC by the archiver", by_type
        )
    ready = max(counted, int(size["index_estimate"] or 0))
    if newest is not None and int(newest["ready"]) > 0 and newest["by_type"]:
        # Workers (and their archivers) have been away: the planner's size, in the shares of
        # the last count. A type's oldest age is not known.
        share = ready / int(newest["ready"])
        last_split: dict[str, tuple[int, int, float | None]] = {
            str(t): (round(int(v[0]) * share), round(int(v[1]) * share), None) for t, v in newest["by_type"].items()
        }
        at = newest["recorded_at"]
        source = f"{PLANNER}, split as the archiver counted at {at:%H:%M:%S} UTC"
        return ReadyEstimate(ready, round(int(newest["ready_due"]) * share), oldest, source, last_split)
    # No count at all: each type's share of the table in the planner's statistics, rough
    # (every status counts), and better than no split at all.
    shares = size.get("type_shares") or {}
    split: dict[str, tuple[int, int, float | None]] = {
        str(t): (round(ready * float(share)), round(ready * float(share)), None)
        for t, share in zip(shares.get("values") or [], shares.get("shares") or [], strict=False)
    }
    return ReadyEstimate(ready, ready, oldest, PLANNER, split)


def _count(rows: Rows) -> int:
    return len(rows)


def record_minute(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> bool:
    """Write the row of the minute that just ended (once, whoever asks) and prune rows older
    than a day; True when this call wrote it."""
    wrote = run(conn, Call("queue_minute_record", {}, _count), schema) > 0
    run(conn, Call("queue_minute_prune", {}, _count), schema)
    return wrote
