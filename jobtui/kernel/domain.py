"""States and plain records of the queue. Standard library only."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

DEFAULT_SCHEMA = "jobtui"
DEFAULT_MAX_ATTEMPTS = 25
DEFAULT_LEASE_SECONDS = 30.0
# The queue of a job enqueued without one.
DEFAULT_QUEUE = "default"
# How long an idempotency key keeps returning its job's id after the job finished, unless the
# workers' --key-retention says otherwise.
DEFAULT_KEY_RETENTION = 7 * 86400.0
MAX_PAYLOAD_BYTES = 1_000_000
MAX_DELAY_SECONDS = 10 * 365 * 86400  # longest delay before a job runs (again): 10 years


class JobStatus(enum.StrEnum):
    """Where a job is in its life; see the transitions in docs/design.md."""

    READY = "ready"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    DEAD = "dead"


class Lease(NamedTuple):
    """What a worker must show to write a job's outcome: the id and the claim's token."""

    job_id: int
    token: int


@dataclass(slots=True)
class ClaimedJob:
    """A job a worker holds: what it needs to run it and to write its outcome.

    Treat it as read-only. It is not frozen because one is made per claimed job, and a
    frozen dataclass's __init__ costs several times as much. The worker's claims carry
    their timestamps in UTC (its claiming session's zone), Client.claim's in the session's.
    """

    id: int
    type: str
    payload: Any
    attempt: int
    max_attempts: int
    lease_token: int
    locked_until: datetime
    created_at: datetime
    run_at: datetime
    # Releases in a row that did not count as attempts (Retry, database errors), bounded.
    uncounted: int = 0
    # What the enqueuing code attached (the trace context it ran in, say), or None.
    meta: dict[str, Any] | None = None
    queue: str = DEFAULT_QUEUE  # the named queue it was claimed from

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.lease_token)


@dataclass(frozen=True, slots=True)
class Failure:
    """A counted failure to record: retried after `delay` seconds unless attempts are spent."""

    lease: Lease
    error: str
    delay: float


@dataclass(frozen=True, slots=True)
class FailOutcome:
    """Where a failed job went: back to `ready`, or `dead` when it had no attempts left."""

    job_id: int
    status: JobStatus
    type: str
    attempt: int
    max_attempts: int
    worker: str | None
    queue: str | None = None  # the job's named queue, when the statement that failed it said


@dataclass(frozen=True, slots=True)
class Reaped:
    """A job whose lease expired, and where the reaper sent it."""

    job_id: int
    type: str
    worker: str | None
    attempt: int
    status: JobStatus
    expired_at: datetime
    queue: str | None = None  # the job's named queue


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job for `enqueue_many`."""

    type: str
    payload: Any = None
    key: str | None = None
    delay: float = 0.0
    max_attempts: int | None = None  # None: the handler's limit, set at the first claim
    meta: dict[str, Any] | None = None  # travels with the job to each attempt (Job.meta)
    queue: str | None = None  # None: the handler's declared queue (Client(jobs=...)), else DEFAULT_QUEUE


@dataclass(frozen=True, slots=True)
class Runner:
    """What runs a running job, as its worker's last heartbeat said (job.runner): the
    executor (async, thread or process) and, in a child process, its pid and resident bytes."""

    executor: str
    pid: int | None = None
    rss: int | None = None

    @classmethod
    def decoded(cls, value: Any) -> Runner | None:
        """The runner of a job row's `runner` (jsonb, written by workers but read as untrusted
        data: anything unexpected in it is left out), or None."""
        if not isinstance(value, dict):
            return None
        executor = value.get("executor")
        if executor not in ("async", "thread", "process"):
            return None

        def count(name: str) -> int | None:
            found = value.get(name)
            return found if type(found) is int and 0 <= found < 1 << 62 else None

        return cls(executor, count("pid"), count("rss"))

    def __str__(self) -> str:
        """`process 4242, 85 MiB`, `thread`.

        >>> str(Runner("process", 4242, 89128960))
        'process 4242, 85 MiB'
        """
        parts = [self.executor if self.pid is None else f"{self.executor} {self.pid}"]
        if self.rss is not None:
            parts.append(f"{self.rss / (1 << 20):,.0f} MiB")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class ErrorEntry:
    """One entry of a job's history: an error, an expired lease or an operator's action."""

    at: str
    attempt: int
    worker: str | None
    kind: str
    error: str
    started: str | None = None  # when that attempt started (entries written before it was kept have none)

    @classmethod
    def decoded(cls, entry: object) -> ErrorEntry:
        """An entry as the `errors` column holds it. Anything a hand edit may have left there (a
        string, a number, an object in place of a name) is kept as text, never an exception:
        the screens that show a job's history must open on whatever the row holds."""
        if not isinstance(entry, dict):
            return cls(at="", attempt=0, worker=None, kind="error", error=_as_text(entry))
        attempt = entry.get("attempt")
        worker, started = entry.get("worker"), entry.get("started")
        return cls(
            at=_as_text(entry.get("at", "")),
            attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0,
            worker=None if worker is None else _as_text(worker),
            kind=_as_text(entry.get("kind", "error")),
            error=_as_text(entry.get("error", "")),
            started=None if started is None else _as_text(started),
        )


def _as_text(value: object) -> str:
    """A JSON value as text: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True, slots=True)
class JobRow:
    """A whole job row, as `jobtui job ID` and the console explain it."""

    id: int
    type: str
    payload: Any
    idempotency_key: str | None
    status: JobStatus
    run_at: datetime
    attempts: int
    max_attempts: int | None  # None until the first claim sets the handler's limit
    locked_by: str | None
    locked_until: datetime | None
    lease_token: int
    heartbeat_at: datetime | None
    last_error: str | None
    errors: list[ErrorEntry] = field(default_factory=list)
    lease_expirations: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    db_now: datetime | None = None
    queue: str = DEFAULT_QUEUE
    runner: Runner | None = None  # while running, what its worker's last heartbeat said runs it
