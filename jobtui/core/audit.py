"""The audit trail: every operator action (CLI or console) as one row, written in the same
transaction as the change it records.

    record_audit(conn, "alice@host", "requeue", "jobs 12", rows=1, job_ids=[12])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from jobtui.kernel.checks import check_text
from jobtui.kernel.db import Call, run
from jobtui.kernel.domain import DEFAULT_SCHEMA


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
