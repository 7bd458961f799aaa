"""The flows behind the drain forecast: once a minute the archiver records what was enqueued
and what finished since its last span, by queue and type (`queue_flow`, migration 0013);
readers read the spans of the last minutes and forecast from them (forecast.py). The archiver
writes the spans (core/history.py); this module reads them.

    with connect(dsn, autocommit=True) as conn:
        lines = overview(conn).lines
        by_line = line_forecasts(lines, run(conn, recent_call()))
"""

from __future__ import annotations

from collections.abc import Sequence

from jobtui.kernel.db import Call
from jobtui.kernel.forecast import Flows, Forecast, Span, forecast
from jobtui.reads.metrics import flows_call
from jobtui.reads.overview import QueueLine


def recent_call() -> Call[list[Span]]:
    """The spans of the last minutes, oldest first (a handful of rows)."""
    return flows_call()


def line_forecasts(lines: Sequence[QueueLine], recent: list[Span]) -> dict[tuple[str, str], Forecast]:
    """The forecast of each queue's and type's due backlog, by (kind, name)."""
    flows = Flows.of(recent)
    return {(q.kind, q.name): forecast(flows, q.kind, q.name, backlog=q.due) for q in lines}
