"""The audit trail: every operator action (CLI or console) as one row, written in the same
transaction as the change it records. `operate` runs a change and its row together.

    operate(conn, requeue_call([12], "alice@host"), Audit("alice@host", "requeue", "jobs 12"), moved)
    record_audit(conn, "alice@host", "requeue", "jobs 12", rows=1, job_ids=[12])
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg

from jobtui.core.jobs import notify_ready
from jobtui.core.otel import action_span
from jobtui.kernel.checks import check_text
from jobtui.kernel.db import Call, run
from jobtui.kernel.domain import DEFAULT_SCHEMA

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: Any
    actor: str
    action: str
    target: str | None
    job_ids: list[int]
    rows: int
    detail: Any


def audit_call(
    actor: str, action: str, target: str | None, job_ids: Sequence[int], rows: int, detail: Any = None
) -> Call[int]:
    params = {
        "actor": check_text(actor, "actor"),
        "action": action,
        "target": target,
        "job_ids": list(job_ids),
        "rows": rows,
        "detail": json.dumps(detail or {}),
    }
    return Call("audit_insert", params, lambda r: int(r[0][0]))


def audit_list_call(limit: int) -> Call[list[AuditEntry]]:
    return Call("audit_list", {"limit": limit}, lambda rows: [AuditEntry(**d) for d in rows.dicts()])


def record_audit(
    conn: psycopg.Connection[Any],
    actor: str,
    action: str,
    target: str | None,
    rows: int,
    *,
    job_ids: Sequence[int] = (),
    detail: Any = None,
    schema: str = DEFAULT_SCHEMA,
) -> int:
    """Write one audit row on `conn` (in its transaction)."""
    return run(conn, audit_call(actor, action, target, job_ids, rows, detail), schema)


@dataclass(frozen=True, slots=True)
class Audit:
    """An operator action as its audit row names it: who did what to which."""

    actor: str
    action: str
    target: str


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the audit row says a change did, read from the change's result."""

    rows: int
    job_ids: Sequence[int] = ()
    detail: Any = None
    notify: bool = False  # jobs went back to ready: wake the workers when it commits


def moved(ids: list[int]) -> Recorded:
    """The record of a change that moved jobs `ids` back to ready."""
    return Recorded(len(ids), ids, notify=bool(ids))


def changed_jobs(ids: list[int]) -> Recorded:
    """The record of a change of jobs `ids` that wakes no worker."""
    return Recorded(len(ids), ids)


Change = Call[T] | Callable[[psycopg.Connection[Any]], T]


def operate(
    conn: psycopg.Connection[Any],
    change: Change[T],
    audit: Audit,
    recorded: Callable[[T], Recorded],
    schema: str = DEFAULT_SCHEMA,
) -> T:
    """Run an operator's change (a `Call`, or a function of the connection for a change of
    several statements) and its audit row in one transaction, in the action's span."""
    check_text(audit.actor, "actor")
    with action_span(audit.action, audit.actor, audit.target) as span, conn.transaction():
        result = change(conn) if callable(change) else run(conn, change, schema)
        record = recorded(result)
        run(
            conn,
            audit_call(audit.actor, audit.action, audit.target, record.job_ids, record.rows, record.detail),
            schema,
        )
        if record.notify:
            notify_ready(conn, schema)
        if span is not None:
            span.set_attribute("jobtui.rows", record.rows)
    return result
