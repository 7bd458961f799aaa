"""A reading connection's session, as the console and `jobtui why` open it: a timeout for
every later statement, and who and where it reads (the role, the database, a standby or a
read-only server). The one module that names the statements of sql/console.sql.

    identity = run(conn, session_call(2.0, local=False))
"""

from __future__ import annotations

from typing import Any

from jobtui.kernel.db import Call, Rows


def _first(rows: Rows) -> dict[str, Any]:
    return rows.dicts()[0]


def session_call(timeout: float, *, local: bool) -> Call[dict[str, Any]]:
    """The session's first statement: every later one times out after `timeout` seconds (in
    each transaction only, `local`, behind a transaction pooler); its row says who and where."""
    return Call("console_session", {"statement_timeout": f"{round(timeout * 1000)}ms", "local": local}, _first)
