"""What `Client` (client.py) and `AsyncClient` (aclient.py) share: their settings and checks,
the options of their pools, and how their arguments become a `JobFilter` or an enqueue `Call`.
Only the running differs: on a sync pool or an async one.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any, TypedDict

import psycopg
from psycopg_pool import PoolClosed, PoolTimeout

from jobtui.clients.reach import WAIT_SLICE, Reach
from jobtui.core.jobs import EnqueueOptions, enqueue_call
from jobtui.core.middleware import EnqueueHook, as_hook, entered
from jobtui.core.registry import Jobs
from jobtui.kernel import migrate
from jobtui.kernel.db import (
    DEAD_SOCKET_SECONDS,
    Call,
    check_dsn,
    connect,
    connect_timeout,
    pooler_mode,
    pooler_options,
    resolve_dsn,
    statements,
    tcp_bounds,
    unavailable,
)
from jobtui.kernel.domain import DEFAULT_SCHEMA, NewJob
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.jobfilter import JobFilter

# How long a client call waits for a pooled connection (all busy, or the first being opened),
# by default. While the database is known to be away, a call does not wait (reach.py).
DEFAULT_CLIENT_TIMEOUT = 10.0


def client_settings(dsn: str | None, schema: str, timeout: float) -> tuple[str, str, float]:
    """The checked DSN, schema and timeout of a Client or AsyncClient."""
    resolved = resolve_dsn(dsn)
    if resolved is None:
        raise InvalidInput("no database given: pass a DSN or set JOBTUI_DSN")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise InvalidInput(f"bad timeout {timeout!r}: give seconds, more than 0 and at most 3600")
    return check_dsn(resolved), statements(schema).schema, float(timeout)


def migrate_schema(dsn: str | None = None, schema: str = DEFAULT_SCHEMA, pooler: str | None = None) -> list[str]:
    """Create or upgrade jobtui's schema at `dsn` (JOBTUI_DSN when None), for code that
    deploys itself; safe to race. The names of the migrations applied."""
    dsn, schema, _ = client_settings(dsn, schema, DEFAULT_CLIENT_TIMEOUT)
    with connect(dsn, autocommit=True, pooler=pooler_mode(pooler)) as conn:
        return [f"{m.version:04d}_{m.name}" for m in migrate.migrate(conn, schema)]


def check_schema(dsn: str | None = None, schema: str = DEFAULT_SCHEMA, pooler: str | None = None) -> int:
    """The schema's version; SchemaNotMigrated when it is missing or older than this code."""
    dsn, schema, _ = client_settings(dsn, schema, DEFAULT_CLIENT_TIMEOUT)
    with connect(dsn, pooler=pooler_mode(pooler)) as conn:
        return migrate.check(conn, schema)


def renamed(module: str, name: str, renames: dict[str, type[ClientBase]]) -> type[ClientBase]:
    """A module's `__getattr__` for the clients' old names (Queue, AsyncQueue): the class
    itself, so `isinstance` holds, with a DeprecationWarning naming the new one."""
    if name not in renames:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new = renames[name]
    warnings.warn(
        f"{module}.{name} is deprecated and goes in the next minor release: use {module}.{new.__name__}",
        DeprecationWarning,
        stacklevel=3,  # the caller of the module's __getattr__
    )
    return new


