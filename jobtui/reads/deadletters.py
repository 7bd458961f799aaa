"""The one matcher of dead and failed jobs behind `jobtui dead --error`, `jobtui requeue
--error` and the console's dead groups, and the check of its pattern."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobtui.kernel.checks import check_pattern, check_text
from jobtui.kernel.db import Call, first_line, run, statements
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote


def dead_matching(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    *,
    job_type: str | None = None,
    error: str | None = None,
    group: tuple[str, str | None] | None = None,
    with_ids: bool = False,
) -> list[dict[str, Any]]:
    """The dead and failed jobs of `job_type` whose error matches `error`, grouped by status,
    type and error fingerprint (`group`: only the (status, fingerprint) group of the type),
    largest group first; with their ids when `with_ids`.

    The one matcher behind `jobtui dead --error`, `jobtui requeue --error` (and its dry run)
    and the console's dead groups: a case-insensitive PostgreSQL regular expression on the
    error's first line or its fingerprint (sql/deadletters.sql, deadletter_matching). Check the pattern
    with `check_regex` first for a one-line error.
    """
    if job_type is not None:
        check_text(job_type, "job type")
    if error is not None:
        check_pattern(error, "--error pattern")
    status, fingerprint = group or (None, None)
    params = {
        "type": job_type,
        "error": error,
        "status": status,
        "in_group": group is not None,
        "fingerprint": fingerprint or None,
        "with_ids": with_ids,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statements(schema)["deadletter_matching"], params)
        return cur.fetchall()


def matching_ids(groups: list[dict[str, Any]]) -> list[int]:
    """The ids of `dead_matching` groups read with their ids, in id order."""
    return sorted(int(i) for g in groups for i in g["job_ids"])


def check_regex(conn: psycopg.Connection[Any], pattern: str | None, schema: str = DEFAULT_SCHEMA) -> None:
    """InvalidInput unless PostgreSQL, which does the matching, accepts `pattern`."""
    if pattern is None:
        return
    check_pattern(pattern, "--error pattern")
    if not pattern:
        raise InvalidInput("--error '' matches every job: give a pattern, or --all for every dead/failed job")
    try:
        run(conn, Call("deadletter_regex_check", {"pattern": pattern}, lambda rows: None), schema)
    except psycopg.errors.InvalidRegularExpression as exc:
        first = first_line(exc)
        raise InvalidInput(f"bad --error pattern {quote(pattern)}: {first}; it is a regular expression") from None
