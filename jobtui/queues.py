"""Fleet-wide pauses and global concurrency limits of queues and types: the operator's levers
during an incident (their figures are in overview.py).

A pause or a limit is a row of `queue_control` that every worker's claim statement reads
itself (queries.sql, claim), so it holds on every worker from its next claim and across
restarts. Each change writes its audit row in the same transaction.

    with connect(dsn) as conn:
        pause(conn, "queue", "emails", actor="alice@host")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from .audit import record_audit
from .checks import check_queue, check_text, check_type
from .db import Call, run, statements
from .domain import DEFAULT_SCHEMA
from .errors import InvalidInput

Kind = Literal["queue", "type"]
KINDS: tuple[Kind, ...] = ("queue", "type")
MAX_LIMIT = 1_000_000  # as the table's check says


def check_name(kind: str, name: str) -> str:
    if kind == "queue":
        return check_queue(name)
    if kind == "type":
        return check_type(name)
    raise InvalidInput(f"unknown kind {kind!r}: use queue or type")


def check_limit(limit: int | None) -> int | None:
    if limit is not None and not 0 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"a limit must be between 0 and {MAX_LIMIT} jobs running at once, got {limit}")
    return limit


def pause(conn: psycopg.Connection[Any], kind: Kind, name: str, *, actor: str, schema: str = DEFAULT_SCHEMA) -> bool:
    """Pause queue or type `name` on every worker; False when it was paused already. Audited."""
    params = {"kind": kind, "name": check_name(kind, name), "actor": check_text(actor, "actor")}
    with conn.transaction():
        changed = bool(run(conn, Call("queue_pause", params, len), schema))
        record_audit(conn, actor, f"{kind}-pause", f"{kind} {name}", int(changed), schema=schema)
    return changed


def resume(conn: psycopg.Connection[Any], kind: Kind, name: str, *, actor: str, schema: str = DEFAULT_SCHEMA) -> bool:
    """Resume queue or type `name`; False when it was not paused. Audited."""
    params = {
        "kind": kind,
        "name": check_name(kind, name),
        "actor": check_text(actor, "actor"),
        "channel": statements(schema).channel,
    }
    with conn.transaction():
        changed = bool(run(conn, Call("queue_resume", params, len), schema))
        record_audit(conn, actor, f"{kind}-resume", f"{kind} {name}", int(changed), schema=schema)
    return changed


@dataclass(frozen=True, slots=True)
class LimitChange:
    changed: bool
    was: int | None  # the limit found: the one replaced, or (not changed) the one set meanwhile


def set_limit(
    conn: psycopg.Connection[Any],
    name: str,
    limit: int | None,
    *,
    actor: str,
    expected: int | None = None,
    fenced: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> LimitChange:
    """Cap how many jobs of queue `name` run at once across every worker (None: no cap).

    With `fenced`, only when its limit is still `expected` (what the operator saw). Audited,
    with the limit it replaced.
    """
    params = {
        "name": check_queue(name),
        "limit": check_limit(limit),
        "expected": expected,
        "fenced": fenced,
        "actor": check_text(actor, "actor"),
        "channel": statements(schema).channel,
    }
    with conn.transaction():
        found = run(conn, Call("queue_limit", params, lambda r: r.dicts()), schema)[0]
        change = LimitChange(bool(found["changed"]), found["was"])
        detail = {"limit": limit, "was": change.was}
        record_audit(conn, actor, "queue-limit", f"queue {name}", int(change.changed), detail=detail, schema=schema)
    return change
