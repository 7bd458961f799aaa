"""Each queue and each job type at a glance, for `jobtui queue list`, `jobtui stats`,
Prometheus and the console's Queues pane, read the way the header reads the backlog.

Up to backlog.READY_EXACT_CAP ready jobs, every queue's and type's figures are counted, from the
rows of the first ready jobs in claim order (a page per job at worst). Above, counting them on
every read would cost more the bigger the backlog, so the overview reads those first rows and
nothing more of the ready jobs:

- the oldest due age of a queue or type stays exact when one of its due jobs is among those
  entries (its first one is its oldest); so does every figure of the due jobs while the last
  of those entries is delayed (then every due job is among them);
- the other ready and due figures come from the archiver's newest minute row (counted by queue
  and by type, once a minute) while it is at most backlog.MINUTE_ROW_FRESH seconds old, else
  from the planner's estimate of the ready index, split in the shares of the entries read
  (never the planner's statistics of the column, which mix every status), and are marked as
  estimates (`QueueLine.estimated`), never below what was seen;
- done in the last minute reads at most the newest backlog.DONE_SAMPLE + 1 done rows; past that,
  their rate over the seconds they span, an estimate too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg

from jobtui.kernel.db import Call, Rows, run
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.donehistory import DoneHistory
from jobtui.reads.backlog import DONE_SAMPLE, MINUTE_ROW_FRESH, PLANNER, READY_EXACT_CAP, ReadyByType
from jobtui.reads.metrics import Snapshot, queue_locked, read_transaction, snapshot

Row = dict[str, Any]
LINE_FIELDS = ("kind", "name", "ready", "due", "running", "oldest_age", "max_running", "paused_at", "paused_by",
               "rate", "ramp_until", "rate_now")  # fmt: skip


@dataclass(frozen=True, slots=True)
class QueueLine:
    """One queue or job type as `jobtui queue list` and the Queues pane show it."""

    kind: str  # "queue" or "type"
    name: str
    ready: int
    due: int
    running: int
    done_last_minute: int
    oldest_age: float | None  # seconds the oldest due job has waited; None with none due
    max_running: int | None  # the queue's global limit; None: none (types have none)
    paused_at: datetime | None
    paused_by: str | None
    rate: float | None = None  # jobs per second across every worker; None: no rate
    ramp_until: datetime | None = None  # while a resume's ramp runs, when it ends
    rate_now: float | None = None  # the rate the claims hold to now (lower during a ramp)
    # The fields above that are estimates, not counts (shown with `~`): some of ready, due,
    # oldest_age and done_last_minute.
    estimated: tuple[str, ...] = ()

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def ramping(self) -> bool:
        return self.ramp_until is not None


@dataclass(frozen=True, slots=True)
class Overview:
    lines: list[QueueLine]
    counted: bool = True  # every ready job was counted
    source: str = ""  # where the estimates come from, in words ('' when counted)
    done_read: bool = True  # the lines' done_last_minute was read (else 0: overview(done=False))

    def ready_by_type(self) -> ReadyByType:
        """The types' ready figures, for a snapshot taken beside this overview."""
        return ReadyByType(
            {q.name: (q.ready, q.due, q.oldest_age) for q in self.lines if q.kind == "type" and q.ready > 0},
            self.counted,
            self.source,
        )


def _read(rows: Rows) -> list[Row]:
    return rows.dicts()


@dataclass(frozen=True, slots=True)
class _Head:
    """What the overview read of one kind's ready jobs: whether it stopped before the last of
    them, how many entries, and the age of the newest (negative: delayed)."""

    partial: bool
    rows: int
    newest_age: float | None

    @property
    def all_due_seen(self) -> bool:
        """Every due job was among the entries read: the last of them is delayed."""
        return self.newest_age is not None and self.newest_age < 0


def overview(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    cap: int | None = None,
    sample: int = DONE_SAMPLE,
    done: bool = True,
) -> Overview:
    """The queues and types, with their figures counted or estimated (see the module); `cap`
    is backlog.READY_EXACT_CAP unless given, `sample` the done jobs read. Without `done` (the
    console's header, off the Queues pane), the done jobs are not read and every line's
    done_last_minute is 0 (`Overview.done_read` False)."""
    cap = READY_EXACT_CAP if cap is None else cap
    with read_transaction(conn, schema):
        rows = run(conn, Call("overview_backlog", {"cap": cap}, _read), schema)
        done_rows = run(conn, Call("overview_done", {"sample": sample}, _read), schema) if done else []
        heads = {
            r["kind"]: _Head(
                int(r["head_rows"]) > cap,
                int(r["head_rows"]),
                None if r["newest_age"] is None else float(r["newest_age"]),
            )
            for r in rows
        }
        est = (
            run(conn, Call("overview_estimate", {"schema_name": schema}, _read), schema)[0]
            if any(h.partial for h in heads.values())
            else None
        )
    lines = _with_done([QueueLine(**{f: r[f] for f in LINE_FIELDS}, done_last_minute=0) for r in rows], done_rows)
    # One order whatever was read (the estimates' lines are sorted so too): by code point, not
    # by the database's collation, so a line with done jobs only does not reorder the others.
    lines.sort(key=lambda q: (q.kind, q.name))
    types = [r for r in done_rows if r["kind"] == "type"]  # every job read is in exactly one type's row
    if sum(int(r["done_last_minute"]) for r in types) > sample:
        # The newest sample + 1 done jobs span fewer than 60 seconds: their rate, per minute.
        span = max((float(r["done_span"]) for r in types if r["done_span"] is not None), default=60.0)
        per_minute = 60.0 / max(1.0, span)
        lines = [
            replace(q, done_last_minute=round(q.done_last_minute * per_minute), estimated=("done_last_minute",))
            for q in lines
        ]
    if est is None:
        return Overview(lines, done_read=done)
    minute_age = None if est["minute_age"] is None else float(est["minute_age"])
    return replace(_estimated(lines, est, heads, minute_age), done_read=done)


