"""Everything the diagnosis of a backlog looks at, in one place: the snapshot, the queue
overview, the fleet and the diagnosis's own reads (why.py), with the lookups the causes share
(which types wait in a queue, a worker's busy slots for a queue, the flows of a queue, how long
its jobs run). Pure: it is built from values already read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from jobtui.kernel.durations import age_text
from jobtui.kernel.forecast import Flows, Forecast, forecast
from jobtui.reads.fleet import Fleet, Holder, Process, holders
from jobtui.reads.metrics import Snapshot
from jobtui.reads.overview import QueueLine
from jobtui.reads.why import Expiries, Facts, Pause, Running, Waiting

Key = tuple[str, str]  # (kind, name): ("queue", "emails"), ("type", "email.send")


def secs(seconds: float | None) -> str:
    """A duration an operator reads: `0.4s`, `12s`, `3m12s`; `?` for none.

    >>> secs(0.42), secs(12.0), secs(192.4), secs(None)
    ('0.4s', '12s', '3m12s', '?')
    """
    return age_text(seconds, tenths=True, none="?")


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 job`, `3 jobs`, `1,204 jobs`."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def names(items: Iterable[str], most: int = 3) -> str:
    """`a, b and c`; `a, b, c and 4 more`."""
    shown = list(items)
    if len(shown) <= 1:
        return "".join(shown)
    if len(shown) > most:
        return f"{', '.join(shown[:most])} and {len(shown) - most} more"
    return f"{', '.join(shown[:-1])} and {shown[-1]}"


@dataclass(frozen=True, slots=True)
class Pace:
    """A queue's or type's jobs per minute in and out, over the flows' window."""

    enqueued: float
    done: float
    window: float  # seconds of flows


@dataclass
class Scene:
    snap: Snapshot
    lines: dict[Key, QueueLine]
    fleet: Fleet
    facts: Facts
    flows: Flows = field(init=False)
    unregistered: list[Holder] = field(init=False)
    due: dict[tuple[str, str], Waiting] = field(init=False)  # (queue, type) -> the first due jobs seen
    pauses: dict[Key, Pause] = field(init=False)
    expiries: dict[str, Expiries] = field(init=False)

    def __post_init__(self) -> None:
        self.flows = Flows.of(self.snap.flows)
        self.unregistered = [h for h in holders(self.fleet, self.snap.running) if not h.lost]
        self.due = {(w.queue, w.type): w for w in self.facts.waiting if w.due}
        self.pauses = {(p.kind, p.name): p for p in self.facts.pauses}
        self.expiries = {e.type: e for e in self.facts.expiries}

    @classmethod
    def of(cls, snap: Snapshot, lines: Sequence[QueueLine], fleet: Fleet, facts: Facts) -> Scene:
        return cls(snap, {(q.kind, q.name): q for q in lines}, fleet, facts)

    # -- the jobs ------------------------------------------------------------------------------

    def line(self, kind: str, name: str) -> QueueLine | None:
        return self.lines.get((kind, name))

    def paired(self, kind: str, name: str) -> dict[str, int]:
        """Among the first due jobs read: for a queue, its types; for a type, its queues; with
        how many of each."""
        out: dict[str, int] = {}
        for (queue, job_type), w in self.due.items():
            if kind == "queue" and queue == name:
                out[job_type] = out.get(job_type, 0) + w.jobs
            elif kind == "type" and job_type == name:
                out[queue] = out.get(queue, 0) + w.jobs
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def later(self, kind: str, name: str, retrying: bool) -> list[Waiting]:
        """The jobs not due yet among those read, of a queue or a type."""
        return [
            w
            for w in self.facts.waiting
            if not w.due and w.retrying == retrying and (w.queue if kind == "queue" else w.type) == name
        ]

    def running_in(self, queue: str) -> list[Running]:
        return [r for r in self.facts.running if r.queue == queue]

    def types_in(self, queue: str) -> list[str]:
        """The types of a queue's due jobs seen and of its running jobs."""
        seen = set(self.paired("queue", queue)) | {r.type for r in self.running_in(queue)}
        return sorted(seen)

    def queues_of(self, job_type: str) -> list[str]:
        seen = set(self.paired("type", job_type)) | {r.queue for r in self.facts.running if r.type == job_type}
        return sorted(seen)

    # -- the fleet -----------------------------------------------------------------------------

    def busy(self, p: Process, queue: str) -> int:
        """The jobs `p` runs in the pool that serves `queue`: the queue's own pool, or its pool
        of every queue (its jobs of the queues it names apart)."""
        mine = [r for r in self.facts.running if r.worker == p.name]
        if queue in p.queues:
            return sum(r.jobs for r in mine if r.queue == queue)
        return sum(r.jobs for r in mine if r.queue not in p.queues)

    def free(self, p: Process, queue: str) -> int:
        return max(0, p.slots_for(queue) - self.busy(p, queue))

    def run_by_unregistered(self, queue: str | None = None, job_type: str | None = None) -> bool:
        """Whether a worker without a live row (of a release before the registry) runs jobs of
        `queue`, or of `job_type`: it may serve that queue or handle that type."""
        names = {h.name for h in self.unregistered}
        return any(
            r.worker in names and (queue is None or r.queue == queue) and (job_type is None or r.type == job_type)
            for r in self.facts.running
        )

    def held_by(self, worker: str, queue: str | None = None) -> list[Running]:
        return [r for r in self.facts.running if r.worker == worker and (queue is None or r.queue == queue)]

    # -- the pace ------------------------------------------------------------------------------

    def pace(self, kind: str, name: str) -> Pace | None:
        """Jobs per minute enqueued and done of a queue or type; None without flows."""
        if self.flows.seconds <= 0:
            return None
        key = (kind, name)
        return Pace(
            self.flows.per_minute(self.flows.enqueued.get(key, 0.0)),
            self.flows.per_minute(self.flows.finished.get(key, 0.0)),
            self.flows.seconds,
        )

    def forecast(self, kind: str, name: str, due: int) -> Forecast:
        return forecast(self.flows, kind, name, backlog=due)

    def run_time(self, kind: str, name: str, now: bool) -> tuple[float, int] | None:
        """The average run time of the done jobs sampled of a queue or type, and how many: of
        the last 5 minutes (`now`) or of the hour before; None when none were sampled."""
        picked = [t for t in self.facts.run_times if t.now == now and (t.queue if kind == "queue" else t.type) == name]
        jobs = sum(t.jobs for t in picked)
        if not jobs:
            return None
        return sum(t.average * t.jobs for t in picked) / jobs, jobs

    def running_age(self, queue: str) -> float | None:
        """The average time a queue's running jobs have run so far (a floor of their run time)."""
        rows = [r for r in self.running_in(queue) if r.average is not None]
        jobs = sum(r.jobs for r in rows)
        return sum((r.average or 0.0) * r.jobs for r in rows) / jobs if jobs else None
