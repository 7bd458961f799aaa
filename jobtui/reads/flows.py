"""The flows behind the drain forecast: once a minute the archiver records what was enqueued
and what finished since its last span, by queue and type (`queue_flow`, migration 0013;
core/history.py writes them); readers read the spans of the last minutes and forecast from
them (forecast.py). The one module that names the statements of sql/flows.sql.

    with connect(dsn, autocommit=True) as conn:
        lines = overview(conn).lines
        by_line = line_forecasts(lines, run(conn, recent_call()))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from jobtui.kernel.db import Call, Rows
from jobtui.kernel.forecast import Flows, Forecast, Span, forecast, spans


class Line(Protocol):
    """A queue's or type's line of the overview (overview.QueueLine), as a forecast reads it."""

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def due(self) -> int: ...


def _spans(rows: Rows) -> list[Span]:
    return spans(rows.dicts())


def recent_call() -> Call[list[Span]]:
    """The spans of the last minutes, oldest first (a handful of rows)."""
    return Call("flow_recent", {}, _spans)


def line_forecasts(lines: Sequence[Line], recent: list[Span]) -> dict[tuple[str, str], Forecast]:
    """The forecast of each queue's and type's due backlog, by (kind, name)."""
    flows = Flows.of(recent)
    return {(q.kind, q.name): forecast(flows, q.kind, q.name, backlog=q.due) for q in lines}