def _with_done(lines: list[QueueLine], done_rows: list[Row]) -> list[QueueLine]:
    """The lines with their done jobs of the last minute; a queue or type with done jobs and
    nothing ready, running or set gets a line of its own."""
    done = {(r["kind"], r["name"]): int(r["done_last_minute"]) for r in done_rows}
    if not done:
        return lines
    seen = {(q.kind, q.name) for q in lines}
    out = [replace(q, done_last_minute=done.get((q.kind, q.name), 0)) for q in lines]
    out += [
        QueueLine(kind, name, 0, 0, 0, n, None, None, None, None)
        for (kind, name), n in done.items()
        if (kind, name) not in seen
    ]
    return out


def read_with_snapshot(
    conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA, history: DoneHistory | None = None, done: bool = True
) -> tuple[Overview, Snapshot]:
    """The queue overview and a snapshot, for a reader that shows both (the console, `stats`,
    `why`, the Prometheus scrape): the ready index's head is read once, by the overview, and
    the snapshot's ready jobs by type are its type lines, so the header, the Ready pane and
    the Queues pane agree. `done` as overview's. Raises QueueLocked, as the snapshot does,
    when a queue table stays locked."""
    with queue_locked(conn, schema):
        view = overview(conn, schema, done=done)
    return view, snapshot(conn, schema, history=history, ready=view.ready_by_type())


def _estimated(lines: list[QueueLine], est: Row, heads: dict[str, _Head], minute_age: float | None) -> Overview:
    fresh = minute_age is not None and minute_age <= MINUTE_ROW_FRESH
    minute: dict[str, dict[str, list[Any]]] = {"queue": est["by_queue"] or {}, "type": est["by_type"] or {}}
    # Without a fresh row (workers and their archivers away), the planner's size is split in
    # the shares of the newest row, however old: it describes the backlog better than the
    # planner's statistics of every status.
    totals = {kind: sum(int(v[0]) for v in minute[kind].values()) for kind in ("queue", "type")}
    use_minute = fresh and bool(minute["queue"] or minute["type"])
    rescale = not fresh and bool(totals["queue"] or totals["type"]) and int(est["index_estimate"] or 0) > 0
    index_estimate = int(est["index_estimate"] or 0)
    partial = {kind for kind, head in heads.items() if head.partial}
    seen = {(q.kind, q.name) for q in lines}
    if use_minute or rescale:
        for kind in partial:
            lines += [
                QueueLine(kind, name, 0, 0, 0, 0, None, None, None, None)
                for name in minute[kind]
                if (kind, name) not in seen
            ]
    out = []
    for q in lines:
        head = heads.get(q.kind)
        if head is None or not head.partial:
            out.append(q)  # every ready job of its kind was read: counted
            continue
        counted = minute[q.kind].get(q.name) if use_minute or rescale else None
        if counted is not None and rescale:
            scale = index_estimate / totals[q.kind] if totals[q.kind] else 0.0
            counted = [round(int(counted[0]) * scale), round(int(counted[1]) * scale), counted[2]]
        estimated = list(q.estimated)
        if counted is not None:
            ready = max(q.ready, int(counted[0]))
            due = q.due if head.all_due_seen else max(q.due, int(counted[1]))
        elif (use_minute or rescale) and minute[q.kind]:
            # Not in the archiver's split of its kind (new since): what the head held.
            ready, due = q.ready, q.due if head.all_due_seen else max(q.due, q.ready)
        else:
            # No split by the archiver: the planner's size in the shares of the entries read,
            # a sample of the ready jobs in claim order. A name with no ready job is not among
            # them, so it is never given a backlog.
            share = q.ready / head.rows if head.rows else 0.0
            ready = max(q.ready, round(index_estimate * share))
            due = q.due if head.all_due_seen else max(q.due, ready)
        estimated.append("ready")
        if not head.all_due_seen:
            estimated.append("due")
        oldest = q.oldest_age
        if oldest is None and not head.all_due_seen:
            # Not among the entries read: its oldest due job is younger than the last of them.
            estimated.append("oldest_age")
            if counted is not None and counted[2] is not None and minute_age is not None:
                oldest = float(counted[2]) + minute_age
                oldest = oldest if head.newest_age is None else min(oldest, head.newest_age)
        out.append(replace(q, ready=ready, due=due, oldest_age=oldest, estimated=tuple(estimated)))
    out.sort(key=lambda q: (q.kind, q.name))
    if use_minute:
        source = f"counted at {est['recorded_at']:%H:%M:%S} UTC by the archiver"
    elif rescale:
        source = f"{PLANNER}, split as the archiver counted at {est['recorded_at']:%H:%M:%S} UTC"
    else:
        source = f"{PLANNER}, split as the first ready jobs in claim order"
    return Overview(out, counted=False, source=source)
