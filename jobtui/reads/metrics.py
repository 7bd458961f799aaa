"""Read-only snapshots of the queue's health, for `jobtui stats`, the console and Prometheus.

    with psycopg.connect(dsn, autocommit=True) as conn:
        snap = snapshot(conn)
        print(snap.oldest_ready_age)

Every query reads a partial index (ready, running, dead/failed, the last hour of done) or a
small table; none reads the done history. The done count is the planner's estimate and is
labelled so (`done_estimate`). The statements of a snapshot go to the server in one pipeline:
one round trip, not fifteen.

A reader that takes snapshots again and again (the console, `stats --watch`, Prometheus)
passes a `DoneHistory`: the done jobs of minutes that can no longer change are then read once
instead of on every snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobtui.kernel.db import Call, Rows, run, statements
from jobtui.kernel.domain import DEFAULT_KEY_RETENTION, DEFAULT_QUEUE, DEFAULT_SCHEMA
from jobtui.kernel.donehistory import MINUTE, DoneHistory, calendar_minute
from jobtui.kernel.errors import JobtuiError
from jobtui.kernel.forecast import Flows, Forecast, Span, forecast, spans
from jobtui.kernel.migrate import _lock_key as migration_lock_key
from jobtui.kernel.server import now_call
from jobtui.reads.backlog import READY_EXACT_CAP, MinuteFigures, ReadyByType, ReadyEstimate, minutes, ready_figures
from jobtui.reads.flows import recent_call

# How long a snapshot waits for a lock on a queue table before giving up (seconds).
LOCK_TIMEOUT = 2.0
# The kinds of lock a session can wait for, as pg_locks names them; any other is "other".
# A row held by another transaction is waited for as its transaction id (the first waiter)
# or its tuple (those queued behind the first). queue_limit is a claim of a queue with a
# global limit waiting for the claim before it (normal while the queue is busy); advisory is
# then a `jobtui migrate` waiting for another. rate_limit is a claim of a rated queue or type
# waiting for the claim before it to commit its token bucket (normal too).
LOCK_KINDS = ("relation", "transactionid", "tuple", "advisory", "queue_limit", "rate_limit", "other")
# The kinds that are the levers at work, not something holding the queue up.
TURN_KINDS = ("queue_limit", "rate_limit")


class QueueLocked(JobtuiError):
    """A queue table stayed locked (ALTER TABLE, VACUUM FULL, LOCK TABLE) past the timeout."""


@dataclass(frozen=True, slots=True)
class TypeCounts:
    type: str
    ready: int = 0
    ready_due: int = 0
    oldest_ready_age: float | None = None  # seconds the oldest due job has waited
    running: int = 0
    dead: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class RunningGroup:
    type: str
    worker: str | None
    jobs: int
    expired: int  # leases past locked_until, not reaped yet
    oldest_heartbeat_age: float | None


@dataclass(frozen=True, slots=True)
class DeadGroup:
    status: str
    type: str
    fingerprint: str
    jobs: int
    first_seen: datetime | None
    last_seen: datetime | None
    latest_job_id: int
    latest_attempts: int
    job_ids: list[int] = field(default_factory=list)  # when read with its ids (`dead_groups`)


@dataclass(frozen=True, slots=True)
class LeaseExpiry:
    job_id: int
    type: str
    worker: str | None
    attempt: int
    expired_at: datetime
    reaped_at: datetime
    outcome: str


@dataclass(frozen=True, slots=True)
class ScheduleHealth:
    name: str
    job_type: str
    cron: str
    paused: bool
    next_run_at: datetime
    last_slot: datetime
    missed: int  # slots handled past their grace (every scheduler down), fired late or not
    skipped: int
    missed_slots: list[str]  # the newest 20 missed slots, oldest first
    next_in: float
    backfilled: int = 0  # missed slots the policy fired late
    grace: float = 30.0  # seconds after its time a slot still runs as on time
    queue: str = DEFAULT_QUEUE  # where its jobs go


@dataclass(frozen=True, slots=True)
class TableHealth:
    table: str
    live_rows: int
    dead_rows: int
    last_autovacuum: datetime | None
    last_vacuum: datetime | None
    last_autoanalyze: datetime | None
    rows_estimate: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the console header and panes need, from one round of queries."""

    taken_at: datetime
    by_type: list[TypeCounts]
    running: list[RunningGroup]
    dead: list[DeadGroup]
    done_per_minute: list[int]  # index 0 = the current calendar minute (so far), 59 = 59 minutes ago
    attempts_last_hour: dict[str, dict[int, int]]  # status -> attempts -> jobs
    attempts_last_day: dict[str, dict[int, int]]
    lease_expiries_per_hour: list[int]  # index 0 = the current hour, 24 hours back
    recent_expiries: list[LeaseExpiry]
    schedules: list[ScheduleHealth]
    tables: list[TableHealth]
    lock_waits: int  # sessions waiting for a lock while they work on jobtui's tables
    longest_lock_wait: float  # seconds, the longest of those waits
    oldest_xact_age: float | None
    oldest_xact_pid: int | None
    done_estimate: int = 0
    lease_expirations_total: int = 0
    done_last_minute: int = 0  # jobs done in the 60 seconds before taken_at
    # Jobs finished in the last hour by status ("done", "dead_or_failed"), type and attempts
    # used: attempts_last_hour split by type.
    attempts_by_type: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)
    # The lock waits by kind (every kind of LOCK_KINDS, 0 when none): sessions, longest wait.
    lock_waits_by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOCK_KINDS, 0))
    longest_lock_wait_by_kind: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOCK_KINDS, 0.0))
    notes: list[str] = field(default_factory=list)
    # Read on a hot standby: its figures are the primary's of `replay_lag` seconds ago (None
    # when that is not known: nothing replayed yet).
    standby: bool = False
    replay_lag: float | None = None
    # Set when the ready jobs were too many to count (backlog.py): ready, ready_due and the
    # per-type figures are then estimates; None when they were counted.
    ready_estimate: ReadyEstimate | None = None
    minutes: list[MinuteFigures] = field(default_factory=list)  # the last hour, oldest first
    # Seconds an idempotency key is kept after its job finished (the workers' --key-retention).
    key_retention: float = DEFAULT_KEY_RETENTION
    flows: list[Span] = field(default_factory=list)  # the last minutes' flows (forecast.py), oldest first

    @property
    def forecast(self) -> Forecast:
        """When the due backlog of every queue drains, from the last minutes' flows."""
        return forecast(Flows.of(self.flows), None, None, backlog=self.ready_due)

    @property
    def ready(self) -> int:
        if self.ready_estimate is not None:
            return self.ready_estimate.ready
        return sum(t.ready for t in self.by_type)

    @property
    def ready_due(self) -> int:
        if self.ready_estimate is not None:
            return self.ready_estimate.ready_due
        return sum(t.ready_due for t in self.by_type)

    @property
    def running_count(self) -> int:
        return sum(t.running for t in self.by_type)

    @property
    def dead_count(self) -> int:
        return sum(t.dead for t in self.by_type)

    @property
    def failed_count(self) -> int:
        return sum(t.failed for t in self.by_type)

    @property
    def oldest_ready_age(self) -> float | None:
        if self.ready_estimate is not None:
            return self.ready_estimate.oldest_ready_age
        ages = [t.oldest_ready_age for t in self.by_type if t.oldest_ready_age is not None]
        return max(ages) if ages else None

    @property
    def alarming_lock_waits(self) -> int:
        """The lock waits that say something holds the queue up: all but claims taking their
        turn under a queue's global limit (queue_limit) or a rate's bucket (rate_limit), which
        is the lever working."""
        return sum(n for kind, n in self.lock_waits_by_kind.items() if kind not in TURN_KINDS)

    @property
    def expired_leases(self) -> int:
        return sum(g.expired for g in self.running)

    @property
    def lease_expiries_last_hour(self) -> int:
        return self.lease_expiries_per_hour[0] if self.lease_expiries_per_hour else 0

    @property
    def missed_slots(self) -> int:
        return sum(s.missed for s in self.schedules)

    @property
    def standby_note(self) -> str:
        """On a standby, what its figures lag the primary's by, for a header; '' otherwise."""
        if not self.standby:
            return ""
        lag = "unknown" if self.replay_lag is None else f"{self.replay_lag:.1f}s"
        return f"standby · replay lag {lag}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["totals"] = {
            "ready": self.ready,
            "ready_due": self.ready_due,
            "ready_exact": self.ready_estimate is None,
            "running": self.running_count,
            "dead": self.dead_count,
            "failed": self.failed_count,
            "done_estimate": self.done_estimate,
            "oldest_ready_age": self.oldest_ready_age,
            "expired_leases": self.expired_leases,
            "lease_expiries_last_hour": self.lease_expiries_last_hour,
            "missed_slots": self.missed_slots,
            "done_last_minute": self.done_last_minute,
        }
        data["forecast"] = self.forecast.to_json()
        return data


