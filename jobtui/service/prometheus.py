"""Prometheus exposition of the queue's measures: `/metrics` for `jobtui metrics --port`,
`jobtui worker --metrics-port` and `jobtui scheduler --metrics-port` (served by endpoints.py).

Each scrape takes one snapshot, the queue overview and the fleet (cached for a second, so
several scrapers cost one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from jobtui.kernel.db import connect
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.donehistory import DoneHistory
from jobtui.kernel.forecast import Forecast
from jobtui.kernel.safetext import line
from jobtui.reads.fleet import Fleet, holders, read_fleet, unhandled_due
from jobtui.reads.flows import line_forecasts
from jobtui.reads.health import Health
from jobtui.reads.metrics import Snapshot
from jobtui.reads.overview import QueueLine, read_with_snapshot
from jobtui.reads.timers import watched
from jobtui.service.endpoints import EVERY_ADDRESS, Listener, start

CACHE_SECONDS = 1.0


class QueueCollector(Collector):
    """Collects a snapshot per scrape and turns it into metric families."""

    def __init__(self, dsn: str, schema: str = DEFAULT_SCHEMA, pooler: str | None = None) -> None:
        self.dsn = dsn
        self.schema = schema
        self.pooler = pooler
        self._lock = threading.Lock()
        self._cached: tuple[float, Snapshot, list[QueueLine], Fleet] | None = None
        self._history = DoneHistory()

    def _snapshot(self) -> tuple[Snapshot, list[QueueLine], Fleet]:
        with self._lock:
            if self._cached and time.monotonic() - self._cached[0] < CACHE_SECONDS:
                return self._cached[1], self._cached[2], self._cached[3]
            with watched(connect(self.dsn, autocommit=True, pooler=self.pooler), self.schema) as conn:
                view, snap = read_with_snapshot(conn, self.schema, history=self._history)
                lines = view.lines
                fleet = read_fleet(conn, self.schema)
            self._cached = (time.monotonic(), snap, lines, fleet)
            return snap, lines, fleet

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("jobtui_up", "1 when the last scrape reached the database")
        try:
            snap, lines, fleet = self._snapshot()
        except Exception:  # the scrape must answer even when the database does not
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for family in (
            *families(snap),
            *queue_families(lines),
            *forecast_families(snap, line_forecasts(lines, snap.flows)),
            *fleet_families(fleet, lines, snap),
        ):
            yield shown(family)


def shown(family: Metric) -> Metric:
    """`family` with its label values safe for a terminal: a job type, queue, schedule or
    version is the database's text, and `curl /metrics` prints it. The exposition format
    escapes only backslashes, quotes and newlines; an ESC in a type would reach the
    operator's terminal. Control and format characters become visible escapes, as the
    console shows them (kernel/safetext.py), and a backslash is doubled first, so that two
    names never share a label value (a type holding ESC and one holding the four characters
    `\\x1b` would, and one of the two series would be dropped)."""
    family.samples = [s._replace(labels={k: label(v) for k, v in s.labels.items()}) for s in family.samples]
    return family


def label(value: str) -> str:
    """A label value as `shown` writes it: backslashes doubled, then escaped as safetext.line."""
    return line(value.replace("\\", "\\\\"))


def fleet_families(fleet: Fleet, lines: list[QueueLine], snap: Snapshot) -> Iterator[Metric]:
    """The fleet: live processes by kind, state and version, lost ones by kind; live workers
    and slots per queue; due jobs of types no live worker handles; workers holding leases
    without a row of their own (a release before the registry)."""
    processes = GaugeMetricFamily(
        "jobtui_fleet_processes",
        "Live jobtui processes (workers, schedulers, consoles' workers, servers) by kind, state and version",
        labels=["kind", "state", "version"],
    )
    counted: dict[tuple[str, str, str], int] = {}
    for p in fleet.live:
        key = (p.kind, p.state, p.version)
        counted[key] = counted.get(key, 0) + 1
    for labels, n in sorted(counted.items()):
        processes.add_metric(list(labels), n)
    yield processes
    lost = GaugeMetricFamily(
        "jobtui_fleet_lost_processes", "Processes not seen within their bound, not pruned yet, by kind", labels=["kind"]
    )
    for kind in sorted({p.kind for p in fleet.lost}):
        lost.add_metric([kind], sum(1 for p in fleet.lost if p.kind == kind))
    yield lost
    workers = GaugeMetricFamily(
        "jobtui_queue_workers",
        "Live workers claiming from the queue now (not quiet, not stopping); 0 for a queue with jobs and none",
        labels=["queue"],
    )
    slots = GaugeMetricFamily(
        "jobtui_queue_slots",
        "Slots of those workers open to the queue: the queue's own, and those a worker shares among every queue"
        " (counted in each queue)",
        labels=["queue"],
    )
    for queue in sorted({q.name for q in lines if q.kind == "queue"} | set(fleet.queues())):
        serving = fleet.serving(queue)
        workers.add_metric([queue], len(serving))
        slots.add_metric([queue], sum(p.slots_for(queue) for p in serving))
    yield workers
    yield slots
    unhandled = GaugeMetricFamily(
        "jobtui_unhandled_due_jobs",
        "Due ready jobs of a type that no live worker's app handles (they wait until one does)",
        labels=["type"],
    )
    for job_type, due in sorted(unhandled_due(fleet, lines).items()):
        unhandled.add_metric([job_type], due)
    yield unhandled
    yield GaugeMetricFamily(
        "jobtui_unregistered_lease_holders",
        "Workers holding leases that never registered in the fleet (a release before the registry)",
        value=sum(1 for h in holders(fleet, snap.running) if not h.lost),
    )


def queue_families(lines: list[QueueLine]) -> Iterator[Metric]:
    """Per queue: its jobs, oldest wait and limit; per queue and per type: paused or not."""
    jobs = GaugeMetricFamily("jobtui_queue_jobs", "Ready and running jobs by queue", labels=["queue", "status"])
    age = GaugeMetricFamily(
        "jobtui_queue_oldest_ready_age_seconds",
        "Seconds the oldest due ready job of the queue has waited",
        labels=["queue"],
    )
    limit = GaugeMetricFamily(
        "jobtui_queue_limit",
        "Jobs of the queue allowed to run at once across every worker (set ones only)",
        labels=["queue"],
    )
    paused = GaugeMetricFamily(
        "jobtui_paused", "1 when the queue or job type is paused fleet-wide", labels=["kind", "name"]
    )
    rate = GaugeMetricFamily(
        "jobtui_rate_limit_per_second",
        "Jobs of the queue or job type claimed per second at most, across every worker, now (lower during a"
        " resume's ramp; set ones only)",
        labels=["kind", "name"],
    )
    for q in lines:
        paused.add_metric([q.kind, q.name], 1 if q.paused else 0)
        if q.rate_now is not None:
            rate.add_metric([q.kind, q.name], q.rate_now)
        if q.kind != "queue":
            continue
        jobs.add_metric([q.name, "ready"], q.ready)
        jobs.add_metric([q.name, "running"], q.running)
        if q.oldest_age is not None or "oldest_age" not in q.estimated:  # not a 0 for an age not known
            age.add_metric([q.name], q.oldest_age or 0.0)
        if q.max_running is not None:
            limit.add_metric([q.name], q.max_running)
    yield from (jobs, age, limit, paused, rate)


def forecast_families(snap: Snapshot, forecasts: dict[tuple[str, str], Forecast]) -> Iterator[Metric]:
    """Seconds until each due backlog drains, at the last minutes' pace: 0 when empty, NaN
    when it grows, holds steady, is stalled or has no flows recorded yet."""
    yield GaugeMetricFamily(
        "jobtui_drain_seconds",
        "Seconds until the due ready jobs of every queue are gone at the last 5 minutes' pace (NaN: not draining)",
        value=snap.forecast.seconds,
    )
    each = GaugeMetricFamily(
        "jobtui_queue_drain_seconds",
        "Seconds until the queue's or job type's due ready jobs are gone at the last 5 minutes' pace (NaN: not"
        " draining)",
        labels=["kind", "name"],
    )
    net = GaugeMetricFamily(
        "jobtui_queue_drain_per_minute",
        "Jobs per minute the queue's or job type's backlog shrinks by (negative: grows), over the last 5 minutes",
        labels=["kind", "name"],
    )
    for (kind, name), f in forecasts.items():
        each.add_metric([kind, name], f.seconds)
        net.add_metric([kind, name], f.net_per_minute)
    yield each
    yield net


def families(snap: Snapshot) -> Iterator[Metric]:
    """The metric families of one snapshot."""
    age = GaugeMetricFamily(
        "jobtui_oldest_ready_age_seconds", "Seconds the oldest due ready job has waited", labels=["type"]
    )
    jobs = GaugeMetricFamily(
        "jobtui_jobs", "Jobs by status and type (done is not counted here)", labels=["status", "type"]
    )
    for t in snap.by_type:
        age.add_metric([t.type], t.oldest_ready_age or 0.0)
        for status, value in (("ready", t.ready), ("running", t.running), ("dead", t.dead), ("failed", t.failed)):
            jobs.add_metric([status, t.type], value)
    yield age
    yield jobs
    yield GaugeMetricFamily(
        "jobtui_oldest_ready_age_max_seconds",
        "The oldest due ready job's wait, any type",
        value=snap.oldest_ready_age or 0.0,
    )
    yield GaugeMetricFamily(
        "jobtui_ready_exact",
        "1 when the ready jobs were counted; 0 when too many to count on every scrape, and jobtui_jobs{status=ready}"
        " and jobtui_queue_jobs{status=ready} are estimates",
        value=1 if snap.ready_estimate is None else 0,
    )
    yield GaugeMetricFamily(
        "jobtui_jobs_done_estimate", "Done jobs in the queue table (planner estimate)", value=snap.done_estimate
    )
    yield GaugeMetricFamily("jobtui_done_last_minute", "Jobs done in the last 60 seconds", value=snap.done_last_minute)
    # The attempts distribution, per type, in the buckets `jobtui stats` shows: one per number
    # of attempts used (they are few: max_attempts bounds them, most jobs take one).
    attempts = GaugeMetricFamily(
        "jobtui_jobs_finished_last_hour",
        "Jobs finished in the last hour, by outcome (done, dead_or_failed), type and attempts used",
        labels=["status", "type", "attempts"],
    )
    for status, by_type in snap.attempts_by_type.items():
        for job_type, buckets in by_type.items():
            for used, count in buckets.items():
                attempts.add_metric([status, job_type, str(used)], count)
    yield attempts
    yield CounterMetricFamily(
        "jobtui_lease_expirations", "Leases the reaper found expired", value=snap.lease_expirations_total
    )
    yield GaugeMetricFamily(
        "jobtui_expired_leases", "Running jobs whose lease expired, not yet reaped", value=snap.expired_leases
    )
    missed = CounterMetricFamily(
        "jobtui_missed_slots",
        "Schedule slots handled past their grace (no scheduler ran), fired late or not",
        labels=["schedule"],
    )
    backfilled = CounterMetricFamily(
        "jobtui_backfilled_slots", "Missed schedule slots that the missed-slot policy fired late", labels=["schedule"]
    )
    paused = GaugeMetricFamily("jobtui_schedule_paused", "1 when the schedule is paused", labels=["schedule"])
    for s in snap.schedules:
        missed.add_metric([s.name], s.missed)
        backfilled.add_metric([s.name], s.backfilled)
        paused.add_metric([s.name], 1 if s.paused else 0)
    yield missed
    yield backfilled
    yield paused
    waits = GaugeMetricFamily(
        "jobtui_lock_waits",
        "Sessions waiting for a lock while they work on jobtui's tables, by the kind of lock"
        " (relation, transactionid and tuple for rows held by another transaction, advisory, queue_limit and"
        " rate_limit for claims taking their turn at a queue's limit or a rate's bucket, which is no alarm, other)",
        labels=["kind"],
    )
    longest = GaugeMetricFamily(
        "jobtui_lock_wait_longest_seconds", "The longest of those waits so far, by kind", labels=["kind"]
    )
    for kind, sessions in snap.lock_waits_by_kind.items():
        waits.add_metric([kind], sessions)
        longest.add_metric([kind], snap.longest_lock_wait_by_kind.get(kind, 0.0))
    yield waits
    yield longest
    yield GaugeMetricFamily(
        "jobtui_oldest_transaction_age_seconds",
        "Age of the oldest open transaction (holds back vacuum)",
        value=snap.oldest_xact_age or 0.0,
    )
    dead_tuples = GaugeMetricFamily("jobtui_table_dead_tuples", "Dead tuples awaiting vacuum", labels=["table"])
    live_tuples = GaugeMetricFamily("jobtui_table_live_tuples", "Live tuples", labels=["table"])
    for table in snap.tables:
        dead_tuples.add_metric([table.table], table.dead_rows)
        live_tuples.add_metric([table.table], table.live_rows)
    yield dead_tuples
    yield live_tuples
    yield GaugeMetricFamily(
        "jobtui_standby", "1 when the figures are read on a hot standby", value=1 if snap.standby else 0
    )
    if snap.standby and snap.replay_lag is not None:
        yield GaugeMetricFamily(
            "jobtui_standby_replay_lag_seconds",
            "How far the standby's figures are behind the primary's",
            value=snap.replay_lag,
        )


class WorkerCollector(Collector):
    """The serving worker's own figures (no database): its handler processes, in process mode."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker  # a jobtui Worker, read from the scrape's thread: plain counters

    def collect(self) -> Iterator[Metric]:
        yield from pool_families(getattr(self.worker, "children", None))


