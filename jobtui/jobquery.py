"""The job query API: jobs by status, type, queue, age and error, newest first, a page
at a time (keyset: pass the last id seen as `before`), and how many jobs there are by status
and type. What `Queue.jobs` and `Queue.counts` run, and `jobtui jobs` prints.

    page = queue.jobs(status="dead", type="email.send", limit=50)
    older = queue.jobs(status="dead", type="email.send", limit=50, before=page[-1].id)
    depth = queue.count(status="ready", queue="email")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from .checks import check_queue, check_run_at, check_text
from .db import Call, Rows, arun, run
from .domain import DEFAULT_SCHEMA, JobStatus
from .errors import InvalidInput
from .safetext import quote

MAX_PAGE = 1000


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job as a list shows it; `last_error` is the first line of the newest error."""

    id: int
    type: str
    queue: str
    status: JobStatus
    attempts: int
    max_attempts: int | None
    key: str | None
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    last_error: str


@dataclass(frozen=True, slots=True)
class JobCount:
    status: JobStatus
    type: str
    jobs: int


def _statuses(status: str | Sequence[str] | None) -> list[str] | None:
    if status is None:
        return None
    chosen = [status] if isinstance(status, str) else list(status)
    try:
        return [JobStatus(s).value for s in chosen]
    except ValueError:
        known = ", ".join(s.value for s in JobStatus)
        raise InvalidInput(f"unknown status in {quote(status)}: use {known}") from None


def _texts(value: str | Sequence[str] | None, what: str) -> list[str] | None:
    if value is None:
        return None
    return [check_text(v, what) for v in ([value] if isinstance(value, str) else value)]


def _filters(status: Any, type: Any, queue: str | None) -> dict[str, Any]:
    return {
        "statuses": _statuses(status),
        "types": _texts(type, "job type"),
        "queue": None if queue is None else check_queue(queue),
    }


def _summaries(rows: Rows) -> list[JobSummary]:
    return [JobSummary(**{**d, "status": JobStatus(d["status"])}) for d in rows.dicts()]


def jobs_call(
    *,
    status: str | Sequence[str] | None = None,
    type: str | Sequence[str] | None = None,
    queue: str | None = None,
    since: datetime | None = None,
    error: str | None = None,
    limit: int = 100,
    before: int | None = None,
) -> Call[list[JobSummary]]:
    """Jobs matching every filter given, newest (highest id) first, at most `limit`, with
    ids below `before` (the last id of the page before). `since`: created at or after it;
    `error`: a regular expression their last error matches."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"bad limit {quote(limit)}: give a whole number from 1 to {MAX_PAGE}")
    if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
        raise InvalidInput(f"bad before {quote(before)}: give the id of the last job of the page before")
    params = {
        **_filters(status, type, queue),
        "since": check_run_at(since),
        "error": None if error is None else check_text(error, "error pattern"),
        "before": before,
        "limit": limit,
    }
    return Call("jobs_page", params, _summaries)


def counts_call(
    *, status: str | Sequence[str] | None = None, type: str | Sequence[str] | None = None, queue: str | None = None
) -> Call[list[JobCount]]:
    """How many jobs there are now, by status and type, among those matching the filters."""
    decode = lambda rows: [JobCount(JobStatus(d["status"]), d["type"], d["jobs"]) for d in rows.dicts()]  # noqa: E731
    return Call("jobs_count", _filters(status, type, queue), decode)


def _bad_pattern(call: Call[Any], exc: psycopg.errors.InvalidRegularExpression) -> InvalidInput:
    first = str(exc).strip().splitlines()[0]
    return InvalidInput(f"bad error pattern {quote(call.params.get('error'))}: {first}; it is a regular expression")


def query(conn: psycopg.Connection[Any], call: Call[Any], schema: str = DEFAULT_SCHEMA) -> Any:
    """Run a call of this module; a bad `error` pattern is InvalidInput."""
    try:
        return run(conn, call, schema)
    except psycopg.errors.InvalidRegularExpression as exc:
        raise _bad_pattern(call, exc) from None


async def aquery(conn: psycopg.AsyncConnection[Any], call: Call[Any], schema: str = DEFAULT_SCHEMA) -> Any:
    try:
        return await arun(conn, call, schema)
    except psycopg.errors.InvalidRegularExpression as exc:
        raise _bad_pattern(call, exc) from None
