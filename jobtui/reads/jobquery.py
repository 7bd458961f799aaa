"""The job query API: jobs by status, type, queue, age and error, newest first, a page
at a time (keyset: pass the last id seen as `before`), and how many jobs there are by status
and type. What `Client.jobs` and `Client.counts` run, and `jobtui jobs` prints.

    page = client.jobs(status="dead", type="email.send", limit=50)
    older = client.jobs(status="dead", type="email.send", limit=50, before=page[-1].id)
    depth = client.count(status="ready", queue="email")
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg

from jobtui.kernel.checks import check_pattern
from jobtui.kernel.db import Call, Rows, arun, run
from jobtui.kernel.domain import DEFAULT_SCHEMA, JobStatus
from jobtui.kernel.errors import InvalidInput, JobtuiError, first_line
from jobtui.kernel.jobfilter import JobFilter
from jobtui.kernel.safetext import quote

T = TypeVar("T")

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


def _filters(filt: JobFilter) -> dict[str, Any]:
    """The parameters of jobs_page and jobs_count: a JobFilter of statuses, types, queue and since."""
    unread = [f for f in ("error", "payload", "older_than", "newer_than") if getattr(filt, f) is not None]
    if unread:
        raise ValueError(f"the job query does not filter by {', '.join(unread)}: use search()")
    return {"statuses": list(filt.statuses) or None, "types": list(filt.types) or None, "queue": filt.queue}


def _summaries(rows: Rows) -> list[JobSummary]:
    return [JobSummary(**{**d, "status": JobStatus(d["status"])}) for d in rows.dicts()]


def jobs_call(
    filt: JobFilter, *, error: str | None = None, limit: int = 100, before: int | None = None
) -> Call[list[JobSummary]]:
    """Jobs of `filt` (its statuses, types, queue and `since`: created at or after it),
    newest (highest id) first, at most `limit`, with ids below `before` (the last id of the
    page before). `error`: a regular expression their last error matches."""
    _check_page(limit, before)
    params = {
        **_filters(filt),
        "since": filt.since,
        "error": None if error is None else check_pattern(error),
        "before": before,
        "limit": limit,
    }
    return Call("jobquery_page", params, _summaries)


def _check_page(limit: int, before: int | None) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"bad limit {quote(limit)}: give a whole number from 1 to {MAX_PAGE}")
    if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
        raise InvalidInput(f"bad before {quote(before)}: give the id of the last job of the page before")


def counts_call(filt: JobFilter) -> Call[list[JobCount]]:
    """How many jobs there are now, by status and type, among those of `filt` (its statuses,
    types and queue)."""
    if filt.since is not None:
        raise ValueError("the job counts do not filter by since")
    decode = lambda rows: [JobCount(JobStatus(d["status"]), d["type"], d["jobs"]) for d in rows.dicts()]  # noqa: E731
    return Call("jobquery_count", _filters(filt), decode)


def _bad_pattern(call: Call[Any], exc: psycopg.errors.InvalidRegularExpression) -> InvalidInput:
    pattern = call.params.get("error") or call.params.get("matcher")
    return InvalidInput(f"bad error pattern {quote(pattern)}: {first_line(exc)}; it is a regular expression")


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


# -- the jobs search: any filter, the payload's included, window by window ---------------------

FIRST_WINDOW = 20_000  # ids of the first window; each next one is twice as wide
MAX_WINDOW = 1_000_000
SEARCH_TIMEOUT = 30.0  # seconds one statement of a search may take before the server ends it


class SearchCancelled(JobtuiError):
    """The search was stopped before it reached the end (the operator asked, or the time was up)."""

    def __init__(self, message: str, scanned: float) -> None:
        super().__init__(message)
        self.scanned = scanned


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A page of the search, and how many jobs match as far as it read."""

    jobs: list[JobSummary]  # newest first, at most the page's limit
    more: bool  # more jobs match, older than the page's last
    matched: int  # jobs found to match: all of them when `complete`, else at least so many
    complete: bool
    scanned: float  # the share of the ids read, 0 to 1
    indexed: bool  # the payload's GIN index served it

    def said(self) -> str:
        """`50 of at least 51`, `12 of 12`: the page against what is known of the rest."""
        shown = len(self.jobs)
        if self.complete:
            return f"{shown:,} of {self.matched:,}"
        return f"{shown:,} of at least {self.matched:,}"


