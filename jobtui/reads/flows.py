"""The flows behind the drain forecast: once a minute the archiver records what was enqueued
and what finished since its last span, by queue and type (`queue_flow`, migration 0013);
readers read the spans of the last minutes and forecast from them (forecast.py).

    with connect(dsn, autocommit=True) as conn:
        record_flow(conn)
        lines = overview(conn).lines
        by_line = line_forecasts(lines, run(conn, recent_call()))
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from jobtui.kernel.db import Call, Rows, run
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.forecast import Flows, Forecast, Span, forecast, spans
from jobtui.reads.overview import QueueLine


def record_flow(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA, until: datetime | None = None) -> bool:
    """Record the span since the last one (up to `until`, default now) and prune spans older
    than a day; True when this call recorded one."""
    wrote = run(conn, Call("queue_flow_record", {"until": until}, len), schema) > 0
    run(conn, Call("queue_flow_prune", {}, len), schema)
    return wrote


def _spans(rows: Rows) -> list[Span]:
    return spans(rows.dicts())


def recent_call() -> Call[list[Span]]:
    """The spans of the last minutes, oldest first (a handful of rows)."""
    return Call("queue_flow_recent", {}, _spans)


def line_forecasts(lines: Sequence[QueueLine], recent: list[Span]) -> dict[tuple[str, str], Forecast]:
    """The forecast of each queue's and type's due backlog, by (kind, name)."""
    flows = Flows.of(recent)
    return {(q.kind, q.name): forecast(flows, q.kind, q.name, backlog=q.due) for q in lines}
