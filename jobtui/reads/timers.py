"""What runs on a timer, by name: every statement the console sends while it refreshes (its
panes every second, its drill-downs and job detail every second while open), and those of
`jobtui stats` (each `--watch` round), `jobtui queue list`, each Prometheus scrape, and the
claim of the slot every worker keeps for jobtui's own jobs.

None of them may read a number of rows that grows with the ready backlog: an operator opens
the console during an incident, when the backlog is at its biggest and the database has the
least to spare. `tests/integration/test_timer_guard.py` runs every one of these paths on a big
backlog and on a small one, and fails when a statement reads more pages than a fixed bound,
or when a path sends a statement that is not named here.

The paths read through `watched(conn, schema)`: a connection whose every statement must be
named in TIMED, so a statement cannot run on a timer without the guard measuring it. To add
one, add its name to TIMED, with who runs it; that is all the guard needs.

    with watched(connect(dsn, autocommit=True), schema) as conn:
        view, snap = overview.read_with_snapshot(conn, schema)
"""

from __future__ import annotations

from functools import cache
from typing import Any

import psycopg
from psycopg import sql

from jobtui.kernel.db import query_names, statements

# Name of a statement of sql/ -> who runs it on a timer.
TIMED: dict[str, str] = {
    # The console's connection, once per connection (and after each reconnect).
    "console_session": "the console: its statement timeout, and who and where it reads",
    # The snapshot: stats, the console's header and panes, the Prometheus scrape.
    "metrics_lock_timeout": "snapshot",
    "server_now": "snapshot",
    # Not each read: once per new connection of the console's refreshes.
    "connection_tcp_bound": "a new connection: the server's end bounded as the client's (no table read)",
    # (Its ready jobs by type are the queue overview's, read beside it: overview.read_with_snapshot.)
    "metrics_ready_size": "snapshot: the oldest age and the planner's estimate",
    "metrics_minutes": "snapshot: the archiver's minute rows of the last hour",
    "metrics_running": "snapshot",
    "metrics_dead": "snapshot",
    "metrics_done_minutes": "snapshot",
    "metrics_dead_attempts": "snapshot",
    "metrics_day": "snapshot",
    "metrics_lease_expiries": "snapshot",
    "metrics_lease_expiry_total": "snapshot",
    "metrics_recent_expiries": "snapshot",
    "metrics_schedules": "snapshot",
    "metrics_tables": "snapshot",
    "metrics_key_window": "snapshot: the archiver's schedule row, by its name",
    "metrics_lock_waits": "snapshot",
    "metrics_oldest_xact": "snapshot",
    "metrics_recovery": "snapshot",
    # The queues and types: the header's findings, the Queues pane, `queue list`, `stats`, the
    # scrape (overview.py).
    "overview_backlog": "queue overview, and the snapshot's ready jobs by type: counted up to backlog.READY_EXACT_CAP",
    "overview_done": "queue overview: done in the last minute (not the header's), up to backlog.DONE_SAMPLE + 1 rows",
    "overview_estimate": "queue overview above the cap: the archiver's minute row, the planner",
    "flow_recent": "the drain forecast: the archiver's flow spans of the last minutes (snapshot, queue list)",
    # The console's lists.
    "joblist_running": "console: the Running pane's page",
    "deadletter_regex_check": "console: the filter, checked",
    "deadletter_matching": "console: the dead groups the filter matches; a group's ids before a requeue",
    "joblist_ready": "console: a type's ready jobs (drill-down)",
    "joblist_dead_group": "console: a dead group's jobs (drill-down)",
    "job_get": "console: one job explained (detail)",
    # The fleet: the Workers pane, the header's findings, the scrape (reads/fleet.py).
    "fleet_list": "the fleet's processes: the Workers pane and the header (console), the scrape",
    # Why the backlog grows: the console's Why pane and header (while the oldest wait is past
    # the warning age), `jobtui why` (reads/why.py).
    "why_waiting": "why: the first due jobs and the first not due, by queue and type (heads of the ready index)",
    "why_running": "why: the running jobs by worker, queue and type",
    "why_run_times": "why: run times of a sample of done jobs, the last 5 minutes and the hour before",
    "why_expiries": "why: the newest lease expiries by type (crash loops)",
    "why_pauses": "why: the paused queues and types, with their audit rows",
    "why_claims": "why: the claims the database runs now",
    # Every worker, every poll, whatever queues it serves.
    "claim_take_builtin": "worker: the slot for jobtui's own jobs (the archiver's), through their own index",
}


class UnlistedStatement(RuntimeError):
    """A statement sent on a timer that TIMED does not name: a defect of jobtui, not of the data."""


@cache
def _names(schema: str) -> dict[str, str]:
    """Each statement's text as sent on `schema`, to its name."""
    stmts = statements(schema)
    return {stmts[name].as_string(None): name for name in query_names()}


def statement_name(query: Any, schema: str) -> str | None:
    """The statement name of `query` as sent on `schema`, or None for text of elsewhere."""
    text = query.as_string(None) if isinstance(query, sql.SQL) else query if isinstance(query, str) else None
    return None if text is None else _names(schema).get(text)


_cursors: dict[tuple[str, type[psycopg.Cursor[Any]]], type[psycopg.Cursor[Any]]] = {}


def _cursor(schema: str, base: type[psycopg.Cursor[Any]]) -> type[psycopg.Cursor[Any]]:
    """A cursor class like `base` that refuses what TIMED does not name (one per schema and base)."""
    made = _cursors.get((schema, base))
    if made is not None:
        return made

    class TimedCursor(base):  # type: ignore[valid-type,misc]
        """Refuses a statement that TIMED does not name."""

        def execute(self, query: sql.Composable | bytes | str, params: Any = None, **kwargs: Any) -> Any:
            name = statement_name(query, schema)
            if name not in TIMED:
                raise UnlistedStatement(
                    f"statement {name or str(query)[:40]!r} runs on a timer but jobtui.reads.timers.TIMED"
                    " does not name it; add it there, and the timer guard measures it"
                )
            return super().execute(query, params, **kwargs)

    _cursors[(schema, base)] = TimedCursor
    return TimedCursor


def watched(conn: psycopg.Connection[Any], schema: str) -> psycopg.Connection[Any]:
    """`conn`, from now on refusing any statement TIMED does not name."""
    conn.cursor_factory = _cursor(statements(schema).schema, conn.cursor_factory)
    return conn
