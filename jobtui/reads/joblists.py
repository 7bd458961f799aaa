"""The job lists the console and `jobtui dead` page through: running jobs, the ready jobs of
a type, the jobs of a dead-letter group, and the groups themselves. Read-only, rows by name."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from jobtui.kernel.db import Call, Rows, run
from jobtui.kernel.domain import DEFAULT_SCHEMA, Runner
from jobtui.reads.backlog import READY_EXACT_CAP
from jobtui.reads.deadletters import dead_matching, matching_ids
from jobtui.reads.metrics import DeadGroup, read_transaction

Row = dict[str, Any]


def _rows(conn: psycopg.Connection[Any], name: str, schema: str, **params: Any) -> list[Row]:
    """The rows of statement `name`, by column name."""
    return run(conn, Call(name, params, Rows.dicts), schema)


@dataclass(frozen=True, slots=True)
class RunningJob:
    id: int
    type: str
    worker: str | None
    attempt: int
    max_attempts: int
    heartbeat_age: float | None
    lease_left: float  # negative once the lease expired
    running_for: float | None
    locked_until: datetime | None = None  # with the id, where the next page starts
    runner: Runner | None = None  # what runs it, as its worker's last heartbeat said
    lease_token: int | None = None  # the attempt's token: a kill of it spares a later attempt

    @property
    def cursor(self) -> RunningCursor:
        assert self.locked_until is not None
        return (self.locked_until, self.id)


RunningCursor = tuple[datetime, int]  # (locked_until, id) of a page's last job
RUNNING_PAGE = 100


@dataclass(frozen=True, slots=True)
class ReadyJob:
    id: int
    type: str
    attempts: int
    max_attempts: int
    waiting: float  # seconds since run_at; negative while delayed
    age: float
    last_error: str


@dataclass(frozen=True, slots=True)
class ReadyJobs:
    """A type's ready jobs in claim order, as far as the list reads (`cut`: not all of them)."""

    jobs: list[ReadyJob]
    cut: bool = False  # the ready index has more entries than were read


@dataclass(frozen=True, slots=True)
class DeadJob:
    id: int
    type: str
    status: str
    attempts: int
    max_attempts: int
    finished_at: datetime | None
    worker: str | None
    last_error: str


def _floats(row: Row, *names: str) -> Row:
    """`row` with the columns `names` as floats (PostgreSQL's numeric comes as Decimal)."""
    return {**row, **{n: None if row[n] is None else float(row[n]) for n in names}}


def running_jobs(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    limit: int = RUNNING_PAGE,
    after: RunningCursor | None = None,
    worker: str | None = None,
) -> list[RunningJob]:
    """Running jobs, the leases closest to expiry (or expired) first: a page of `limit`,
    from the job after `after` (a previous page's last `cursor`) on; with `worker`, only
    the jobs that worker holds."""
    until, job_id = after if after is not None else (None, None)
    rows = _rows(conn, "joblist_running", schema, limit=limit, after_until=until, after_id=job_id, worker=worker)
    return [
        RunningJob(
            **{**_floats(r, "heartbeat_age", "lease_left", "running_for"), "runner": Runner.decoded(r["runner"])}
        )
        for r in rows
    ]


def ready_jobs(
    conn: psycopg.Connection[Any], job_type: str, schema: str = DEFAULT_SCHEMA, limit: int = 200
) -> ReadyJobs:
    """Ready jobs of `job_type` in the order workers will claim them, among the oldest
    READY_EXACT_CAP + 1 ready jobs of every type (a bounded read, however big the backlog)."""
    with read_transaction(conn, schema):
        rows = _rows(conn, "joblist_ready", schema, type=job_type, limit=limit, scan=READY_EXACT_CAP)
    jobs = [
        ReadyJob(**_floats({k: v for k, v in r.items() if k != "cut"}, "waiting", "age"))
        for r in rows
        if r["id"] is not None
    ]
    return ReadyJobs(jobs, cut=bool(rows and rows[0]["cut"]))


def dead_jobs(
    conn: psycopg.Connection[Any],
    status: str,
    job_type: str,
    fingerprint: str | None,
    schema: str = DEFAULT_SCHEMA,
    limit: int = 200,
) -> list[DeadJob]:
    """The jobs of one dead-letter group, newest first."""
    rows = _rows(
        conn, "joblist_dead_group", schema, status=status, type=job_type, fingerprint=fingerprint or None, limit=limit
    )
    return [DeadJob(**r) for r in rows]


def dead_groups(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    *,
    job_type: str | None = None,
    error: str | None = None,
    with_ids: bool = False,
) -> list[DeadGroup]:
    """The dead-letter groups of the jobs `jobtui dead --type --error` names, counting only
    those jobs: the same rows `jobtui requeue --type --error` moves (deadletters.dead_matching)."""
    rows = dead_matching(conn, schema, job_type=job_type, error=error, with_ids=with_ids)
    return [DeadGroup(**{**row, "job_ids": list(row["job_ids"])}) for row in rows]


def dead_group_ids(
    conn: psycopg.Connection[Any],
    status: str,
    job_type: str,
    fingerprint: str | None,
    error: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[int]:
    """The ids of one dead-letter group now (of its jobs whose error matches `error`, if given)."""
    groups = dead_matching(conn, schema, job_type=job_type, error=error, group=(status, fingerprint), with_ids=True)
    return matching_ids(groups)