def reachable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the connection still works after an error (the error was the statement's)."""
    return not (conn.closed or conn.broken)


def job_filter(
    status: str | Sequence[str] | None,
    type: str | Sequence[str] | None,
    queue: str | None,
    since: datetime | None = None,
    payload: dict[str, Any] | None = None,
) -> JobFilter:
    """The filter keywords of `jobs()`, `counts()` and `count()` as one checked JobFilter."""

    def many(value: str | Sequence[str] | None) -> tuple[str, ...]:
        # str() turns a JobStatus into its value, as the statements compare it.
        return () if value is None else (str(value),) if isinstance(value, str) else tuple(str(v) for v in value)

    return JobFilter(statuses=many(status), types=many(type), queue=queue, since=since, payload=payload)


class JobsQuery(TypedDict, total=False):
    """The keywords of `Client.jobs` and `AsyncClient.jobs`, each left out by default: the
    filter (`status`, `type`, `queue`, `since`, `payload`) and the page (`error`, `limit`,
    100 when left out, and `before`)."""

    status: str | Sequence[str] | None
    type: str | Sequence[str] | None
    queue: str | None
    since: datetime | None
    error: str | None
    limit: int
    before: int | None
    payload: dict[str, Any] | None


JOBS_QUERY = frozenset(JobsQuery.__annotations__)


class JobsPage(TypedDict):
    """The page keywords of `jobs_call` and `search`."""

    error: str | None
    limit: int
    before: int | None


def jobs_query(q: JobsQuery) -> tuple[JobFilter, JobsPage]:
    """The keywords of `jobs()` as the filter and the page it reads; a payload filter is
    read by `search`, window by window, the others by `jobs_call`."""
    unknown = q.keys() - JOBS_QUERY
    if unknown:  # as a signature of its own would refuse it
        raise TypeError(f"jobs() got an unexpected keyword argument {min(unknown)!r}")
    filt = job_filter(q.get("status"), q.get("type"), q.get("queue"), q.get("since"), q.get("payload"))
    return filt, {"error": q.get("error"), "limit": q.get("limit", 100), "before": q.get("before")}


class ClientBase:
    """The settings of a client; the pool and the running are its subclass's."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = DEFAULT_SCHEMA,
        max_connections: int = 4,
        timeout: float = DEFAULT_CLIENT_TIMEOUT,
        middleware: Sequence[EnqueueHook] = (),
        pooler: str | None = None,
        jobs: Jobs | None = None,
    ) -> None:
        self.dsn, self.schema, self.timeout = client_settings(dsn, schema, timeout)
        self.pooler = pooler_mode(pooler)  # see db.pooler_mode
        # With a registry, a job enqueued without a queue goes to its handler's declared one.
        self.registry = jobs
        self._max_connections = max_connections
        # Around every enqueue, in order (middleware.py); generator functions are made hooks.
        # AsyncClient runs these sync hooks on its loop.
        self.middleware: list[EnqueueHook] = [as_hook(m) for m in middleware]
        # Whether the database answers; each pool serves one of its generations (reach.py).
        self._reach = Reach(self.dsn, self.pooler)
        self._pool_generation = -1
        self._no_pool()

    def _no_pool(self) -> None:
        """The subclass's state before its first pool."""
        raise NotImplementedError

    def _pool_options(self) -> dict[str, Any]:
        """The options of the client's pool, sync or async alike: its connections end within
        DEAD_SOCKET_SECONDS of the database going silent, connecting too."""
        connecting = connect_timeout(self.dsn) and {"connect_timeout": round(DEAD_SOCKET_SECONDS)}
        return {
            "min_size": 1,
            "max_size": self._max_connections,
            "open": False,
            "kwargs": {**connecting, **tcp_bounds(self.dsn), **pooler_options(self.pooler)},
        }

    def _checked_slowly(self, began: float, exc: BaseException, generation: int) -> None:
        """A pooled connection's check failed: after waiting out its TCP bounds, the database
        went silent (the client turns down: see reach.py); at once, the server dropped that
        one connection (a restart, a terminated backend), and the pool tries another."""
        if time.monotonic() - began >= DEAD_SOCKET_SECONDS / 2:
            self._lost(exc, generation)

    def _lost(self, exc: BaseException, generation: int | None = None) -> None:
        """The database is unreachable: the pool goes (closed in the background, which fails
        the calls waiting for it at once), and calls fail at once until it answers again.
        A failure of an older pool's connection says nothing of the database now."""
        if generation is not None and generation != self._pool_generation:
            return
        if self._reach.failed(exc):
            self._drop_pool()

    def _drop_pool(self) -> None:
        """Forget the pool and close it in the background (the subclass's)."""
        raise NotImplementedError

    def _not_got(self, exc: PoolTimeout | PoolClosed, left: float, generation: int) -> None:
        """A wait of `_getconn` for a pooled connection ended without one: DatabaseUnavailable
        once the client turned down meanwhile (the pool does not tell its waiters), the
        client's timeout is spent, or the pool was dropped; else the caller waits again."""
        self._reach.check()
        if isinstance(exc, PoolClosed):  # dropped while the call waited: the database went away
            raise unavailable(self.dsn, exc) from None
        if left <= WAIT_SLICE:
            self._lost(exc, generation)
            raise unavailable(self.dsn, exc, waited=self.timeout) from None

    def _failed_on(
        self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], exc: BaseException, generation: int
    ) -> None:
        """A statement on a pooled connection failed: DatabaseUnavailable when the connection
        is gone; else the error was the statement's (a deadlock, a timeout), for the caller
        to raise as it is."""
        if not reachable(conn):
            self._lost(exc, generation)
            raise unavailable(self.dsn, exc) from None

    def _queue_for(self, job_type: str, queue: str | None) -> str | None:
        return self.registry.queue_of(job_type) if queue is None and self.registry is not None else queue

    def _with_queues(self, jobs: Iterable[NewJob]) -> list[NewJob]:
        """The jobs, each without a queue given its handler's declared one."""
        if self.registry is None:
            return list(jobs)
        return [j if j.queue is not None else replace(j, queue=self.registry.queue_of(j.type)) for j in jobs]

    @contextmanager
    def _enqueue_entered(self, job_type: str, payload: Any, options: EnqueueOptions) -> Iterator[Call[int | None]]:
        """The insert of one job, inside the enqueue hooks (which see its exception, if any)."""
        queue = self._queue_for(job_type, options.get("queue"))
        if not self.middleware:
            resolved: EnqueueOptions = {**options, "queue": queue}
            yield enqueue_call(job_type, payload, **resolved)
            return
        new = NewJob(job_type, payload, options.get("key"), options.get("delay", 0.0), options.get("max_attempts"),
                     queue=queue)  # fmt: skip
        with entered(self.middleware, [new]) as (job,):
            yield enqueue_call(job.type, job.payload, key=job.key, delay=job.delay, run_at=options.get("run_at"),
                               max_attempts=job.max_attempts, meta=job.meta, queue=job.queue)  # fmt: skip
