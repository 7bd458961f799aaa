"""The operator's actions on jobs: requeue, kill a lease, cancel (the jobs they pick by
error come from `reads/deadletters.py`).

Each runs on a connection through `audit.operate`: the change and its audit row in one
transaction. The clients (`Client.requeue` and the others), and through them the console and
the CLI, call these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from jobtui.core.audit import Audit, Recorded, changed_jobs, moved, operate
from jobtui.kernel.db import Call, int_list, run, statements
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import InvalidInput
from jobtui.reads.deadletters import dead_matching, matching_ids


def requeue_call(ids: Sequence[int], actor: str) -> Call[list[int]]:
    return Call("action_requeue_by_id", {"ids": list(ids), "actor": actor}, int_list)


def kill_lease_call(ids: Sequence[int], actor: str, tokens: Sequence[int] | None = None) -> Call[list[int]]:
    """With `tokens` (each id's lease token), only the attempts holding them are killed."""
    if tokens is not None and len(tokens) != len(ids):
        raise InvalidInput("kill_lease: give one lease token per id")
    params = {"ids": list(ids), "actor": actor, "tokens": None if tokens is None else list(tokens)}
    return Call("action_lease_kill", params, int_list)


def cancel_call(ids: Sequence[int], actor: str, schema: str = DEFAULT_SCHEMA) -> Call[list[int]]:
    """Cancel ready or running jobs; a running job's worker is told on the schema's channel."""
    params = {"ids": list(ids), "actor": actor, "channel": statements(schema).channel}
    return Call("action_cancel", params, int_list)


def requeue(
    conn: psycopg.Connection[Any], ids: Sequence[int], *, actor: str, schema: str = DEFAULT_SCHEMA
) -> list[int]:
    """Move dead or failed jobs back to ready; the ids moved. Audited."""
    return operate(conn, requeue_call(ids, actor), Audit(actor, "requeue", ids_target(ids)), moved, schema)


def requeue_matching(
    conn: psycopg.Connection[Any],
    *,
    job_type: str | None,
    error: str | None,
    actor: str,
    schema: str = DEFAULT_SCHEMA,
) -> list[int]:
    """Requeue every dead or failed job of `job_type` whose error matches `error` (a pattern
    `check_regex` accepted), as found in the same transaction. Audited."""

    def matched_then_requeued(c: psycopg.Connection[Any]) -> list[int]:
        ids = matching_ids(dead_matching(c, schema, job_type=job_type, error=error, with_ids=True))
        return run(c, requeue_call(ids, actor), schema) if ids else []

    audit = Audit(actor, "requeue", match_target(job_type, error))
    return operate(conn, matched_then_requeued, audit, moved, schema)


def record_dry_run(
    conn: psycopg.Connection[Any],
    found: int,
    *,
    job_type: str | None,
    error: str | None,
    actor: str,
    schema: str = DEFAULT_SCHEMA,
) -> None:
    """Audit a requeue's dry run that found `found` jobs; nothing changes."""
    audit = Audit(actor, "requeue-dry-run", match_target(job_type, error))
    operate(conn, lambda c: None, audit, lambda _: Recorded(found), schema)


def requeue_dead_group(
    conn: psycopg.Connection[Any],
    status: str,
    job_type: str,
    fingerprint: str | None,
    *,
    actor: str,
    ids: Sequence[int] | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[int]:
    """Requeue one dead-letter group (status, type, error fingerprint): the given `ids` of
    it (one that left the group since is left alone), or else every job in it now. Audited."""

    def requeued(c: psycopg.Connection[Any]) -> list[int]:
        chosen = list(ids) if ids is not None else None
        if chosen is None:
            groups = dead_matching(c, schema, job_type=job_type, group=(status, fingerprint), with_ids=True)
            chosen = matching_ids(groups)
        params = {"ids": chosen, "status": status, "type": job_type, "fingerprint": fingerprint, "actor": actor}
        return run(c, Call("action_dead_group_requeue", params, int_list), schema) if chosen else []

    audit = Audit(actor, "requeue", f"{status} group type={job_type} error={fingerprint or '-'}")
    return operate(conn, requeued, audit, moved, schema)


def kill_lease(
    conn: psycopg.Connection[Any],
    ids: Sequence[int],
    *,
    actor: str,
    schema: str = DEFAULT_SCHEMA,
    tokens: Sequence[int] | None = None,
) -> list[int]:
    """Return running jobs to ready now (dead after their last attempt); their workers' late
    outcomes are rejected. With `tokens`, only the attempts holding them. Audited."""
    call = kill_lease_call(ids, actor, tokens)
    return operate(conn, call, Audit(actor, "kill-lease", ids_target(ids)), moved, schema)


def cancel(conn: psycopg.Connection[Any], ids: Sequence[int], *, actor: str, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Mark ready or running jobs failed. Audited."""
    call = cancel_call(ids, actor, schema)
    return operate(conn, call, Audit(actor, "cancel", ids_target(ids)), changed_jobs, schema)


def match_target(job_type: str | None, error: str | None) -> str:
    return f"type={job_type or '*'} error={error or '*'}"


def ids_target(ids: Sequence[int]) -> str:
    shown = ",".join(str(i) for i in list(ids)[:20])
    return f"jobs {shown}{'...' if len(ids) > 20 else ''}"
