"""Keeping the queue table small: finished jobs move to `job_archive` (or are deleted) once
their retention passes, in bounded batches; the archive itself is pruned a day at a time,
by dropping the day's partition (migration 0014).

The archiver runs as a built-in schedule (`jobtui.archive`, every minute) whose job any
worker runs, so it happens once per minute however many workers there are. Its jobs go to a
queue of their own, BUILTIN_QUEUE, and every worker claims them whatever queues it serves
(worker.py): a fleet that serves only named queues archives too, and pausing the default
queue does not stop it. The reaper lives in the worker itself because it must run even when
no job can.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import psycopg

from jobtui.core.history import record_flow, record_minute
from jobtui.core.members import prune_call
from jobtui.core.registry import Job, Jobs, ScheduleSpec
from jobtui.kernel.db import Call, Rows, run
from jobtui.kernel.domain import DEFAULT_KEY_RETENTION, DEFAULT_SCHEMA

ARCHIVE_TYPE = "jobtui.archive"
# The queue of jobtui's own jobs. Every worker claims them, from any queue (a scheduler of the
# previous release enqueues them into the default queue), with a slot of their own.
BUILTIN_QUEUE = "jobtui.builtin"
BUILTIN_TYPES = (ARCHIVE_TYPE,)
ARCHIVE_CRON = "* * * * *"
BATCH = 5000
# One run stops after this many rows, so a large backlog is worked off over several minutes
# instead of in one long job.
MAX_ROWS_PER_RUN = 200_000
# The archive's day partitions are made this many days ahead of today (UTC): a day that could
# not be made (a lock held too long) is made by a later run before it is needed.
PARTITION_DAYS_AHEAD = 2


@dataclass(frozen=True, slots=True)
class Retention:
    """How long finished jobs stay in the queue table (seconds)."""

    done: float = 86400.0
    dead: float = 30 * 86400.0
    # Rows in job_archive; None keeps them forever. Pruned by the day: a row stays up to a day
    # longer, until every row of its day's partition is past this.
    archive: float | None = 30 * 86400.0
    delete_done: bool = False  # delete done jobs instead of archiving them
    # Recorded effects (`job.once`): kept this long, and always while their job may still
    # run (ready, running, dead or failed: a requeue runs it again).
    effect: float = 30 * 86400.0
    # Operators' actions; the database keeps every row younger than 30 days whatever this says.
    audit: float = 90 * 86400.0
    # Idempotency keys of jobs that left the queue table (job_key): kept this long after the
    # job finished, so that a repeated enqueue returns the job's id (--key-retention).
    key: float = DEFAULT_KEY_RETENTION

    def payload(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Retention:
        default = cls()
        archive = payload.get("archive", default.archive)
        return cls(
            done=float(payload.get("done", default.done)),
            dead=float(payload.get("dead", default.dead)),
            archive=None if archive is None else float(archive),
            delete_done=bool(payload.get("delete_done", False)),
            effect=float(payload.get("effect", default.effect)),
            audit=float(payload.get("audit", default.audit)),
            key=float(payload.get("key", default.key)),
        )


@dataclass(frozen=True, slots=True)
class Swept:
    archived: int
    deleted_done: int
    deleted_dead: int
    deleted_archive: int
    deleted_effects: int = 0
    deleted_audit: int = 0
    # Days of the archive dropped whole (deleted_archive counts the rows deleted one by one:
    # the archive's default partition and the legacy archive of migration 0014).
    dropped_archive_days: int = 0
    # Idempotency keys forgotten, their window passed.
    deleted_keys: int = 0


def _count(rows: Rows) -> int:
    return int(rows[0][0]) if rows else 0


def _batches(conn: psycopg.Connection[Any], name: str, retention: float, schema: str) -> int:
    total = 0
    while total < MAX_ROWS_PER_RUN:
        with conn.transaction():
            n = run(conn, Call(name, {"retention": retention, "limit": BATCH}, _count), schema)
        total += n
        if n < BATCH:
            break
    return total


def sweep(conn: psycopg.Connection[Any], retention: Retention, schema: str = DEFAULT_SCHEMA) -> Swept:
    """Archive (or delete) done jobs past retention; delete dead/failed past theirs; forget
    the keys of jobs that left the table longer ago than the key's window.

    Each batch is its own short transaction so the sweep never holds many locks.
    """
    archived = deleted_done = deleted_archive = dropped_days = 0
    # The days ahead, even when this worker archives nothing: another may (of the previous
    # release, say, which makes no partition).
    run(conn, Call("maintenance_archive_partitions_add", {"days": PARTITION_DAYS_AHEAD}, _count), schema)
    if retention.delete_done:
        deleted_done = _batches(conn, "maintenance_delete_done", retention.done, schema)
    else:
        archived = _batches(conn, "maintenance_archive_done", retention.done, schema)
    deleted_dead = _batches(conn, "maintenance_delete_dead", retention.dead, schema)
    if retention.archive is not None:
        dropped_days, deleted_archive = prune_archive(conn, retention.archive, schema)
    deleted_effects = _batches(conn, "maintenance_effect_prune", retention.effect, schema)
    deleted_audit = _batches(conn, "maintenance_audit_prune", retention.audit, schema)
    # After the moves above, whose keys start their window now.
    deleted_keys = _batches(conn, "maintenance_job_key_prune", retention.key, schema)
    return Swept(
        archived,
        deleted_done,
        deleted_dead,
        deleted_archive,
        deleted_effects,
        deleted_audit,
        dropped_days,
        deleted_keys,
    )


def prune_archive(conn: psycopg.Connection[Any], retention: float, schema: str = DEFAULT_SCHEMA) -> tuple[int, int]:
    """Prune the archive of rows past `retention` (seconds): (days dropped, rows deleted)."""
    dropped = deleted = 0
    while deleted < MAX_ROWS_PER_RUN:
        with conn.transaction():
            days, rows = run(
                conn,
                Call("maintenance_archive_prune", {"retention": retention, "limit": BATCH}, lambda r: r[0]),
                schema,
            )
        dropped += days
        deleted += rows
        if rows < BATCH:
            break
    return dropped, deleted


def summarise_hours(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> int:
    """Summarise each completed hour of the last day once (for day-long figures); returns
    the number of hours summarised. Runs before archiving, which removes their rows."""
    hours = run(conn, Call("maintenance_stats_missing_hours", {}, lambda rows: [r[0] for r in rows]), schema)
    for hour in hours:
        with conn.transaction():
            run(conn, Call("maintenance_stats_summarise_hour", {"hour": hour}, _count), schema)
    run(conn, Call("maintenance_stats_prune_hours", {}, _count), schema)
    run(conn, Call("maintenance_lease_expiry_prune", {}, _count), schema)
    run(conn, Call("maintenance_done_tally_prune", {}, _count), schema)
    return len(hours)


def with_builtins(jobs: Jobs, dsn: str, schema: str, retention: Retention, *, pooler: str | None = None) -> Jobs:
    """A copy of `jobs` plus the built-in archive handler and its schedule."""
    merged = Jobs(dict(jobs.handlers), dict(jobs.schedules), list(jobs.dead_callbacks), list(jobs.hooks))

    @merged.handler(ARCHIVE_TYPE, max_attempts=3, timeout=600, queue=BUILTIN_QUEUE)
    def archive(job: Job) -> None:
        from jobtui.kernel.db import connect

        with connect(dsn, pooler=pooler) as conn:
            conn.autocommit = True
            record_minute(conn, schema)  # first: the minute just ended, before anything moves
            record_flow(conn, schema)  # and the jobs enqueued and finished since the last span
            summarise_hours(conn, schema)
            sweep(conn, Retention.from_payload(job.payload or {}), schema)
            run(conn, prune_call(), schema)  # the fleet's rows lost for long

    merged.schedules[ARCHIVE_TYPE] = ScheduleSpec(
        name=ARCHIVE_TYPE,
        cron=ARCHIVE_CRON,
        type=ARCHIVE_TYPE,
        payload=retention.payload(),
        offset=0.0,
        missed="once",
        queue=BUILTIN_QUEUE,
    )
    return merged
