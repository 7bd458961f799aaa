"""Fleet-wide pauses, global concurrency limits and rates of queues and types: the operator's
levers during an incident (their figures are in overview.py).

A pause, a limit or a rate is a row of `queue_control` that every worker's claim statement reads
itself (sql/claims.sql, claim_take), so it holds on every worker from its next claim and across
restarts. Each change runs with its audit row in one transaction (`audit.operate`).

    with connect(dsn) as conn:
        pause(conn, "queue", "emails", actor="alice@host")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import psycopg

from jobtui.core.audit import Audit, Recorded, operate
from jobtui.kernel.checks import check_queue, check_text, check_type
from jobtui.kernel.db import Call, statements
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.rates import check_rate

Kind = Literal["queue", "type"]
KINDS: tuple[Kind, ...] = ("queue", "type")
MAX_LIMIT = 1_000_000  # as the table's check says
V = TypeVar("V")


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
    call = Call("queue_pause", params, lambda rows: bool(len(rows)))
    return operate(
        conn, call, Audit(actor, f"{kind}-pause", f"{kind} {name}"), lambda changed: Recorded(int(changed)), schema
    )


MAX_RAMP = 86_400.0


def check_ramp(ramp: float | None) -> float | None:
    if ramp is not None and (isinstance(ramp, bool) or not isinstance(ramp, (int, float)) or not 0 < ramp <= MAX_RAMP):
        raise InvalidInput(f"a ramp must be more than 0 and at most {MAX_RAMP:.0f} seconds (1d), got {ramp!r}")
    return None if ramp is None else float(ramp)


def resume(
    conn: psycopg.Connection[Any],
    kind: Kind,
    name: str,
    *,
    actor: str,
    ramp: float | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> bool:
    """Resume queue or type `name`; False when it was not paused. With `ramp` (seconds), its
    rate rises over that time instead of letting its backlog in at once. Audited."""
    params = {
        "kind": kind,
        "name": check_name(kind, name),
        "actor": check_text(actor, "actor"),
        "channel": statements(schema).channel,
        "ramp": check_ramp(ramp),
    }
    detail = {"ramp_seconds": ramp} if ramp is not None else None
    call = Call("queue_resume", params, lambda rows: bool(len(rows)))
    audit = Audit(actor, f"{kind}-resume", f"{kind} {name}")
    return operate(conn, call, audit, lambda changed: Recorded(int(changed), detail=detail), schema)


@dataclass(frozen=True, slots=True)
class LeverChange(Generic[V]):
    """A fenced change of a limit or a rate: whether it was written, and the value found (the
    one replaced, or, not changed, the one set meanwhile)."""

    changed: bool
    was: V | None


def _set_lever(
    conn: psycopg.Connection[Any],
    statement: str,
    params: dict[str, Any],
    audit: Audit,
    detail: dict[str, Any],
    schema: str,
) -> LeverChange[Any]:
    """Run a limit's or a rate's statement with its audit row, which records the value it
    replaced beside `detail`."""
    params = {**params, "actor": check_text(audit.actor, "actor"), "channel": statements(schema).channel}
    call = Call(statement, params, lambda rows: _change_of(rows.dicts()[0]))
    return operate(
        conn, call, audit, lambda change: Recorded(int(change.changed), detail={**detail, "was": change.was}), schema
    )


def _change_of(row: dict[str, Any]) -> LeverChange[Any]:
    return LeverChange(bool(row["changed"]), row["was"])


def set_limit(
    conn: psycopg.Connection[Any],
    name: str,
    limit: int | None,
    *,
    actor: str,
    expected: int | None = None,
    fenced: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> LeverChange[int]:
    """Cap how many jobs of queue `name` run at once across every worker (None: no cap).

    With `fenced`, only when its limit is still `expected` (what the operator saw). Audited,
    with the limit it replaced.
    """
    params = {"name": check_queue(name), "limit": check_limit(limit), "expected": expected, "fenced": fenced}
    audit = Audit(actor, "queue-limit", f"queue {name}")
    return _set_lever(conn, "queue_limit_set", params, audit, {"limit": limit}, schema)


def set_rate(
    conn: psycopg.Connection[Any],
    kind: Kind,
    name: str,
    rate: float | None,
    *,
    actor: str,
    expected: float | None = None,
    fenced: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> LeverChange[float]:
    """Let at most `rate` jobs per second of queue or type `name` be claimed, across every
    worker (None: no rate). With `fenced`, only when its rate is still `expected` (what the
    operator saw). Audited."""
    params = {"kind": kind, "name": check_name(kind, name), "rate": check_rate(rate)}
    params |= {"expected": expected, "fenced": fenced}
    audit = Audit(actor, f"{kind}-rate", f"{kind} {name}")
    return _set_lever(conn, "queue_rate_set", params, audit, {"rate_per_second": rate}, schema)