@dataclass
class Windows:
    """The windows of ids a search reads, from the top down: small at first (the newest
    jobs come quickly), twice as wide each time; one window when an index serves the filter."""

    lowest: int
    top: int  # the first window ends below this id
    whole: bool
    size: int = 0
    below: int = 0

    def __post_init__(self) -> None:
        self.below = self.top
        self.size = self.size or FIRST_WINDOW

    @classmethod
    def of(cls, bounds: dict[str, Any], before: int | None, filt: JobFilter) -> Windows:
        lowest = int(bounds["lowest"] or 0)
        top = int(bounds["highest"] or 0) + 1 if before is None else before
        return cls(lowest, top, filt.payload is not None and bool(bounds["payload_index"]))

    def next(self) -> tuple[int, int] | None:
        """(floor, below) of the next window, None at the end."""
        if self.below <= self.lowest:
            return None
        floor = self.lowest if self.whole else max(self.lowest, self.below - self.size)
        return floor, self.below

    def done_with(self, floor: int) -> None:
        self.below = floor
        self.size = min(MAX_WINDOW, self.size * 2)

    def read(self, window: tuple[int, int], got: Sequence[JobSummary], asked: int) -> bool:
        """After a window's page: True when it was cut short by its limit (the ids below its
        last job are not read yet)."""
        if len(got) >= asked and got:
            self.below = got[-1].id
            return True
        self.done_with(window[0])
        return False

    @property
    def scanned(self) -> float:
        span = self.top - self.lowest
        return 1.0 if span <= 0 else (self.top - self.below) / span


Progress = Callable[[float, int], None]  # (share scanned, jobs found so far)


def _scan_params(filt: JobFilter, error: str | None, floor: int, below: int, limit: int) -> dict[str, Any]:
    return {**filt.params(), "error": error, "floor": floor, "below": below, "limit": limit}


def timeout_call(timeout: float) -> Call[None]:
    """For the rest of its transaction, the server cancels each statement after `timeout`
    seconds (a search's, a bulk action's; nothing outlives the transaction behind a pooler)."""
    return Call("jobquery_timeout", {"timeout": f"{max(1, round(timeout * 1000))}ms"}, lambda rows: None)


def _stopped(exc: psycopg.errors.QueryCanceled, windows: Windows, timeout: float) -> SearchCancelled:
    if "timeout" in str(exc):
        return SearchCancelled(
            f"a window of the search took over {timeout:g}s and was ended (the statement timeout): narrow the"
            " filter, or add the payload index (`jobtui index payload`)",
            windows.scanned,
        )
    return SearchCancelled(f"the search was cancelled at {windows.scanned:.0%} of the table", windows.scanned)


def _timed(conn: psycopg.Connection[Any], call: Call[T], schema: str, timeout: float) -> T:
    """`call` in a transaction of its own that the server ends after `timeout` seconds."""
    with conn.transaction():
        run(conn, timeout_call(timeout), schema)
        result: T = query(conn, call, schema)
        return result


def _windows(
    conn: psycopg.Connection[Any], schema: str, before: int | None, filt: JobFilter, timeout: float
) -> Windows:
    try:
        return Windows.of(_timed(conn, bounds_call(schema), schema, timeout), before, filt)
    except psycopg.errors.QueryCanceled as exc:
        raise _stopped(exc, Windows(0, 0, False), timeout) from None


def bounds_call(schema: str) -> Call[dict[str, Any]]:
    """The lowest and highest job id, and whether the payload index is there and valid."""
    return Call("jobquery_bounds", {"schema_name": schema}, lambda rows: rows.dicts()[0])


