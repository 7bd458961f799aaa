"""What the diagnosis of a backlog reads besides the snapshot, the queue overview and the
fleet (reads/diagnosis.py decides from them): which queues and types the first due jobs
belong to and when the first jobs not due yet come due, the running jobs by worker and
queue, how long done jobs ran now and over the hour, the recent lease expiries by type, who
paused what (with its audit row), and the claims the database runs now.

Each statement reads a bounded number of rows however big the backlog (a head of the ready
index, the running jobs, a sample of done jobs, the newest expiries, the paused controls, the
database's sessions), all of them in one round trip, in a transaction with a lock timeout:

    with watched(connect(dsn, autocommit=True), schema) as conn:
        facts = read_facts(conn, schema)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.reads.metrics import pipelined, read_transaction

# The heads of the ready index read: the first SCAN due jobs and the first SCAN not due yet.
SCAN = 500
# Done jobs sampled for run times: the newest SAMPLE of the last 5 minutes, and up to
# PER_SLICE of each 5 minutes of the 55 before.
SAMPLE = 200
PER_SLICE = 20
# Lease expiries read: those of the last EXPIRY_WINDOW seconds, at most the newest EXPIRY_MOST.
EXPIRY_WINDOW = 900.0
EXPIRY_MOST = 1_000


@dataclass(frozen=True, slots=True)
class Waiting:
    """Ready jobs of one queue and type among a head of the ready index."""

    due: bool  # True: due now; False: not due yet
    queue: str
    type: str
    retrying: bool  # not due: a failed attempt before (a back-off); always False when due
    jobs: int
    # Due: seconds the first (oldest) and the last of them have waited. Not due: seconds until
    # the first and the last of them come due.
    first: float
    last: float


@dataclass(frozen=True, slots=True)
class Running:
    """Running jobs of one worker, queue and type."""

    worker: str | None
    queue: str
    type: str
    jobs: int
    expired: int  # past their lease, not reaped yet
    longest: float | None  # seconds the longest has run
    average: float | None


@dataclass(frozen=True, slots=True)
class RunTime:
    """How long done jobs of one queue and type ran: `now` (the last 5 minutes) or over the hour before."""

    now: bool
    queue: str
    type: str
    jobs: int
    average: float
    longest: float


@dataclass(frozen=True, slots=True)
class Expiries:
    """Lease expiries of one job type in the last EXPIRY_WINDOW seconds."""

    type: str
    expiries: int
    jobs: int
    workers: int
    worker_names: list[str]
    latest_ago: float
    first_ago: float
    dead: int


@dataclass(frozen=True, slots=True)
class Pause:
    """A paused queue or type: by whom, how long ago, and the audit row the pause wrote."""

    kind: str
    name: str
    paused_by: str | None
    paused_ago: float
    audit_id: int | None
    audit_actor: str | None


@dataclass(frozen=True, slots=True)
class Claims:
    """The claims of this schema the database runs now."""

    claims: int = 0
    waiting: int = 0  # of them, waiting for a lock
    longest: float = 0.0  # seconds the longest has run
    hidden: int = 0  # sessions whose statements this role may not see


@dataclass(frozen=True, slots=True)
class Facts:
    waiting: list[Waiting] = field(default_factory=list)
    due_seen: int = 0  # due jobs read (SCAN: there may be more)
    later_seen: int = 0
    scan: int = SCAN
    running: list[Running] = field(default_factory=list)
    run_times: list[RunTime] = field(default_factory=list)
    expiries: list[Expiries] = field(default_factory=list)
    pauses: list[Pause] = field(default_factory=list)
    claims: Claims = field(default_factory=Claims)

    @property
    def due_cut(self) -> bool:
        """More due jobs may wait behind those read."""
        return self.due_seen >= self.scan

    @property
    def later_cut(self) -> bool:
        return self.later_seen >= self.scan


Row = dict[str, Any]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _facts(rows: list[list[Row]], scan: int) -> Facts:
    waiting_rows, running_rows, time_rows, expiry_rows, pause_rows, claim_rows = rows
    seen = {"due": 0, "later": 0}
    waiting = []
    for r in waiting_rows:
        seen[r["part"]] = int(r["seen"])
        waiting.append(
            Waiting(
                r["part"] == "due", r["queue"], r["type"], bool(r["retrying"]), int(r["jobs"]),
                float(r["first_at"]), float(r["last_at"]),
            )
        )  # fmt: skip
    claims = claim_rows[0] if claim_rows else {}
    return Facts(
        waiting=waiting,
        due_seen=seen["due"],
        later_seen=seen["later"],
        scan=scan,
        running=[
            Running(
                r["worker"],
                r["queue"],
                r["type"],
                int(r["jobs"]),
                int(r["expired"]),
                _float(r["longest"]),
                _float(r["average"]),
            )
            for r in running_rows
        ],
        run_times=[
            RunTime(r["part"] == "now", r["queue"], r["type"], int(r["jobs"]), float(r["average"]), float(r["longest"]))
            for r in time_rows
        ],
        expiries=[
            Expiries(
                r["type"],
                int(r["expiries"]),
                int(r["jobs"]),
                int(r["workers"]),
                list(r["worker_names"] or []),
                float(r["latest_ago"]),
                float(r["first_ago"]),
                int(r["dead"]),
            )
            for r in expiry_rows
        ],
        pauses=[
            Pause(r["kind"], r["name"], r["paused_by"], float(r["paused_ago"]), r["audit_id"], r["audit_actor"])
            for r in pause_rows
        ],
        claims=Claims(
            int(claims.get("claims") or 0),
            int(claims.get("waiting") or 0),
            float(claims.get("longest") or 0.0),
            int(claims.get("hidden") or 0),
        ),
    )


def read_facts(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA, scan: int = SCAN) -> Facts:
    """The diagnosis's own reads, in one round trip (read-only: a role that can only SELECT)."""
    table = f"{sql.Identifier(schema).as_string(None)}.job"
    with read_transaction(conn, schema):
        rows = pipelined(
            conn,
            schema,
            [
                ("why_waiting", {"scan": scan}),
                ("why_running", {}),
                ("why_run_times", {"sample": SAMPLE, "per_slice": PER_SLICE}),
                ("why_expiries", {"window": EXPIRY_WINDOW, "most": EXPIRY_MOST}),
                ("why_pauses", {}),
                ("why_claims", {"table": table}),
            ],
        )
    return _facts(rows, scan)
