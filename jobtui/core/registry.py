"""The user's side of jobtui: handlers, schedules and what a running handler receives.

jobs = jobtui.Jobs()

@jobs.handler("email.send", max_attempts=5, timeout=30)
def send_email(job: jobtui.Job) -> None:
    with psycopg.connect(APP_DSN) as conn:
        if not job.once(conn, f"welcome-email:{job.payload['user_id']}"):
            return                      # an earlier attempt already did it
        conn.execute("INSERT INTO sent_email ...")   # same transaction as the record
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import psycopg

from jobtui.core.jobs import effect_exists_call, record_effect_call
from jobtui.kernel.backoff import DEFAULT_POLICY, BackoffPolicy
from jobtui.kernel.checks import check_delay, check_max_attempts, check_queue, check_type
from jobtui.kernel.cronslots import DEFAULT_GRACE_SECONDS
from jobtui.kernel.db import Call, arun, run
from jobtui.kernel.domain import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, ClaimedJob, FailOutcome
from jobtui.kernel.errors import InvalidInput, JobtuiError

F = TypeVar("F", bound=Callable[..., Any])

# Where a sync handler runs: a thread of the worker's process, or a child process of the
# worker's pool that the worker can stop (docs/design.md, "Executors").
EXECUTORS = ("thread", "process")


def check_executor(executor: str, what: str = "executor") -> str:
    """`executor` if it names one, else InvalidInput saying which there are."""
    if executor not in EXECUTORS:
        raise InvalidInput(f"{what} must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    return executor


class Permanent(Exception):
    """Raise from a handler when retrying cannot help: the job becomes `failed` at once."""


class Retry(Exception):
    """Raise from a handler to run the job again after `delay` seconds, without counting
    the attempt (a rate limit, a dependency that asked to come back later)."""

    def __init__(self, delay: float = 0.0, reason: str = "") -> None:
        # Checked here, so a bad delay fails the attempt with its reason, in the handler.
        self.delay = check_delay(delay)
        super().__init__(reason or f"retry in {self.delay}s")


class LeaseLost(JobtuiError):
    """The job's lease was lost (reaped, killed or cancelled); its outcome will not be written."""


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler and its policy."""

    type: str
    fn: Callable[[Job], Any]
    is_async: bool
    max_attempts: int
    timeout: float | None
    backoff: BackoffPolicy
    # A pydantic model (or any class with model_validate/model_dump): payloads are checked
    # against it at enqueue and decoded into it for the handler (typed.py).
    payload: Any = None
    # The queue its jobs go to when enqueued through a client given this registry
    # (Client(dsn, jobs=jobs)) without a queue of their own; None: the default queue.
    queue: str | None = None
    # Where a sync handler runs (EXECUTORS); None: the worker's --executor.
    executor: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule declared in code; synced to the schedule table when a worker starts."""

    name: str
    cron: str
    type: str
    payload: Any = None
    timezone: str = "UTC"
    offset: float | None = None
    missed: str = "once"
    max_attempts: int | None = None
    grace: float = DEFAULT_GRACE_SECONDS  # seconds after its time a slot still runs as on time
    # The queue its jobs go to; None: the queue the handler of `type` declares, else the
    # default queue (Jobs.schedule_specs resolves it).
    queue: str | None = None


DeadCallback = Callable[[FailOutcome], Any]
# Around each attempt: called with the Job, returns a context manager (or is a generator
# function, made one) whose body is the handler; see middleware.py.
HandlerHook = Callable[["Job"], Any]


def _dsn_of(conn: object) -> str:
    """A psycopg connection's parameters (never its password), for the bounds once() sets;
    '' for anything else, which run() then refuses as it always did."""
    if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
        return conn.info.dsn
    return ""