def search(
    conn: psycopg.Connection[Any],
    filt: JobFilter,
    *,
    error: str | None = None,
    limit: int = 100,
    before: int | None = None,
    schema: str = DEFAULT_SCHEMA,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    timeout: float = SEARCH_TIMEOUT,
) -> SearchResult:
    """A page of the jobs of `filt` (and `error`, the pattern of `jobs --error`), newest
    first, below id `before`: read window by window, each statement under `timeout`, with
    `progress` after each window; `stop` set (or `conn.cancel()` from another thread) ends it
    with SearchCancelled."""
    _check_page(limit, before)
    windows = _windows(conn, schema, before, filt, timeout)
    found: list[JobSummary] = []
    cut = False
    while len(found) <= limit and (window := windows.next()) is not None:
        if stop is not None and stop.is_set():
            raise SearchCancelled(f"the search was cancelled at {windows.scanned:.0%} of the table", windows.scanned)
        asked = limit + 1 - len(found)
        call = Call("jobquery_scan", _scan_params(filt, error, *window, asked), _summaries)
        try:
            got = _timed(conn, call, schema, timeout)
        except psycopg.errors.QueryCanceled as exc:
            raise _stopped(exc, windows, timeout) from None
        found += got
        cut = windows.read(window, got, asked)
        if progress is not None:
            progress(windows.scanned, len(found))
    return _result(found, limit, cut, windows)


def search_count(
    conn: psycopg.Connection[Any],
    filt: JobFilter,
    *,
    error: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    timeout: float = SEARCH_TIMEOUT,
) -> list[JobCount]:
    """How many jobs of `filt` there are, by status and type, window by window as `search`."""
    windows = _windows(conn, schema, None, filt, timeout)
    counts: dict[tuple[str, str], int] = {}
    while (window := windows.next()) is not None:
        if stop is not None and stop.is_set():
            raise SearchCancelled(f"the count was cancelled at {windows.scanned:.0%} of the table", windows.scanned)
        call = Call("jobquery_scan_count", _scan_params(filt, error, *window, 0), Rows.dicts)
        try:
            rows = _timed(conn, call, schema, timeout)
        except psycopg.errors.QueryCanceled as exc:
            raise _stopped(exc, windows, timeout) from None
        for r in rows:
            counts[(r["status"], r["type"])] = counts.get((r["status"], r["type"]), 0) + int(r["jobs"])
        windows.done_with(window[0])
        if progress is not None:
            progress(windows.scanned, sum(counts.values()))
    return [JobCount(JobStatus(s), t, n) for (s, t), n in sorted(counts.items())]


async def asearch(
    conn: psycopg.AsyncConnection[Any],
    filt: JobFilter,
    *,
    error: str | None = None,
    limit: int = 100,
    before: int | None = None,
    schema: str = DEFAULT_SCHEMA,
    timeout: float = SEARCH_TIMEOUT,
) -> SearchResult:
    """Async counterpart of `search` (without progress: cancel the task to stop it)."""
    _check_page(limit, before)
    async with conn.transaction():
        await arun(conn, timeout_call(timeout), schema)
        bounds = await arun(conn, bounds_call(schema), schema)
    windows = Windows.of(bounds, before, filt)
    found: list[JobSummary] = []
    cut = False
    while len(found) <= limit and (window := windows.next()) is not None:
        asked = limit + 1 - len(found)
        call = Call("jobquery_scan", _scan_params(filt, error, *window, asked), _summaries)
        try:
            async with conn.transaction():
                await arun(conn, timeout_call(timeout), schema)
                got = await aquery(conn, call, schema)
        except psycopg.errors.QueryCanceled as exc:
            raise _stopped(exc, windows, timeout) from None
        found += got
        cut = windows.read(window, got, asked)
    return _result(found, limit, cut, windows)


def _result(found: list[JobSummary], limit: int, cut: bool, windows: Windows) -> SearchResult:
    # Complete when the last window was read to its floor and it was the last one.
    complete = not cut and windows.next() is None
    return SearchResult(found[:limit], len(found) > limit, len(found), complete, windows.scanned, windows.whole)
