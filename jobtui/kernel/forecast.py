"""The drain forecast: from what flowed in and out over the last minutes, when a backlog
will be gone. Pure: the spans come in as arguments (the archiver records them once a
minute, `queue_flow`), so the forecast reads a handful of rows however big the backlog.

    >>> from datetime import UTC
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> spans = [Span(t, t + timedelta(minutes=5), 100, True, [("q", "a", 1500, 7500)])]
    >>> forecast(Flows.of(spans, 0), "queue", "q", backlog=16_800).text
    'drains in ~14 min at 1,200/min'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

# The forecast reads this much of the past: long enough to smooth a minute's noise, short
# enough to follow a change of pace.
WINDOW = timedelta(minutes=5)
STALLED_AFTER = timedelta(minutes=5)

State = Literal["drains", "growing", "steady", "stalled", "empty", "unknown"]
Pair = tuple[str | None, str, int, int]  # queue (None: not known), type, enqueued, finished


@dataclass(frozen=True, slots=True)
class Span:
    """One span of queue_flow: what was enqueued and what finished in it, by queue and type."""

    start: datetime
    end: datetime
    last_id: int
    enqueues_known: bool
    pairs: list[Pair]


def spans(rows: Iterable[dict[str, Any]]) -> list[Span]:
    """The queue_flow_recent rows (by column name) as spans, oldest first."""
    return [
        Span(
            r["span_start"],
            r["span_end"],
            int(r["last_id"]),
            bool(r["enqueues_known"]),
            [(p[0], str(p[1]), int(p[2]), int(p[3])) for p in r["pairs"] or []],
        )
        for r in rows
    ]


@dataclass(slots=True)
class Flows:
    """Jobs per minute in and out of each queue, each type and all of them, over `seconds`."""

    seconds: float  # the time the spans cover; 0: nothing known
    enqueued: dict[tuple[str, str], float] = field(default_factory=dict)  # (kind, name) -> jobs
    finished: dict[tuple[str, str], float] = field(default_factory=dict)
    total_enqueued: float = 0.0
    total_finished: float = 0.0

    @classmethod
    def of(cls, recent: Sequence[Span], last_id_before: int | None = None, window: timedelta = WINDOW) -> Flows:
        """The flows of the spans of the last `window` (counted back from the newest span's
        end) whose enqueues are known.

        A span's jobs that left the table before it was recorded (deleted at completion) are
        in the done tallies by type but not among its enqueued rows: the ids drawn (since the
        span before) that it did not see are given to the types of those tallies, and each
        type's jobs of unknown queue to the queues its jobs were seen in.
        """
        if not recent:
            return cls(0.0)
        newest = recent[-1].end
        seen_before = last_id_before
        chosen: list[tuple[Span, int]] = []  # with the ids drawn in it
        for i, span in enumerate(recent):
            before = recent[i - 1].last_id if i > 0 else seen_before
            if span.enqueues_known and span.end > newest - window - timedelta(seconds=1):
                drawn = span.last_id - before if before is not None else sum(p[2] for p in span.pairs)
                chosen.append((span, max(0, drawn)))
        if not chosen:
            return cls(0.0)
        seconds = sum((s.end - s.start).total_seconds() for s, _ in chosen)
        by_pair: dict[tuple[str | None, str], list[float]] = {}
        for span, drawn in chosen:
            seen = sum(p[2] for p in span.pairs)
            tallied = {p[1]: p[3] for p in span.pairs if p[0] is None}
            for queue, job_type, enq, fin in span.pairs:
                got = by_pair.setdefault((queue, job_type), [0.0, 0.0])
                got[0] += enq
                got[1] += fin
            missing, tally = drawn - seen, sum(tallied.values())
            if missing > 0 and tally > 0:
                for job_type, n in tallied.items():
                    by_pair.setdefault((None, job_type), [0.0, 0.0])[0] += missing * n / tally
        flows = cls(seconds)
        queues_of: dict[str, dict[str, float]] = {}
        for (queue, job_type), (jobs_in, jobs_out) in by_pair.items():
            if queue is not None:
                queues_of.setdefault(job_type, {})
                queues_of[job_type][queue] = queues_of[job_type].get(queue, 0.0) + jobs_in + jobs_out
        for (queue, job_type), (jobs_in, jobs_out) in by_pair.items():
            flows._add(("type", job_type), jobs_in, jobs_out)
            if queue is not None:
                flows._add(("queue", queue), jobs_in, jobs_out)
            else:
                weights = queues_of.get(job_type, {})
                whole = sum(weights.values())
                for q, w in weights.items():
                    flows._add(("queue", q), jobs_in * w / whole, jobs_out * w / whole)
        return flows

    def _add(self, key: tuple[str, str], enq: float, fin: float) -> None:
        self.enqueued[key] = self.enqueued.get(key, 0.0) + enq
        self.finished[key] = self.finished.get(key, 0.0) + fin
        if key[0] == "type":  # every job has one type: the totals count each once
            self.total_enqueued += enq
            self.total_finished += fin

    def per_minute(self, jobs: float) -> float:
        return jobs * 60.0 / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Forecast:
    """When a backlog drains, or that it does not."""

    state: State
    backlog: int
    seconds: float  # until it drains: 0 when empty, NaN when growing, steady, stalled or unknown
    net_per_minute: float  # jobs per minute the backlog shrinks by (negative: grows)
    done_per_minute: float
    enqueued_per_minute: float
    window: float  # seconds of flows it read

    @property
    def text(self) -> str:
        """What an operator reads: `drains in ~14 min at 1,200/min`, `growing +300/min`."""
        if self.state == "drains":
            return f"drains in ~{duration(self.seconds)} at {self.net_per_minute:,.0f}/min"
        if self.state == "growing":
            return f"growing +{-self.net_per_minute:,.0f}/min"
        if self.state == "steady":
            return f"steady at {self.backlog:,}: {self.done_per_minute:,.0f}/min in and out"
        if self.state == "stalled":
            return f"stalled: nothing done for {duration(self.window)}"
        if self.state == "empty":
            return "empty"
        return "no forecast yet: no flows recorded"

    @property
    def short(self) -> str:
        """The same in a table cell or the console's header; '' when there is nothing to say
        (an empty backlog, no flows recorded)."""
        if self.state == "drains":
            return f"drains ~{duration(self.seconds)}"
        if self.state == "growing":
            return f"growing +{-self.net_per_minute:,.0f}/min"
        if self.state == "steady":
            return "steady"
        if self.state == "stalled":
            return f"stalled {duration(self.window)}"
        return ""

    @property
    def level(self) -> str:
        """How it looks: `crit` stalled, `warn` growing, else `ok`."""
        return {"stalled": "crit", "growing": "warn"}.get(self.state, "ok")

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state,
            "text": self.text,
            "backlog": self.backlog,
            "seconds": None if math.isnan(self.seconds) else self.seconds,
            "net_per_minute": self.net_per_minute,
            "done_per_minute": self.done_per_minute,
            "enqueued_per_minute": self.enqueued_per_minute,
            "window_seconds": self.window,
        }


def forecast(flows: Flows, kind: str | None, name: str | None, *, backlog: int) -> Forecast:
    """The forecast of the backlog of queue or type `name` (kind None: of every job).

    >>> from datetime import UTC
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> grows = Flows.of([Span(t, t + timedelta(minutes=5), 9, True, [("q", "a", 2500, 1000)])])
    >>> forecast(grows, "queue", "q", backlog=10).text, forecast(grows, None, None, backlog=10).seconds
    ('growing +300/min', nan)
    >>> idle = Flows.of([Span(t, t + timedelta(minutes=5), 9, True, [])])
    >>> forecast(idle, "queue", "q", backlog=10).text, forecast(idle, "queue", "q", backlog=0).text
    ('stalled: nothing done for 5 min', 'empty')
    """
    if kind is None:
        enq, fin = flows.total_enqueued, flows.total_finished
    else:
        enq, fin = flows.enqueued.get((kind, name or ""), 0.0), flows.finished.get((kind, name or ""), 0.0)
    enq_rate, fin_rate = flows.per_minute(enq), flows.per_minute(fin)
    net = fin_rate - enq_rate

    def said(state: State, seconds: float) -> Forecast:
        return Forecast(state, backlog, seconds, net, fin_rate, enq_rate, flows.seconds)

    if backlog <= 0:
        return said("empty", 0.0)
    if flows.seconds <= 0:
        return said("unknown", math.nan)
    if fin <= 0:
        return said("stalled", math.nan)
    if round(net) > 0:
        return said("drains", backlog / net * 60.0)
    if round(net) < 0:
        return said("growing", math.nan)
    return said("steady", math.nan)


def duration(seconds: float) -> str:
    """A forecast's time, rounded as a forecast should be.

    >>> duration(40), duration(14 * 60 + 20), duration(3 * 3600 + 1800), duration(50 * 3600)
    ('1 min', '14 min', '3.5 h', '2.1 d')
    """
    minutes = seconds / 60
    if minutes < 90:
        return f"{max(1, round(minutes))} min"
    hours = minutes / 60
    if hours < 36:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} d"
