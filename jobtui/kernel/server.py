"""What jobtui asks the server itself: its clock, which every time of the queue is read by,
and whether this session may write. The one module that names the statements of
sql/server.sql.

    with connect(dsn) as conn:
        now, read_only = run(conn, now_call()), run(conn, read_only_call())
"""

from __future__ import annotations

from datetime import datetime

from jobtui.kernel.db import Call, Rows


def _now(rows: Rows) -> datetime:
    now: datetime = rows.dicts()[0]["now"]
    return now


def now_call() -> Call[datetime]:
    """The database's now(): the clock of every lease, delay and schedule, and the cheapest
    statement that proves a connection answers."""
    return Call("server_now", {}, _now)


def read_only_call() -> Call[bool]:
    """Whether this session may not write: a hot standby, or a read-only default."""
    return Call("server_read_only", {}, lambda rows: bool(rows.dicts()[0]["read_only"]))