@dataclass
class Jobs:
    """The registry of handlers and schedules; a worker loads it with `--app pkg.module:jobs`."""

    handlers: dict[str, Handler] = field(default_factory=dict)
    schedules: dict[str, ScheduleSpec] = field(default_factory=dict)
    dead_callbacks: list[DeadCallback] = field(default_factory=list)
    hooks: list[HandlerHook] = field(default_factory=list)

    def handler(
        self,
        job_type: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        backoff: BackoffPolicy = DEFAULT_POLICY,
        payload: Any = None,
        queue: str | None = None,
        executor: str | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function (plain or `async def`) for jobs of `job_type`;
        with `payload=` a pydantic model, the handler's `job.payload` is an instance of it;
        `queue` is where a client given this registry puts them by default; `executor`
        ("thread" or "process") is where a sync handler runs, whatever the worker's
        --executor says."""
        check_type(job_type)
        if queue is not None:
            check_queue(queue)
        if executor is not None:
            check_executor(executor, f"handler {job_type!r}: executor")
        check_max_attempts(max_attempts)
        if timeout is not None and not timeout > 0:
            raise InvalidInput(f"handler {job_type!r}: timeout must be a positive number of seconds")
        if job_type in self.handlers:
            raise InvalidInput(f"handler {job_type!r} is registered twice")

        def register(fn: F) -> F:
            is_async = inspect.iscoroutinefunction(fn)
            if is_async and executor is not None:
                raise InvalidInput(
                    f"handler {job_type!r}: executor= is for sync handlers; an async one runs on the worker's loop"
                )
            self.handlers[job_type] = Handler(
                type=job_type,
                fn=fn,
                is_async=is_async,
                max_attempts=max_attempts,
                timeout=timeout,
                backoff=backoff,
                payload=payload,
                queue=queue,
                executor=executor,
            )
            return fn

        return register

    def middleware(self, hook: HandlerHook) -> HandlerHook:
        """Run `hook` around every attempt of every handler, sync and async alike, inside
        the hooks registered before it: a generator function that yields once, or a
        function returning a context manager (see middleware.py)."""
        self.hooks.append(contextmanager(hook) if inspect.isgeneratorfunction(hook) else hook)
        return hook

    def queue_of(self, job_type: str) -> str | None:
        """The queue the handler of `job_type` declares, if any."""
        handler = self.handlers.get(job_type)
        return None if handler is None else handler.queue

    def schedule_specs(self) -> list[ScheduleSpec]:
        """The declared schedules, each with its queue: its own, else its handler's, else
        the default queue (what a worker or scheduler syncs to the schedule table)."""
        return [
            s if s.queue is not None else replace(s, queue=self.queue_of(s.type) or DEFAULT_QUEUE)
            for s in self.schedules.values()
        ]

    def on_dead(self, fn: DeadCallback) -> DeadCallback:
        """Register a callback run (in the worker) each time a job goes dead."""
        self.dead_callbacks.append(fn)
        return fn

    def schedule(
        self,
        name: str,
        *,
        cron: str,
        type: str,
        payload: Any = None,
        timezone: str = "UTC",
        offset: float | None = None,
        missed: str = "once",
        max_attempts: int | None = None,
        grace: float = DEFAULT_GRACE_SECONDS,
        queue: str | None = None,
    ) -> ScheduleSpec:
        """Declare a cron schedule that enqueues a job of `type` once per slot, in `queue`
        (default: the queue the handler of `type` declares, else the default queue).

        A slot whose scheduler comes `grace` seconds late or less still runs as on time;
        `missed` (skip, once, all) decides what runs for slots missed beyond it.
        """
        from jobtui.kernel.cronslots import validate_schedule

        validate_schedule(name, cron, timezone, missed, offset, grace)
        check_type(type)
        if queue is not None:
            check_queue(queue)
        spec = ScheduleSpec(name, cron, type, payload, timezone, offset, missed, max_attempts, float(grace), queue)
        self.schedules[name] = spec
        return spec


class Job:
    """What a handler receives: the job's fields, its attempt, and the idempotency helper."""

    def __init__(self, claimed: ClaimedJob, worker_id: str, schema: str) -> None:
        self.id = claimed.id
        self.type = claimed.type
        self.payload: Any = claimed.payload
        self.attempt = claimed.attempt
        self.max_attempts = claimed.max_attempts
        self.worker_id = worker_id
        self.lease_token = claimed.lease_token
        # When it was enqueued and when it was due: pickup latency is started minus run_at.
        self.created_at = claimed.created_at
        self.run_at = claimed.run_at
        self.queue = claimed.queue  # the named queue it was claimed from
        self.schema = schema  # the schema of jobtui's tables it runs in
        self.meta = claimed.meta  # what its enqueue attached (trace context), or None
        self._schema = schema
        # A plain flag: set once by the worker, read by the handler's thread; assignments of
        # a bool are atomic in CPython, and an Event per job cost a lock and a condition.
        self._lost = False
        self._cancelled = False
        # Whether the handler may have cut its work short for the loss: it read `lost`,
        # `cancelled` or `heartbeat()` once they said so, or `once()` refused an effect. A
        # sync handler that returns after its attempt was given up has then not surely done
        # its work, and the attempt is released rather than completed (worker.py).
        self.loss_seen = False

    @property
    def cancelled(self) -> bool:
        """True once an operator cancelled this job while it ran (`jobtui cancel`, the
        console's `c`): the job is `failed` already, so the handler should return; its outcome
        is discarded and `once()` refuses. An async handler is cancelled outright."""
        if self._cancelled:
            self.loss_seen = True
        return self._cancelled

    def mark_cancelled(self) -> None:
        self._cancelled = True
        self._lost = True

    @property
    def lost(self) -> bool:
        """True once the worker gave this attempt up (its lease was lost, or could not be
        extended before it expired): a long handler checks it between steps and returns,
        since its outcome is discarded and `once()` refuses. Also True once cancelled."""
        if self._lost:
            self.loss_seen = True
        return self._lost

    def mark_lost(self) -> None:
        self._lost = True

    @property
    def marked_lost(self) -> bool:
        """`lost`, as the worker reads it: reading this one does not count as the handler
        having seen the loss (`loss_seen`)."""
        return self._lost

    def heartbeat(self) -> bool:
        """Whether the lease is still held; long handlers call it between steps and stop
        when it returns False. The worker itself extends every in-flight lease on an
        interval, as long as the process is alive."""
        return not self.lost

    def once(self, conn: psycopg.Connection[Any], key: str) -> bool:
        """Record effect `key` in `conn`'s transaction; False when it was already done.

        Do the effect in the same transaction, after this returns True: if the transaction
        rolls back, the record goes with it and a later attempt does the effect again.
        Raises LeaseLost, recording nothing, when the job no longer runs under this
        attempt's lease (checked in the database: a worker that froze or was cut off past
        its lease may not know yet that the job was reaped or re-claimed). The check locks
        the job's row until `conn`'s transaction ends, so the job cannot be reaped or
        claimed again before the effect commits: keep that transaction short.
        """
        if self.lost:
            raise self._refused(key)
        return self._recorded(run(conn, self._record(key, _dsn_of(conn)), self._schema), key)

    async def once_async(self, conn: psycopg.AsyncConnection[Any], key: str) -> bool:
        """Async counterpart of `once`."""
        if self.lost:
            raise self._refused(key)
        return self._recorded(await arun(conn, self._record(key, _dsn_of(conn)), self._schema), key)

    def _refused(self, key: str) -> LeaseLost:
        self.loss_seen = True  # a job never ends done after once() refused one of its effects
        return LeaseLost(f"job {self.id} lost its lease; not recording effect {key!r}")

    def _record(self, key: str, dsn: str) -> Call[tuple[bool, bool]]:
        # Fenced by the lease in the database: this worker may not know yet that it lost it
        # (it was frozen or cut off past its lease, and no heartbeat has told it since).
        return record_effect_call(key, self.id, self.lease_token, dsn)

    def _recorded(self, outcome: tuple[bool, bool], key: str) -> bool:
        held, recorded = outcome
        if not held:
            self.mark_lost()
            raise self._refused(key)
        return recorded

    def effect_done(self, conn: psycopg.Connection[Any], key: str) -> bool:
        """Whether effect `key` was recorded (committed) by any attempt."""
        return run(conn, effect_exists_call(key), self._schema)

    def __repr__(self) -> str:
        return f"Job(id={self.id}, type={self.type!r}, attempt={self.attempt}/{self.max_attempts})"


def load_app(spec: str) -> Jobs:
    """The Jobs registry named by `pkg.module:attr`, or InvalidInput saying what is wrong."""
    import importlib
    import sys

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InvalidInput(f"bad --app {spec!r}: write it as pkg.module:jobs")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`, find modules in the current directory
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else module_name
        raise InvalidInput(f"--app {module_name!r} does not compile: {exc.msg} at {where}") from None
    except ImportError as exc:
        raise InvalidInput(f"cannot import {module_name!r} for --app ({exc}); check the module path") from None
    except (Exception, SystemExit) as exc:  # the module's own code failed while it was imported
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InvalidInput(
            f"importing {module_name!r} for --app raised {type(exc).__name__}{': ' + first if first else ''}; "
            "run `python -c 'import " + module_name + "'` to see the traceback"
        ) from None
    if not hasattr(module, attr):
        raise InvalidInput(f"module {module_name!r} has no attribute {attr!r}; --app names it as {module_name}:NAME")
    registry = getattr(module, attr)
    if not isinstance(registry, Jobs):
        raise InvalidInput(f"{spec!r} is not a jobtui.Jobs registry (found {type(registry).__name__})")
    return registry
