"""Why a backlog grows: for every queue and job type with jobs waiting, the causes that hold
now (causes.py), most likely first, each with its evidence and the action that fixes it; a
queue or type that nothing holds says so, with its forecast; and what the diagnosis cannot
see. Pure: it decides from values already read (the snapshot, the queue overview, the fleet,
and why.py's facts), so the console, `jobtui why` and the tests share it.

    scene = Scene.of(snapshot(conn), overview(conn).lines, read_fleet(conn), read_facts(conn))
    for subject in diagnose(scene).subjects:
        print(subject.name, [c.text for c in subject.causes])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from jobtui.kernel.forecast import Forecast
from jobtui.kernel.version import installed_version
from jobtui.reads import causes
from jobtui.reads.causes import Cause
from jobtui.reads.scene import Scene, names, plural, secs


@dataclass(frozen=True, slots=True)
class Subject:
    """A queue or a job type with jobs waiting, and what holds them."""

    kind: str  # queue or type
    name: str
    due: int
    ready: int
    running: int
    oldest_age: float | None  # seconds the oldest due job has waited
    estimated: bool  # due is an estimate (a backlog too big to count on every read)
    forecast: Forecast
    causes: list[Cause] = field(default_factory=list)
    # What it cannot see of this one: workers of an earlier release holding its jobs.
    note: str = ""

    @property
    def held(self) -> list[Cause]:
        """The causes that hold due jobs (not `not_due`, which says there is no backlog)."""
        return [c for c in self.causes if c.level != "info"]

    @property
    def healthy(self) -> bool:
        """Jobs are due and nothing holds them: they drain as the forecast says."""
        return self.due > 0 and not self.held

    @property
    def summary(self) -> str:
        """One line: the first cause, or that nothing holds it, with its forecast."""
        if self.causes:
            return self.causes[0].text
        if self.due <= 0:
            return "nothing waits"
        if self.note:
            return f"nothing seen holds it: {self.forecast.text}; {self.note}"
        return f"nothing holds it: {self.forecast.text}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "due": self.due,
            "due_estimated": self.estimated,
            "ready": self.ready,
            "running": self.running,
            "oldest_age": self.oldest_age,
            "forecast": self.forecast.to_json(),
            "healthy": self.healthy,
            "summary": self.summary,
            "note": self.note,
            "causes": [cause_json(c) for c in self.causes],
        }


def cause_json(c: Cause) -> dict[str, Any]:
    data = asdict(c)
    data["about"] = {"kind": c.about[0], "name": c.about[1]}
    data["evidence"] = list(c.evidence)
    data["figures"] = dict(c.figures)
    return data


@dataclass(frozen=True, slots=True)
class Diagnosis:
    taken_at: datetime | None
    subjects: list[Subject]
    general: list[Cause] = field(default_factory=list)  # about the database: every queue
    cannot_see: list[str] = field(default_factory=list)

    @property
    def waiting(self) -> bool:
        """Something waits with a cause (`jobtui why`'s exit code 1)."""
        return bool(self.general) or any(s.held for s in self.subjects)

    def first(self) -> tuple[Subject | None, Cause] | None:
        """The cause of the oldest wait, for the console's header: the database's when it does
        not answer, else the first cause of the subject whose oldest job waited longest."""
        if self.general and not self.subjects:
            return None, self.general[0]
        held = [s for s in self.subjects if s.held]
        if not held:
            return None
        subject = max(held, key=lambda s: (s.oldest_age or 0.0, s.kind == "queue", s.due))
        return subject, subject.held[0]

    def only(self, kind: str, name: str) -> Diagnosis:
        return replace(self, subjects=[s for s in self.subjects if (s.kind, s.name) == (kind, name)])

    def to_json(self) -> dict[str, Any]:
        return {
            "taken_at": None if self.taken_at is None else self.taken_at.isoformat(),
            "waiting": self.waiting,
            "subjects": [s.to_json() for s in self.subjects],
            "general": [cause_json(c) for c in self.general],
            "cannot_see": self.cannot_see,
        }


def _ordered(found: Iterable[Cause], due: int) -> list[Cause]:
    """Each cause once (the first of a kind about one thing), most likely first, then those
    holding the most jobs."""
    seen: dict[tuple[str, tuple[str, str], str], Cause] = {}
    for c in found:
        seen.setdefault((c.cause, c.about, c.text), c)
    return sorted(seen.values(), key=lambda c: (c.rank, -(due if c.jobs is None else c.jobs)))


class _Memo:
    """Each cause checked once per diagnosis, whichever subjects it holds."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self._done: dict[tuple[str, str, str], list[Cause]] = {}

    def of(self, what: str, kind: str, name: str, check: Callable[[], list[Cause]]) -> list[Cause]:
        key = (what, kind, name)
        if key not in self._done:
            self._done[key] = check()
        return self._done[key]

    def queue(self, queue: str) -> list[Cause]:
        """What holds a queue itself."""
        s = self.scene

        def check() -> list[Cause]:
            held = causes.paused(s, "queue", queue)
            found = [c for c in (held,) if c] + causes.serving(s, queue)
            # Paused, nothing of it is claimed: what would slow its claims is beside the point.
            if s.fleet.serving(queue) and held is None:
                found += causes.not_claiming(s, queue)
                found += [c for c in (causes.limit(s, queue), causes.rated(s, "queue", queue),
                                      causes.saturated(s, queue), causes.some_lost(s, queue)) if c]  # fmt: skip
            return found

        return self.of("queue", "queue", queue, check)

    def type(self, job_type: str) -> list[Cause]:
        """What holds a type itself."""
        s = self.scene
        return self.of(
            "type", "type", job_type,
            lambda: [c for c in (causes.paused(s, "type", job_type), causes.unhandled(s, job_type),
                                 causes.crash_loop(s, job_type), causes.rated(s, "type", job_type)) if c],
        )  # fmt: skip

    def pair(self, queue: str, job_type: str) -> list[Cause]:
        s = self.scene
        line = s.line("type", job_type)
        if line is not None and line.paused:
            return []
        return self.of("pair", queue, job_type, lambda: [c for c in (causes.unhandled_here(s, queue, job_type),) if c])


# Of a queue's causes, those that leave its jobs not due yet unrun once they are due.
NOT_RUN_WHEN_DUE = frozenset({"no_live_worker", "workers_quiet", "workers_stopping", "workers_lost"})


def _subject(memo: _Memo, kind: str, name: str, general: list[Cause]) -> Subject | None:
    s = memo.scene
    line = s.line(kind, name)
    if line is None or (line.due <= 0 and line.ready <= 0):
        return None
    found: list[Cause] = []
    if line.due <= 0:
        cause = causes.not_due(s, kind, name)
        # Nothing waits yet; but when they come due, will anything run them?
        later = (
            [replace(c, level="warn") for c in memo.queue(name) if c.cause in NOT_RUN_WHEN_DUE]
            if kind == "queue"
            else []
        )
        if cause is not None and later:
            cause = replace(cause, action="they come due by themselves, and nothing will run them then: see below")
        return Subject(
            kind, name, 0, line.ready, line.running, None, False, s.forecast(kind, name, 0),
            ([cause] if cause else []) + later,
        )  # fmt: skip
    if kind == "queue":
        found += memo.queue(name)
        for job_type, jobs in s.paired("queue", name).items():
            found += [replace(c, jobs=jobs) for c in memo.type(job_type) + memo.pair(name, job_type)]
        for job_type in s.types_in(name):  # a crash loop kills workers whether its jobs are due or running
            found += [c for c in memo.type(job_type) if c.cause == "crash_loop"]
    elif line.paused:
        found += memo.type(name)  # nothing of it is claimed, wherever it waits
    else:
        found += memo.type(name)
        for queue, jobs in s.paired("type", name).items():
            found += [replace(c, jobs=jobs) for c in memo.queue(queue)]
            found += [replace(c, jobs=jobs) for c in memo.pair(queue, name)]
    found += general
    return Subject(
        kind, name, line.due, line.ready, line.running, line.oldest_age, "due" in line.estimated,
        s.forecast(kind, name, line.due), _ordered(found, line.due), _unseen(s, kind, name),
    )  # fmt: skip


def _unseen(s: Scene, kind: str, name: str) -> str:
    """Workers without a row in the fleet that hold jobs of this queue or type, in words."""
    held = sorted({h.name for h in s.unregistered for r in s.facts.running
                   if r.worker == h.name and (r.queue if kind == "queue" else r.type) == name})  # fmt: skip
    if not held:
        return ""
    return f"{names(held)} (no row in the fleet: an earlier release) hold its jobs; what they serve is not seen"


def diagnose(scene: Scene) -> Diagnosis:
    """The causes of every queue's and type's wait (queues first, the oldest wait first)."""
    memo = _Memo(scene)
    general = [c for c in (causes.database(scene),) if c]
    subjects = [
        subject for kind, name in sorted(scene.lines) if (subject := _subject(memo, kind, name, general)) is not None
    ]
    subjects.sort(key=lambda s: (s.kind != "queue", -(s.oldest_age or 0.0), -s.ready, s.name))
    return Diagnosis(scene.snap.taken_at, subjects, general, cannot_see(scene, subjects))


def unanswered(error: str, stale: float | None = None) -> Diagnosis:
    """What can be said when the database does not answer: that, and nothing else."""
    return Diagnosis(None, [], [causes.not_answering(error, stale)])


def cannot_see(scene: Scene, subjects: list[Subject]) -> list[str]:
    """What the diagnosis had no evidence of, in words."""
    s, out = scene, []
    if s.unregistered:
        out.append(
            f"{plural(len(s.unregistered), 'worker')} {'holds' if len(s.unregistered) == 1 else 'hold'} leases"
            " without a row in the fleet (jobtui before"
            f" {installed_version()} does not register): which queues and types they serve is not known"
            f" ({names([h.name for h in s.unregistered])})"
        )
    silent = [p.name for p in s.fleet.live if p.claims and p.poll is None]
    if silent:
        out.append(f"{names(silent)} do not report their claims (an earlier release): whether they claim is not known")
    if s.flows.seconds <= 0:
        out.append("no flow history yet (the archiver records a span a minute): no arrival rate and no forecast")
    if not s.snap.minutes:
        out.append("no minute history yet (the archiver writes a row a minute): the last hour is not known")
    if s.facts.due_cut and any(x.due > 0 for x in subjects):
        out.append(
            f"which queues and types the due jobs belong to is read from the first {s.facts.scan:,} in claim"
            " order; more wait behind them"
        )
    if not s.facts.run_times and s.snap.done_last_minute > 0:
        out.append("no done job left a row to time (deleted at completion): how long jobs run is not known")
    if s.facts.claims.hidden:
        out.append(
            f"this role cannot see the statements of {plural(s.facts.claims.hidden, 'session')} (pg_read_all_stats):"
            " claims among them are not counted"
        )
    estimated = [x for x in subjects if x.estimated]
    if estimated:
        out.append("due figures marked ~ are estimates: the backlog is too big to count on every read")
    if s.snap.standby:
        out.append(f"read on a standby: {s.snap.standby_note}")
    return out


def text_of(d: Diagnosis) -> Iterable[str]:
    """The diagnosis as lines for a terminal (names from the database not escaped yet)."""
    for c in d.general:
        yield from _cause_lines(c, None)
    for subject in d.subjects:
        due = f"~{subject.due:,}" if subject.estimated else f"{subject.due:,}"
        ahead = f"; {subject.forecast.text}" if subject.forecast.state != "unknown" else ""
        if subject.due > 0:
            yield f"{subject.kind} {subject.name}: {due} due, the oldest {secs(subject.oldest_age)}{ahead}"
        else:
            yield f"{subject.kind} {subject.name}: {subject.ready:,} ready, none due yet"
        if subject.healthy:
            yield f"  healthy: {subject.summary}"
        elif subject.note:
            yield f"  not seen: {subject.note}"
        for c in subject.causes:
            yield from _cause_lines(c, subject)
    if d.cannot_see and (d.subjects or d.general):
        yield "Not seen:"
        yield from (f"  {x}" for x in d.cannot_see)


def _cause_lines(c: Cause, subject: Subject | None) -> Iterable[str]:
    share = "" if subject is None or c.jobs is None or c.jobs >= subject.due else f" [{c.jobs:,} of the due jobs seen]"
    yield f"  {c.level.upper()}: {c.text}{share}"
    for e in c.evidence:
        yield f"      {e}"
    where = f" [console: {c.key}]" if c.key else ""
    yield f"    fix: {c.action}{where}"
    if c.command:
        yield f"    $ {c.command}"
