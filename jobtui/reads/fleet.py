"""The fleet as readers see it: every registered process, live or lost (core/members.py writes
the rows), the workers that hold leases without a row of their own (those of a release
before the registry), and what the fleet means for the queue: a queue with due jobs that no
live worker serves, a job type with due jobs that no live worker's app handles, more than
one version running.

One statement (`fleet_list`) reads the table, which fleet_prune keeps to the live processes
and a bounded number of lost ones; everything else is worked out here from it, the
snapshot's running jobs and the queue overview, which the readers have read anyway.

    with watched(connect(dsn, autocommit=True), schema) as conn:
        fleet = read_fleet(conn, schema)
    for finding in findings(fleet, overview_lines, holders(fleet, snap.running)):
        print(finding.text)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg

from jobtui.kernel.db import Call, Rows, run
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.reads.metrics import RunningGroup
from jobtui.reads.overview import QueueLine

# The most rows read; fleet_prune keeps the table far below it (live processes, and at most
# 500 lost ones).
FLEET_LIMIT = 5_000
# Kinds of process that claim jobs.
CLAIMING = ("worker", "console")


class Process(NamedTuple):
    """One row of the fleet, with its ages by the database's clock. A tuple in the order
    `fleet_list` names its columns, so that a thousand rows decode in a blink (checked by name
    once per read, `_decode`)."""

    id: int
    name: str
    kind: str
    host: str
    pid: int
    version: str
    up: float  # seconds since it started
    seen_ago: float  # seconds since its last refresh
    lost_after: float
    lost: bool
    queues: dict[str, int]
    every_queue: int | None
    types: list[str]
    executor: str | None
    children: int | None
    scheduler: bool
    in_flight: int
    rss_bytes: int | None
    metrics: str | None
    state: str
    wanted: str
    orders: int = 0
    ordered_by: str | None = None
    ordered_ago: float | None = None
    # Its claims (migration 0019): how often it polls when idle (None: it claims nothing, or
    # a release that does not say); at its last refresh, seconds since its last answered
    # claim (since it started, when `claimed` is false: none yet).
    poll: float | None = None
    claim_gap: float | None = None
    claimed: bool = False

    @property
    def live(self) -> bool:
        return not self.lost

    @property
    def claims(self) -> bool:
        return self.kind in CLAIMING

    @property
    def slots(self) -> int:
        return (self.every_queue or 0) + sum(self.queues.values())

    @property
    def asked(self) -> str | None:
        """The state an operator asked for that the process has not taken up yet, if any: an
        order newer than its last refresh."""
        if self.ordered_ago is None or self.ordered_ago > self.seen_ago or self.wanted == self.state:
            return None
        return self.wanted

    @property
    def status(self) -> str:
        """lost, stopping, quiet or running, as the pane shows it."""
        return "lost" if self.lost else self.state

    def serves(self, queue: str) -> bool:
        """Whether it claims from `queue` (its named queues, or every queue)."""
        return self.claims and (self.every_queue is not None or queue in self.queues)

    def slots_for(self, queue: str) -> int:
        """Its slots open to `queue`: the queue's own, and those it shares among every queue."""
        return self.queues.get(queue, 0) + (self.every_queue or 0) if self.serves(queue) else 0

    def handles(self, job_type: str) -> bool:
        return self.claims and job_type in self.types

    def queues_text(self) -> str:
        """Its slots by queue, as `--queues` takes them: `emails=5 reports=2`, `all queues=10`."""
        parts = [f"{name}={n}" for name, n in sorted(self.queues.items())]
        if self.every_queue is not None:
            parts.insert(0, f"all queues={self.every_queue}")
        return " ".join(parts) or "-"


@dataclass(frozen=True, slots=True)
class Holder:
    """A worker that holds leases with no live row: of a release before the registry (it
    never registered), or lost (its row is there, not refreshed)."""

    name: str
    jobs: int
    expired: int
    heartbeat_age: float | None
    lost: bool  # it has a lost row; False: it never registered


class Fleet:
    """The processes of one read, live and lost, with what the findings ask of them worked
    out once (a console asks on every refresh, of a thousand processes)."""

    def __init__(self, processes: Iterable[Process] = ()) -> None:
        self.processes = list(processes)
        self.live = [p for p in self.processes if not p.lost]
        self.lost = [p for p in self.processes if p.lost]
        self._named: dict[str, list[Process]] = {}  # queue -> live claiming processes naming it
        self._every: list[Process] = []  # live claiming processes serving every queue
        self._types: set[str] = set()
        for p in self.live:
            if not p.claims:
                continue
            self._types.update(p.types)
            if p.every_queue is not None:
                self._every.append(p)
            for queue in p.queues:
                self._named.setdefault(queue, []).append(p)

    def __repr__(self) -> str:
        return f"Fleet({self.processes!r})"

    def _claiming(self, queue: str) -> list[Process]:
        return self._every + [p for p in self._named.get(queue, ()) if p.every_queue is None]

    def serving(self, queue: str) -> list[Process]:
        """The live processes that claim from `queue` now (not quiet, not stopping)."""
        return [p for p in self._claiming(queue) if p.state == "running"]

    def idle_serving(self, queue: str) -> list[Process]:
        """The live processes that would serve `queue` but are quiet or stopping."""
        return [p for p in self._claiming(queue) if p.state != "running"]

    def handles(self, job_type: str) -> bool:
        """Whether a live process's app handles `job_type`, quiet or not."""
        return job_type in self._types

    def handling(self, job_type: str) -> list[Process]:
        """The live processes whose app handles `job_type`, quiet or not."""
        return [p for p in self.live if p.handles(job_type)] if job_type in self._types else []

    def versions(self) -> Counter[str]:
        """Live processes by version."""
        return Counter(p.version for p in self.live)

    def queues(self) -> list[str]:
        """Every queue a live process names."""
        return sorted(self._named)