def pool_families(pool: Any) -> Iterator[Metric]:
    """The handler-process pool's counters: children started, recycled and killed by reason,
    and died by how; none without a pool."""
    if pool is None:
        return
    counts = pool.counts
    yield CounterMetricFamily(
        "jobtui_worker_children_started", "Handler processes this worker started", value=counts.started
    )
    for name, help_text, counter in (
        ("recycled", "Handler processes replaced after --max-jobs-per-child jobs or over --max-memory-per-child"
         " between jobs, by reason (jobs, memory)", counts.recycled),
        ("killed", "Handler processes the worker stopped while they ran a job, by reason (timeout, cancelled,"
         " lease, memory, shutdown, reclaimed)", counts.killed),
        ("died", "Handler processes that died by themselves, by how (a signal's name, exit, or deadline: it"
         " ended itself at its lease's deadline, its worker frozen)", counts.died),
    ):  # fmt: skip
        family = CounterMetricFamily(f"jobtui_worker_children_{name}", help_text, labels=["reason"])
        for reason, value in sorted(dict(counter).items()):
            family.add_metric([reason], value)
        yield family
    alive = GaugeMetricFamily("jobtui_worker_children", "Handler processes alive, by state", labels=["state"])
    children = list(pool.children)
    busy = sum(1 for c in children if c.busy)
    alive.add_metric(["busy"], busy)
    alive.add_metric(["idle"], len(children) - busy)
    yield alive


def serve(
    dsn: str,
    port: int,
    schema: str = DEFAULT_SCHEMA,
    addr: str | None = EVERY_ADDRESS,
    *,
    token: str | None = None,
    health: Health | None = None,
    fix: str = "choose another --metrics-port or --metrics-addr",
    worker: Any = None,
    pooler: str | None = None,
) -> Listener:
    """Serve /metrics on `addr`:`port` (every address when None) in a background thread, with
    the probes of `health` when given (endpoints.py); returns the server. With `worker`
    (`jobtui worker --metrics-port`), its own figures too."""
    registry = CollectorRegistry()
    registry.register(QueueCollector(dsn, schema, pooler))
    if worker is not None:
        registry.register(WorkerCollector(worker))
    return start(registry, port, addr, token=token, health=health, fix=fix)
