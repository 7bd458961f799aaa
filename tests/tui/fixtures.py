"""Fixed console data for pictures and pure rendering tests: no database, no clock, no hostnames.

`FixedApp` is the real JobtuiApp whose DataSource returns the values below and whose clock
stands still, so every countdown and age on screen is the same on every run. This is not a
stand-in for the database in the SQL-backed tests (test_console.py uses a real one); it is
fixed data for snapshot pictures, which the panes are designed to draw from plain values.
The jobs search is the exception: it reads the database itself, so its pictures give
FixedApp a real one holding fixed rows (test_snapshots.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from jobtui.kernel.domain import ErrorEntry, JobRow, JobStatus, Runner
from jobtui.kernel.errors import DatabaseUnavailable
from jobtui.kernel.forecast import Span
from jobtui.reads.backlog import MinuteFigures
from jobtui.reads.diagnosis import Diagnosis, diagnose
from jobtui.reads.fleet import Fleet, Process
from jobtui.reads.joblists import DeadJob, ReadyJob, ReadyJobs, RunningJob
from jobtui.reads.metrics import DeadGroup, LeaseExpiry, RunningGroup, ScheduleHealth, Snapshot, TypeCounts
from jobtui.reads.overview import QueueLine
from jobtui.reads.scene import Scene
from jobtui.reads.why import Claims, Expiries, Facts, Pause, Running, RunTime, Waiting
from jobtui.tui.app import JobtuiApp
from jobtui.tui.data import DataSource, Fetched, Where
from jobtui.tui.panes import TABLES
from jobtui.tui.screens import JOB_COLUMNS

NOW = datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)
READ_AT = 1000.0  # the fixed monotonic time the data was "read"
ELAPSED = 2.0  # and how long ago, by the fixed clock
HISTORY = [3, 4, 4, 6, 9, 14, 22, 31, 35, 38, 41, 40, 44, 52, 61, 58, 64, 71, 75]

WHERE = Where("ops", "db.example.com", "5432", "app", "jobtui", server_read_only=False)
# Each table's columns: a pane's by its id, a drill-down list's as `ready_jobs` or `dead_jobs`.
COLUMNS = {pane.ID: pane.COLUMNS for pane in TABLES} | {f"{kind}_jobs": cols for kind, cols in JOB_COLUMNS.items()}
EXPIRED_JOB = 4130  # the running job whose lease expired (its worker crashed)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def queue_lines() -> list[QueueLine]:
    """A paused queue whose oldest wait grows, a queue at its limit, a rated type, a queue whose
    ramp rises, and a paused type."""
    return [
        QueueLine("queue", "default", 1260, 1236, 9, 540, 42.0, None, None, None),
        QueueLine("queue", "emails", 4210, 4210, 0, 0, 318.0, None, ago(320), "ops@bastion"),
        QueueLine(
            "queue", "imports", 9800, 9800, 20, 300, 12.0, None, None, None, None, NOW + timedelta(seconds=40), 46.4
        ),
        QueueLine("queue", "reports", 35, 35, 3, 12, 75.0, 3, None, None),
        QueueLine("type", "email.send", 1204, 1180, 6, 400, 42.0, None, None, None, 20.0, None, 20.0),
        QueueLine("type", "report.build", 35, 35, 3, 12, 75.0, None, None, None),
        QueueLine("type", "sms.send", 56, 56, 0, 0, 318.0, None, ago(320), "ops@bastion"),
    ]


def flows() -> list[Span]:
    """The last five minutes' flows: default and emails drain, imports grows, emails (paused)
    is stalled."""
    start = NOW - timedelta(minutes=5)
    pairs: list[tuple[str | None, str, int, int]] = [
        ("default", "email.send", 1500, 2700),
        ("reports", "report.build", 60, 60),
        ("imports", "csv.import", 4000, 1500),
        ("emails", "sms.send", 0, 0),
    ]
    return [Span(start, NOW, 90_000, True, pairs)]


def by_type() -> list[TypeCounts]:
    return [
        TypeCounts("email.send", ready=1204, ready_due=1180, oldest_ready_age=42.0, running=6),
        TypeCounts("image.resize", ready=1, ready_due=1, oldest_ready_age=3.0, running=1, dead=3),
        TypeCounts("invoice.render", ready=4, ready_due=0, running=0, dead=19, failed=9),
        TypeCounts("report.build", ready=3, ready_due=3, oldest_ready_age=412.0, running=2),
        TypeCounts("webhook.deliver", ready=36, ready_due=12, oldest_ready_age=95.0, running=1, dead=2),
    ]


def dead_groups() -> list[DeadGroup]:
    return [
        DeadGroup("dead", "invoice.render", "KeyError: 'customer <n> has no billing address'", 19,
                  ago(3300), ago(40), 4127, 3),
        DeadGroup("failed", "invoice.render", "Permanent: currency XYZ of invoice <n> is not supported", 9,
                  ago(3100), ago(95), 4119, 1),
        DeadGroup("dead", "image.resize", "lease expired: worker render-2 stopped heartbeating during attempt "
                  "<n> of <n>", 3, ago(1800), ago(300), 3990, 2),
        DeadGroup("dead", "webhook.deliver", "ConnectionError: POST https://hooks.example.com/<n>: connection "
                  "reset by peer", 2, ago(900), ago(610), 3871, 6),
    ]  # fmt: skip


def running_jobs() -> list[RunningJob]:
    return [
        RunningJob(EXPIRED_JOB, "image.resize", "render-2", 1, 2, heartbeat_age=27.0, lease_left=-12.0,
                   running_for=27.5),
        RunningJob(4101, "report.build", "worker-a", 1, 3, heartbeat_age=1.5, lease_left=8.0, running_for=74.0,
                   runner=Runner("process", 31337, 89128960)),
        RunningJob(4133, "webhook.deliver", "worker-b", 3, 6, heartbeat_age=0.2, lease_left=29.0, running_for=0.4,
                   runner=Runner("async")),
        RunningJob(4102, "report.build", "worker-a", 2, 3, heartbeat_age=2.4, lease_left=27.1, running_for=12.9,
                   runner=Runner("process", 31340, 412090368)),
        RunningJob(4134, "email.send", "worker-b", 1, 25, heartbeat_age=0.1, lease_left=29.9, running_for=0.1,
                   runner=Runner("thread")),
    ]  # fmt: skip


def expiries() -> list[LeaseExpiry]:
    return [
        LeaseExpiry(3990, "image.resize", "render-2", 2, ago(310), ago(300), "dead"),
        LeaseExpiry(3990, "image.resize", "render-2", 1, ago(1210), ago(1200), "ready"),
        LeaseExpiry(3985, "report.build", "worker-c", 1, ago(2000), ago(1995), "ready"),
    ]


def schedules() -> list[ScheduleHealth]:
    return [
        ScheduleHealth("billing.nightly", "invoice.render", "0 2 * * *", False, NOW + timedelta(hours=16, minutes=33),
                       NOW.replace(hour=2, minute=0, second=0), 0, 0, [], 59587.0),
        ScheduleHealth("catch-up", "email.send", "* * * * *", False, NOW + timedelta(seconds=7),
                       NOW.replace(second=0), 14, 0, ["2025-03-14T09:11:00+00:00", "2025-03-14T09:24:00+00:00"], 7.0,
                       backfilled=1),
        ScheduleHealth("digest.weekly", "email.send", "0 8 * * 1", True, NOW + timedelta(days=3),
                       ago(4 * 86400), 0, 3, [], 254000.0),
        ScheduleHealth("heartbeat", "email.send", "*/5 * * * * *", False, NOW + timedelta(seconds=2),
                       ago(3), 0, 0, [], 2.0),
        ScheduleHealth("reports.hourly", "report.build", "0 * * * *", False, ago(120), ago(3720), 0, 0, [], -120.0,
                       queue="reports"),
    ]  # fmt: skip


def minutes() -> list[MinuteFigures]:
    """The last hour: calm, then from 20 minutes ago a worker crashing and a backlog growing."""
    start = NOW.replace(second=0) - timedelta(minutes=60)
    rows = []
    for i in range(60):
        trouble = max(0, i - 40)
        rows.append(
            MinuteFigures(
                start + timedelta(minutes=i), 40 + 60 * trouble, 35 + 58 * trouble, 2.0 + 21.0 * trouble,
                150 - 4 * trouble, 1 + (trouble % 3 == 1), 7 if i == 52 else 2 if i == 58 else 0,
            )
        )  # fmt: skip
    return rows


def snapshot() -> Snapshot:
    return Snapshot(
        taken_at=NOW,
        by_type=by_type(),
        running=[
            RunningGroup("email.send", "worker-b", 6, 0, 0.1),
            RunningGroup("image.resize", "render-2", 1, 1, 27.0),
            RunningGroup("report.build", "worker-a", 2, 0, 2.4),
            RunningGroup("webhook.deliver", "worker-b", 1, 0, 0.2),
        ],
        dead=dead_groups(),
        done_per_minute=[96, 168, 181] + [150] * 57,  # index 0 = the current minute, so far
        done_last_minute=174,
        attempts_last_hour={"done": {1: 9800, 2: 310, 3: 42}},
        attempts_by_type={
            "done": {
                "email.send": {1: 8950, 2: 200},
                "report.build": {1: 300, 2: 10, 3: 2},
                "sms.send": {1: 50},  # all done: no job waiting, none dead
                "webhook.deliver": {1: 500, 2: 100, 3: 40},
            }
        },
        attempts_last_day={},
        lease_expiries_per_hour=[7, 2] + [0] * 22,
        recent_expiries=expiries(),
        schedules=schedules(),
        tables=[],
        lock_waits=0,
        longest_lock_wait=0.0,
        oldest_xact_age=None,
        oldest_xact_pid=None,
        minutes=minutes(),
        flows=flows(),
    )


ALL_TYPES = ["csv.import", "email.send", "image.resize", "invoice.render", "report.build", "sms.send",
             "webhook.deliver", "jobtui.archive"]  # fmt: skip


def process(name: str, kind: str, host: str, pid: int, **fields: Any) -> Process:
    base: dict[str, Any] = dict(
        id=pid % 1000, name=name, kind=kind, host=host, pid=pid, version="0.3.0", up=86_400.0, seen_ago=2.0,
        lost_after=30.0, lost=False, queues={}, every_queue=None, types=[], executor=None, children=None,
        scheduler=False, in_flight=0, rss_bytes=None, metrics=None, state="running", wanted="running",
        poll=1.0 if kind in ("worker", "console") else None, claim_gap=0.4, claimed=True,
    )  # fmt: skip
    return Process(**{**base, **fields})


def fleet() -> Fleet:
    """Two workers (one quiet), one stopping, a standalone scheduler, `jobtui serve`, and
    render-2, lost, whose lease expired (running_jobs()): every queue and type with due jobs
    is served, so the header says nothing of the fleet."""
    return Fleet(
        [
            process("worker-a", "worker", "app-1", 4242, every_queue=10, types=ALL_TYPES, executor="process",
                    children=2, scheduler=True, in_flight=2, rss_bytes=89_128_960, metrics="http://app-1:9100/metrics"),
            process("worker-b", "worker", "app-2", 5151, queues={"default": 8, "emails": 4, "jobtui.builtin": 1},
                    types=["email.send", "sms.send", "webhook.deliver", "jobtui.archive"], executor="thread",
                    in_flight=7, rss_bytes=64_000_000, state="quiet", wanted="quiet", orders=1,
                    ordered_by="ops@bastion", ordered_ago=40.0, seen_ago=1.0),
            process("reports-1", "worker", "app-3", 777, queues={"reports": 3, "imports": 2}, types=ALL_TYPES,
                    executor="thread", in_flight=1, rss_bytes=140_000_000, state="stopping", wanted="stopping",
                    up=3_600.0),
            process("render-2", "worker", "app-3", 3131, every_queue=4, types=ALL_TYPES, executor="process",
                    in_flight=1, rss_bytes=512_000_000, lost=True, seen_ago=95.0, up=7_200.0),
            process("app-1:881", "scheduler", "app-1", 881, scheduler=True, rss_bytes=48_000_000),
            process("ops-1:2020", "serve", "ops-1", 2020, in_flight=2, rss_bytes=70_000_000,
                    metrics="https://ops.example.com/"),
        ]
    )  # fmt: skip


def facts() -> Facts:
    """What the diagnosis reads besides: the first due jobs by queue and type, those not due
    yet, the running jobs by worker (worker-a's ten slots all busy), run times now and over
    the hour (imports' jobs four times slower), the expiries of image.resize on two workers,
    the pauses with their audit rows."""
    return Facts(
        waiting=[
            Waiting(True, "default", "email.send", False, 380, 42.0, 0.5),
            Waiting(True, "emails", "sms.send", False, 56, 318.0, 300.0),
            Waiting(True, "imports", "csv.import", False, 40, 12.0, 0.1),
            Waiting(True, "reports", "report.build", False, 24, 75.0, 2.0),
            Waiting(False, "default", "webhook.deliver", True, 24, 40.0, 310.0),
            Waiting(False, "default", "invoice.render", False, 4, 3600.0, 7200.0),
        ],
        due_seen=500,
        later_seen=28,
        running=[
            Running("worker-a", "imports", "csv.import", 8, 0, 14.0, 9.5),
            Running("worker-a", "default", "email.send", 2, 0, 1.2, 0.7),
            Running("worker-b", "default", "email.send", 4, 0, 0.9, 0.4),
            Running("reports-1", "reports", "report.build", 3, 0, 74.0, 40.0),
            Running("render-2", "default", "image.resize", 1, 1, 27.5, 27.5),
        ],
        run_times=[
            RunTime(True, "imports", "csv.import", 120, 9.8, 31.0),
            RunTime(False, "imports", "csv.import", 220, 2.4, 6.0),
            RunTime(True, "default", "email.send", 200, 0.3, 1.1),
            RunTime(False, "default", "email.send", 220, 0.3, 1.4),
            RunTime(True, "reports", "report.build", 12, 60.0, 80.0),
        ],
        expiries=[Expiries("image.resize", 2, 1, 2, ["render-2", "worker-c"], 300.0, 420.0, 1)],
        pauses=[
            Pause("queue", "emails", "ops@bastion", 320.0, 812, "ops@bastion"),
            Pause("type", "sms.send", "ops@bastion", 320.0, 813, "ops@bastion"),
        ],
        claims=Claims(claims=1, waiting=0, longest=0.01, hidden=0),
    )


def diagnosis(fleet_now: Fleet | None = None) -> Diagnosis:
    return diagnose(Scene.of(snapshot(), queue_lines(), fleet_now or fleet(), facts()))


def ready_jobs(job_type: str) -> list[ReadyJob]:
    return [ReadyJob(4000 + i, job_type, i % 2, 3, 412.0 - 30 * i, 415.0 - 30 * i, "") for i in range(3)]


def dead_jobs(status: str, job_type: str, fingerprint: str) -> list[DeadJob]:
    return [
        DeadJob(4127 - 7 * i, job_type, status, 3, 3, ago(40 + 170 * i), "worker-a",
                f"KeyError: 'customer {311 + 97 * i} has no billing address'")
        for i in range(5)
    ]  # fmt: skip


def job(job_id: int) -> JobRow:
    """The expired running job, told by the detail screen."""
    return JobRow(
        id=job_id,
        type="image.resize",
        payload={"image": "s3://uploads/2025/03/14/cat.png", "sizes": [64, 256]},
        idempotency_key=None,
        status=JobStatus.RUNNING,
        run_at=ago(28),
        attempts=1,
        max_attempts=2,
        locked_by="render-2",
        locked_until=ago(12),
        lease_token=1,
        heartbeat_at=ago(27),
        last_error=None,
        errors=[ErrorEntry(ago(3600).isoformat(), 0, "ops", "requeued", "requeued from dead by ops")],
        lease_expirations=0,
        created_at=ago(3700),
        started_at=ago(27.5),
        finished_at=None,
        db_now=NOW,
        runner=Runner("process", 31330, 153092096),
    )


FIXED_DSN = "postgresql://fixed.invalid/jobtui"


class FixedSource(DataSource):
    """The console's reads, answered from the values above. The jobs search (and its bulk
    actions) reads `dsn` itself: a real database of fixed rows in its pictures."""

    def __init__(self, dsn: str = FIXED_DSN) -> None:
        super().__init__(dsn, "jobtui")
        self.unreachable = False  # set to make every read fail as a lost server does
        self.hung_for = 0.0  # set to show a read that has waited this long for the server
        self.fleet = fleet()  # set to show another fleet

    def busy_for(self) -> float:
        return self.hung_for

    def fetch(self, needle: str = "") -> Fetched:
        if self.unreachable:
            raise DatabaseUnavailable("cannot reach PostgreSQL at db.example.com:5432: connection refused")
        worker = self.running_worker
        running = [j for j in running_jobs() if worker is None or j.worker == worker]
        # Read while the Why pane is open, as the console reads it (the pictures of the other
        # panes are of a console whose reads stop short of it).
        why = diagnosis(self.fleet) if self.why_open else None
        return Fetched(
            snapshot(),
            running,
            read_at=READ_AT,
            where=WHERE,
            queues=queue_lines(),
            fleet=self.fleet,
            running_worker=worker,
            diagnosis=why,
        )

    def ready_jobs(self, job_type: str) -> ReadyJobs:
        return ReadyJobs(ready_jobs(job_type))

    def dead_jobs(self, status: str, job_type: str, fingerprint: str) -> list[DeadJob]:
        return dead_jobs(status, job_type, fingerprint)

    def dead_group_ids(self, status: str, job_type: str, fingerprint: str, error: str | None = None) -> list[int]:
        jobs = next(
            g.jobs for g in dead_groups() if (g.status, g.type, g.fingerprint) == (status, job_type, fingerprint)
        )
        return list(range(5000, 5000 + jobs))

    def job(self, job_id: int) -> JobRow | None:
        return job(job_id)

    def close(self) -> None:
        pass


class FixedApp(JobtuiApp):
    """The console on fixed data and a stopped clock; reads once (at mount). `dsn` is where
    its jobs search reads (see FixedSource)."""

    def __init__(self, dsn: str = FIXED_DSN, **kwargs: Any) -> None:
        super().__init__(dsn, refresh_interval=3600, **kwargs)
        self.source = FixedSource(dsn)
        self.clock = lambda: READ_AT + ELAPSED
        self.history.extend(HISTORY)