def _decode(rows: Rows) -> Fleet:
    """Each row by name (Process's fields, picked from the statement's columns), its queues'
    JSON text decoded."""
    order = rows.columns(*Process._fields)
    at = Process._fields.index("queues")
    loads = json.loads
    made = []
    for r in rows:
        values = [r[i] for i in order]
        values[at] = loads(values[at])
        made.append(Process._make(values))
    return Fleet(made)


def fleet_call(limit: int = FLEET_LIMIT) -> Call[Fleet]:
    return Call("fleet_list", {"limit": limit}, _decode)


def read_fleet(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> Fleet:
    """Every process of the fleet, live and lost (one small read, whatever the backlog)."""
    return run(conn, fleet_call(), schema)


def holders(fleet: Fleet, running: Iterable[RunningGroup]) -> list[Holder]:
    """The workers holding leases (the snapshot's running jobs) that have no live row, the
    most jobs first."""
    live = {p.name for p in fleet.live}
    lost = {p.name for p in fleet.lost}
    jobs: dict[str, list[RunningGroup]] = {}
    for group in running:
        if group.worker is not None and group.worker not in live:
            jobs.setdefault(group.worker, []).append(group)
    found = []
    for name, groups in jobs.items():
        ages = [g.oldest_heartbeat_age for g in groups if g.oldest_heartbeat_age is not None]
        found.append(
            Holder(
                name,
                sum(g.jobs for g in groups),
                sum(g.expired for g in groups),
                max(ages) if ages else None,
                name in lost,
            )
        )
    return sorted(found, key=lambda h: (-h.jobs, h.name))


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the fleet says about the queue, for the header and `jobtui workers`."""

    kind: str  # "fleet" (no live worker at all), "queue" (none serves it), "type" (no handler), "versions"
    name: str
    text: str
    level: str  # "crit" or "warn"
    due: int = 0


def _count(q: QueueLine) -> str:
    return f"~{q.due:,}" if "due" in q.estimated else f"{q.due:,}"


def findings(fleet: Fleet, lines: Sequence[QueueLine], lease_holders: Sequence[Holder] = ()) -> list[Finding]:
    """What the fleet means for the queue now: each queue with due jobs that no live worker
    serves, each job type with due jobs that no live worker's app handles, and more than
    one version running. A paused queue or type is waiting by design and not named.

    Workers of a release before the registry are not in it: a queue or type whose jobs are
    running while such a worker holds leases may be theirs, and is not named either (the
    Workers pane lists those workers by their leases)."""
    unregistered = any(not h.lost for h in lease_holders)
    found: list[Finding] = []
    if not any(p.claims for p in fleet.live):
        # No worker at all: one line says it, rather than one per queue and type.
        waiting = [q for q in lines if q.kind == "queue" and q.due > 0 and not q.paused]
        due = sum(q.due for q in waiting)
        if waiting and not (unregistered and any(q.running > 0 for q in waiting)):
            estimated = any("due" in q.estimated for q in waiting)
            count = f"{'~' if estimated else ''}{due:,}"
            queues = f"{len(waiting)} queue{'s' if len(waiting) != 1 else ''}"
            found.append(Finding("fleet", "", f"no live worker: {count} due in {queues}", "crit", due))
        lines = []
    for q in lines:
        if q.due <= 0 or q.paused or (unregistered and q.running > 0):
            continue
        if q.kind == "queue" and not fleet.serving(q.name):
            quiet = fleet.idle_serving(q.name)
            why = f" ({len(quiet)} quiet or stopping)" if quiet else ""
            text = f"no live worker serves queue {q.name}: {_count(q)} due{why}"
            found.append(Finding("queue", q.name, text, "crit", q.due))
        elif q.kind == "type" and not fleet.handles(q.name):
            text = f"type {q.name} has {_count(q)} due job{'s' if q.due != 1 else ''} and no handler"
            found.append(Finding("type", q.name, text, "crit", q.due))
    versions = fleet.versions()
    if len(versions) > 1:
        shown = ", ".join(f"{v} ({n})" for v, n in sorted(versions.items()))
        found.append(Finding("versions", "", f"{len(versions)} versions running: {shown}", "warn"))
    return found


def unhandled_due(fleet: Fleet, lines: Sequence[QueueLine]) -> dict[str, int]:
    """Due jobs of each type no live worker's app handles (paused ones left out)."""
    return {
        q.name: q.due for q in lines if q.kind == "type" and q.due > 0 and not q.paused and not fleet.handling(q.name)
    }