Row = dict[str, Any]


def pipelined(conn: psycopg.Connection[Any], schema: str, calls: list[tuple[str, dict[str, Any]]]) -> list[list[Row]]:
    """Run the statements in one round trip (pipeline mode) and return each one's rows, by
    column name."""
    sql = statements(schema)
    cursors: list[Any] = []
    with conn.pipeline():
        for name, params in calls:
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(sql[name], params)
            cursors.append(cur)
    try:
        return [cur.fetchall() if cur.description else [] for cur in cursors]
    finally:
        for cur in cursors:
            cur.close()


def _distribution(rows: list[Row]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for r in rows:
        if r["status"] in ("done", "dead", "failed"):
            out.setdefault(r["status"], {})[int(r["attempts"])] = int(r["jobs"])
    return out


def lock_timeout_call(lock_timeout: float = LOCK_TIMEOUT) -> Call[None]:
    """For a read's own transaction: a lock timeout, and no JIT (on a big table the planner's
    row estimates make it compile small aggregates, which costs more than they do)."""
    return Call("metrics_lock_timeout", {"timeout": f"{max(1, round(lock_timeout * 1000))}ms"}, lambda rows: None)


@contextmanager
def read_transaction(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> Iterator[None]:
    """A transaction for a read that runs on a timer (the queue overview, a type's ready
    jobs): no JIT, and a lock timeout, as the snapshot's."""
    with conn.transaction():
        run(conn, lock_timeout_call(), schema)
        yield


def _lock_wait_params(schema: str) -> dict[str, Any]:
    return {"schema_name": schema, "advisory_key": migration_lock_key(schema)}


def _lock_waits(rows: list[Row]) -> tuple[dict[str, int], dict[str, float]]:
    """(sessions, longest wait) by kind, every kind of LOCK_KINDS present."""
    waits = dict.fromkeys(LOCK_KINDS, 0)
    longest = dict.fromkeys(LOCK_KINDS, 0.0)
    for r in rows:
        waits[r["kind"]] = int(r["sessions"])
        longest[r["kind"]] = float(r["longest"])
    return waits, longest


def _sorted_by_type(counts: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
    return {t: dict(sorted(counts[t].items())) for t in sorted(counts)}


def snapshot(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    recent_expiries: int = 50,
    lock_timeout: float = LOCK_TIMEOUT,
    history: DoneHistory | None = None,
    ready: ReadyByType | None = None,
) -> Snapshot:
    """Take a snapshot; read-only, safe with a role that can only SELECT.

    Raises QueueLocked, naming the waiting sessions, when a queue table stays locked for
    `lock_timeout` seconds, instead of waiting behind the lock for as long as it is held.
    Pass the same `history` to every snapshot of a reader that repeats them, and a queue
    overview's `ready` when one was just read (overview.read_with_snapshot): the ready jobs by
    type are then its figures, not a second read of the ready index's head.
    """
    with queue_locked(conn, schema, lock_timeout):
        return _snapshot(conn, schema, recent_expiries, lock_timeout, history or DoneHistory(), ready)


@contextmanager
def queue_locked(conn: psycopg.Connection[Any], schema: str, lock_timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """A read whose lock timeout (`lock_timeout` seconds) ran out on a queue table raises
    QueueLocked, naming the sessions that wait and the oldest open transaction."""
    try:
        yield
    except psycopg.errors.LockNotAvailable:
        by_kind, longest_by_kind = _lock_waits(
            run(conn, Call("metrics_lock_waits", _lock_wait_params(schema), Rows.dicts), schema)
        )
        waits, longest = sum(by_kind.values()), max(longest_by_kind.values())
        oldest = run(conn, Call("metrics_oldest_xact", {}, Rows.dicts), schema)
        holder = (
            f"; the oldest open transaction is pid {oldest[0]['pid']}, open {float(oldest[0]['age']):.0f}s"
            if oldest
            else ""
        )
        raise QueueLocked(
            f"a queue table in schema {schema!r} stayed locked for over {lock_timeout:g}s: "
            f"{int(waits)} session(s) wait for locks on it, the longest for {float(longest):.0f}s{holder}; "
            "see pg_locks and pg_stat_activity"
        ) from None


def _snapshot(
    conn: psycopg.Connection[Any],
    schema: str,
    recent_expiries: int,
    lock_timeout: float,
    history: DoneHistory,
    ready: ReadyByType | None,
) -> Snapshot:
    counts: dict[str, dict[str, Any]] = {}

    def slot(job_type: str) -> dict[str, Any]:
        return counts.setdefault(job_type, {"type": job_type})

    calls: list[tuple[str, dict[str, Any]]] = [
        ("metrics_lock_timeout", {"timeout": f"{max(1, round(lock_timeout * 1000))}ms"}),
        (now_call().name, {}),
        ("metrics_running", {}),
        ("metrics_dead", {}),
        ("metrics_done_minutes", {"since": history.read_from}),
        ("metrics_dead_attempts", {}),
        ("metrics_day", {}),
        ("metrics_lease_expiries", {}),
        ("metrics_lease_expiry_total", {}),
        ("metrics_recent_expiries", {"limit": recent_expiries}),
        ("metrics_schedules", {}),
        ("metrics_tables", {"schema_name": schema}),
        ("metrics_lock_waits", _lock_wait_params(schema)),
        ("metrics_oldest_xact", {}),
        ("metrics_recovery", {}),
        ("metrics_ready_size", {"schema_name": schema}),
        ("metrics_minutes", {}),
        (recent_call().name, {}),
        ("metrics_key_window", {}),
    ]
    if ready is None:
        calls.append(("metrics_ready", {"cap": READY_EXACT_CAP}))
    with conn.transaction():
        # One transaction for the round of reads, so lock_timeout applies to all of them.
        got = dict(zip([name for name, _ in calls], pipelined(conn, schema, calls), strict=True))
    now_rows = got[now_call().name]
    running_rows = got["metrics_running"]
    dead_rows = got["metrics_dead"]
    done_rows = got["metrics_done_minutes"]
    dead_attempt_rows = got["metrics_dead_attempts"]
    day_rows = got["metrics_day"]
    expiry_rows = got["metrics_lease_expiries"]
    total_rows = got["metrics_lease_expiry_total"]
    recent_rows = got["metrics_recent_expiries"]
    schedule_rows = got["metrics_schedules"]
    table_rows = got["metrics_tables"]
    wait_rows = got["metrics_lock_waits"]
    oldest = got["metrics_oldest_xact"]
    recovery = got["metrics_recovery"]
    minute_rows = got["metrics_minutes"]
    flow_rows = got[recent_call().name]
    key_rows = got["metrics_key_window"]
    size = got["metrics_ready_size"][0]
    taken_at = now_rows[0]["now"]
    ready_estimate, by_ready_type = ready_figures(
        ready, got.get("metrics_ready", []), size, minute_rows, taken_at, READY_EXACT_CAP
    )
    for job_type, (ready_jobs, due, age) in by_ready_type.items():
        slot(job_type).update(ready=ready_jobs, ready_due=due, oldest_ready_age=age)
    running = []
    for r in running_rows:
        running.append(_running(r))
        s = slot(r["type"])
        s["running"] = s.get("running", 0) + r["jobs"]
    dead = []
    for r in dead_rows:
        dead.append(
            DeadGroup(
                r["status"], r["type"], r["fingerprint"], r["jobs"], r["first_seen"], r["last_seen"],
                r["latest_id"], r["attempts"],
            )
        )  # fmt: skip
        s = slot(r["type"])
        s[r["status"]] = s.get(r["status"], 0) + r["jobs"]
    current = calendar_minute(taken_at)
    per_minute = [0] * 60
    hour_attempts: dict[int, int] = {}
    done_by_type: dict[str, dict[int, int]] = {}
    oldest_open = taken_at - timedelta(seconds=float(oldest[0]["age"])) if oldest else None
    for minute, done_jobs in history.update(taken_at, done_rows, oldest_open).items():
        minutes_ago = round((current - minute) / MINUTE)
        if 0 <= minutes_ago < 60:
            per_minute[minutes_ago] += sum(done_jobs.values())
            for (job_type, attempts), jobs in done_jobs.items():
                hour_attempts[attempts] = hour_attempts.get(attempts, 0) + jobs
                of_type = done_by_type.setdefault(job_type, {})
                of_type[attempts] = of_type.get(attempts, 0) + jobs
    attempts_hour: dict[str, dict[int, int]] = {"done": dict(sorted(hour_attempts.items()))}
    by_type_hour: dict[str, dict[str, dict[int, int]]] = {"done": _sorted_by_type(done_by_type)}
    dead_by_type: dict[str, dict[int, int]] = {}
    dead_attempts: dict[int, int] = {}
    for r in dead_attempt_rows:
        attempts, jobs = int(r["attempts"]), int(r["jobs"])
        dead_by_type.setdefault(r["type"], {})[attempts] = jobs
        dead_attempts[attempts] = dead_attempts.get(attempts, 0) + jobs
    if dead_attempts:
        attempts_hour["dead_or_failed"] = dict(sorted(dead_attempts.items()))
        by_type_hour["dead_or_failed"] = _sorted_by_type(dead_by_type)
    per_hour = [0] * 25
    for r in expiry_rows:
        if 0 <= r["hours_ago"] <= 24:
            per_hour[r["hours_ago"]] += r["expiries"]
    schedules = [ScheduleHealth(**{**row, "missed_slots": list(row["missed_slots"] or [])}) for row in schedule_rows]
    tables = [TableHealth(**r) for r in table_rows]
    waits_by_kind, longest_by_kind = _lock_waits(wait_rows)
    by_type = [TypeCounts(**counts[t]) for t in sorted(counts)]
    job_table = next((t for t in tables if t.table == "job"), None)
    exact = sum(t.running + t.dead + t.failed for t in by_type) + (
        ready_estimate.ready if ready_estimate else sum(t.ready for t in by_type)
    )
    done_estimate = max(0, (job_table.rows_estimate if job_table else 0) - exact)
    return Snapshot(
        taken_at=taken_at,
        by_type=by_type,
        running=running,
        dead=dead,
        done_per_minute=per_minute,
        attempts_last_hour=attempts_hour,
        attempts_last_day=_distribution(day_rows),
        lease_expiries_per_hour=per_hour[:24],
        recent_expiries=[LeaseExpiry(**r) for r in recent_rows],
        schedules=schedules,
        tables=tables,
        lock_waits=sum(waits_by_kind.values()),
        longest_lock_wait=max(longest_by_kind.values()),
        oldest_xact_age=float(oldest[0]["age"]) if oldest else None,
        oldest_xact_pid=int(oldest[0]["pid"]) if oldest else None,
        done_estimate=done_estimate,
        lease_expirations_total=int(total_rows[0]["total"]),
        done_last_minute=sum(int(r["recent"]) for r in done_rows),
        attempts_by_type=by_type_hour,
        lock_waits_by_kind=waits_by_kind,
        longest_lock_wait_by_kind=longest_by_kind,
        notes=["done_estimate comes from the planner's row estimate, not a count"]
        + ([f"ready is an estimate: {ready_estimate.source}"] if ready_estimate else []),
        ready_estimate=ready_estimate,
        minutes=minutes(minute_rows),
        flows=spans(flow_rows),
        key_retention=next(
            (float(r["key_retention"]) for r in key_rows if r["key_retention"] is not None), DEFAULT_KEY_RETENTION
        ),
        standby=bool(recovery[0]["standby"]),
        replay_lag=None if recovery[0]["replay_lag"] is None else float(recovery[0]["replay_lag"]),
    )


def _running(r: Row) -> RunningGroup:
    age = r["heartbeat_age"]
    return RunningGroup(r["type"], r["worker"], int(r["jobs"]), int(r["expired"]), None if age is None else float(age))


def running_groups_call() -> Call[list[RunningGroup]]:
    """The running jobs by type and worker, as the snapshot reads them, for a reader that
    takes no snapshot (`jobtui workers`)."""
    return Call("metrics_running", {}, lambda rows: [_running(r) for r in rows.dicts()])
