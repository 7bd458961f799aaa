"""The operator's actions on jobs: requeue, kill a lease, cancel (the jobs they pick by
error come from `reads/deadletters.py`).

Each is a `Call` (or a function on a connection) that the clients run with an audit row in
the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobtui.kernel.db import Call, int_list, statements
from jobtui.kernel.domain import DEFAULT_SCHEMA


def requeue_call(ids: Sequence[int], actor: str) -> Call[list[int]]:
    return Call("requeue_by_id", {"ids": list(ids), "actor": actor}, int_list)


def kill_lease_call(ids: Sequence[int], actor: str) -> Call[list[int]]:
    return Call("kill_lease", {"ids": list(ids), "actor": actor}, int_list)


def cancel_call(ids: Sequence[int], actor: str, schema: str = DEFAULT_SCHEMA) -> Call[list[int]]:
    """Cancel ready or running jobs; a running job's worker is told on the schema's channel."""
    params = {"ids": list(ids), "actor": actor, "channel": statements(schema).channel}
    return Call("cancel", params, int_list)
