"""The payload's GIN index (`jobtui index payload`): its state, building it and dropping it
without blocking enqueues or claims (CONCURRENTLY: outside a transaction, by the role that
owns the job table), and how far a build is. The one module that names the statements of
sql/payloadindex.sql.

    if not state(conn, schema):
        create(conn, schema)
"""

from __future__ import annotations

from typing import Any

import psycopg

from jobtui.kernel.db import Call, Rows, run


def _nothing(rows: Rows) -> None:
    return None


def state(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    """The index as a row (`valid`, `bytes`), or no row when there is none."""
    return run(conn, Call("payload_index_state", {"schema_name": schema}, Rows.dicts), schema)


def create(conn: psycopg.Connection[Any], schema: str) -> None:
    """Build the index concurrently (`conn` in autocommit); a no-op when it exists."""
    run(conn, Call("payload_index_create", {}, _nothing), schema)


def drop(conn: psycopg.Connection[Any], schema: str) -> None:
    """Drop the index concurrently (`conn` in autocommit), if there is one."""
    run(conn, Call("payload_index_drop", {}, _nothing), schema)


def progress(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    """How far a build of the index is, asked from another session: one row while it runs."""
    return run(conn, Call("payload_index_progress", {"schema_name": schema}, Rows.dicts), schema)
