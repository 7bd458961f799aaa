"""What became of an attempt, and how a handler's exception reads in the job's history."""

from __future__ import annotations

import enum
import logging
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, assert_never

from jobtui.core.claims import RELEASE_KINDS
from jobtui.core.registry import Permanent, Retry
from jobtui.kernel.db import is_connection_error
from jobtui.kernel.logformat import job_fields

if TYPE_CHECKING:
    from jobtui.core.registry import Job


class Outcome(enum.Enum):
    """What became of an attempt, and so which statement records it."""

    COMPLETE = "complete"
    PERMANENT = "permanent"  # the handler raised Permanent: failed for good
    FAIL = "fail"  # a counted failure: retried after backoff, or dead
    TIMEOUT = "timeout"  # a counted failure: the handler ran over its timeout
    RETRY = "retry"  # the handler raised Retry: released, not counted (bounded)
    DB_ERROR = "db_error"  # the handler's own database connection failed: as RETRY
    ABANDONED = "abandoned"  # the lease was lost while the handler ran: given up, not counted
    SHUTDOWN = "shutdown"  # the worker stopped before the handler finished: not counted

    # Set once per member, read once per job by the completer: plain attributes, not
    # properties, since each property call is a Python call per job.
    released: bool  # written by the release statement (the attempt is not counted)
    statement: str  # the completer's statement: release, or the outcome's own

    def __init__(self, value: str) -> None:
        self.released = value in RELEASE_KINDS
        self.statement = "release" if self.released else value


# Releases that do not count as attempts (a handler's Retry, its own database errors) allowed
# in a row; the next one counts as a failed attempt, so no job loops forever.
MAX_UNCOUNTED_IN_A_ROW = 25

log = logging.getLogger("jobtui.worker")

# Told whether the outcome's row was written (False: the lease was lost meanwhile).
Written = Callable[[bool], None]


def is_handler_connection_error(exc: BaseException) -> bool:
    """Whether a handler's exception is its database connection failing rather than the job:
    the error itself (see db.is_connection_error), or one that a database library wraps it in
    and keeps as `orig` (SQLAlchemy's DBAPIError)."""
    orig = getattr(exc, "orig", None)
    return is_connection_error(exc) or (isinstance(orig, BaseException) and is_connection_error(orig))


def error_text(exc: BaseException) -> str:
    """The error class and message, then the traceback, for the job's history."""
    head = f"{type(exc).__name__}: {exc}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{head}\n{tb}"


def judged(exc: BaseException) -> tuple[Outcome, str, float | None]:
    """What a handler's exception makes of its attempt: the outcome, the error text, and the
    delay (None: the handler's backoff). Permanent fails for good, Retry and the handler's
    own database connection failing are released uncounted, anything else is a failure."""
    if isinstance(exc, Permanent):
        return Outcome.PERMANENT, error_text(exc), 0.0
    if isinstance(exc, Retry):
        return Outcome.RETRY, str(exc), exc.delay
    if is_handler_connection_error(exc):
        return Outcome.DB_ERROR, error_text(exc), None
    return Outcome.FAIL, error_text(exc), None


def first_of(text: str) -> str:
    """The first line of a (multi-line) error text."""
    return text.strip().splitlines()[0] if text.strip() else ""


def fields(job: Job) -> dict[str, object]:
    """The job's fields for a log line's `extra=` (the JSON log format shows them)."""
    return job_fields(job.id, job.type, job.attempt, job.worker_id, job.queue, job.schema)


def count_outcome(counts: dict[str, int], outcome: Outcome, job: Job, error: str, uncounted: int) -> None:
    """Count a written outcome in the worker's `counts`, and log what an operator should see."""
    match outcome:
        case Outcome.COMPLETE:
            counts["done"] += 1
        case Outcome.PERMANENT:
            counts["failed"] += 1
            log.warning(
                "job %d (%s) failed permanently on attempt %d: %s",
                job.id,
                job.type,
                job.attempt,
                first_of(error),
                extra=fields(job),
            )
        case Outcome.RETRY | Outcome.SHUTDOWN:
            counts["released"] += 1
        case Outcome.DB_ERROR:
            counts["released"] += 1
            log.warning(
                "job %d (%s) attempt %d: the handler's database connection failed; released, "
                "not counted (%d of %d in a row): %s",
                job.id,
                job.type,
                job.attempt,
                uncounted + 1,
                MAX_UNCOUNTED_IN_A_ROW,
                first_of(error),
                extra=fields(job),
            )
        case Outcome.ABANDONED:
            counts["abandoned"] += 1
            log.warning(
                "job %d (%s): released, attempt %d not counted", job.id, job.type, job.attempt, extra=fields(job)
            )
        case Outcome.FAIL | Outcome.TIMEOUT:
            if job.attempt < job.max_attempts:
                counts["retried"] += 1
                log.warning(
                    "job %d (%s) attempt %d of %d failed, will retry: %s",
                    job.id,
                    job.type,
                    job.attempt,
                    job.max_attempts,
                    first_of(error),
                    extra=fields(job),
                )
        case _:
            assert_never(outcome)
