"""The archiver's history of the queue, written once a minute by whichever worker's archiver
runs first: the row of the minute that just ended (the ready backlog counted in full, by type
and by queue, so that no reader has to; reads/backlog.py reads it) and the flow span since the
last one (what was enqueued and what finished; reads/flows.py forecasts from it). Each is
pruned after a day. The one module that names the statements of sql/history.sql.

    with connect(dsn, autocommit=True) as conn:
        record_minute(conn)
        record_flow(conn)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from jobtui.kernel.db import Call, Rows, run
from jobtui.kernel.domain import DEFAULT_SCHEMA


def _count(rows: Rows) -> int:
    return len(rows)


def record_minute(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> bool:
    """Write the row of the minute that just ended (once, whoever asks) and prune rows older
    than a day; True when this call wrote it."""
    wrote = run(conn, Call("history_minute_record", {}, _count), schema) > 0
    run(conn, Call("history_minute_prune", {}, _count), schema)
    return wrote


def record_flow(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA, until: datetime | None = None) -> bool:
    """Record the span since the last one (up to `until`, default now) and prune spans older
    than a day; True when this call recorded one."""
    wrote = run(conn, Call("history_flow_record", {"until": until}, _count), schema) > 0
    run(conn, Call("history_flow_prune", {}, _count), schema)
    return wrote
