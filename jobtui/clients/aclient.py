"""The asyncio client, `AsyncQueue`: what `Queue` (client.py) does for enqueueing and reading,
for async applications.

    queue = AsyncQueue("postgresql://localhost/app")
    job_id = await queue.enqueue("email.send", {"user_id": 42})
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from jobtui.clients.client import (
    DEFAULT_CLIENT_TIMEOUT,
    _client_settings,
    _queue_for,
    _reachable,
    _with_queues,
    check_schema,
    migrate_schema,
    search_filter,
)
from jobtui.core.adapters import async_connection
from jobtui.core.middleware import EnqueueHook, as_hook, entered
from jobtui.core.queue import aenqueue, aenqueue_many, enqueue_call
from jobtui.core.registry import Jobs
from jobtui.kernel.db import Call, arun, connect_timeout, pooler_mode, pooler_options, unavailable
from jobtui.kernel.domain import DEFAULT_SCHEMA, NewJob
from jobtui.kernel.jobfilter import JobFilter
from jobtui.reads.jobquery import JobCount, JobSummary, SearchResult, aquery, asearch, counts_call, jobs_call

T = TypeVar("T")


class AsyncQueue:
    """The asyncio client for enqueueing from async applications.

    queue = jobtui.AsyncQueue(dsn)
    await queue.enqueue("email.send", {"user_id": 42})
    """

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
        self.dsn, self.schema, self.timeout = _client_settings(dsn, schema, timeout)
        self.pooler = pooler_mode(pooler)  # see db.pooler_mode
        # With a registry, a job enqueued without a queue goes to its handler's declared one.
        self.registry = jobs
        self._max_connections = max_connections
        # As Queue's: sync hooks, run on the loop around each insert.
        self.middleware: list[EnqueueHook] = [as_hook(m) for m in middleware]
        self._pool: AsyncConnectionPool[Any] | None = None

    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            self._pool = AsyncConnectionPool(
                self.dsn,
                min_size=1,
                max_size=self._max_connections,
                open=False,
                kwargs={**connect_timeout(self.dsn), **pooler_options(self.pooler)},
                check=AsyncConnectionPool.check_connection,  # see Queue
            )
            await self._pool.open(wait=False)
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _with_conn(
        self,
        conn: object | None,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        *,
        autocommit: bool = False,
    ) -> T:
        """`fn` on `conn`, or on a pooled connection with the errors of `Queue._with_conn`."""
        if conn is not None:
            return await fn(await async_connection(conn))
        try:
            async with (await self._get_pool()).connection(timeout=self.timeout) as pooled:
                try:
                    if not autocommit:
                        return await fn(pooled)
                    await pooled.set_autocommit(True)  # see _autocommitted
                    try:
                        return await fn(pooled)
                    finally:
                        with contextlib.suppress(psycopg.Error):  # a broken connection is discarded anyway
                            await pooled.set_autocommit(False)
                except psycopg.OperationalError as exc:
                    if _reachable(pooled):
                        raise
                    raise unavailable(self.dsn, exc) from None
        except PoolTimeout as exc:
            raise unavailable(self.dsn, exc, waited=self.timeout) from None

    async def check_schema(self) -> int:
        """Raise SchemaNotMigrated unless `jobtui migrate` has been run for this code."""
        return await asyncio.to_thread(check_schema, self.dsn, self.schema, self.pooler)

    async def migrate(self) -> list[str]:
        """Apply the migrations the schema lacks (what `jobtui migrate` does); their names."""
        return await asyncio.to_thread(migrate_schema, self.dsn, self.schema, self.pooler)

    async def jobs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        type: str | Sequence[str] | None = None,
        queue: str | None = None,
        since: datetime | None = None,
        error: str | None = None,
        limit: int = 100,
        before: int | None = None,
        payload: dict[str, Any] | None = None,
    ) -> list[JobSummary]:
        """See `Queue.jobs`."""
        if payload is not None:
            found = await self.search(
                search_filter(status, type, queue, since, payload), error=error, limit=limit, before=before
            )
            return found.jobs
        call = jobs_call(status=status, type=type, queue=queue, since=since, error=error, limit=limit, before=before)
        result: list[JobSummary] = await self._with_conn(None, lambda c: aquery(c, call, self.schema))
        return result

    async def search(
        self, filt: JobFilter, *, error: str | None = None, limit: int = 100, before: int | None = None
    ) -> SearchResult:
        """See `Queue.search`; cancel the task to stop it."""
        result: SearchResult = await self._with_conn(
            None, lambda c: asearch(c, filt, error=error, limit=limit, before=before, schema=self.schema)
        )
        return result

    async def counts(
        self,
        *,
        status: str | Sequence[str] | None = None,
        type: str | Sequence[str] | None = None,
        queue: str | None = None,
    ) -> list[JobCount]:
        """See `Queue.counts`."""
        return await self.run(counts_call(status=status, type=type, queue=queue))

    async def count(
        self,
        *,
        status: str | Sequence[str] | None = None,
        type: str | Sequence[str] | None = None,
        queue: str | None = None,
    ) -> int:
        return sum(c.jobs for c in await self.counts(status=status, type=type, queue=queue))

    async def run(self, call: Call[T], conn: object | None = None) -> T:
        """Run any `Call` (in `conn`'s transaction when given, else in its own)."""
        return await self._with_conn(conn, lambda c: arun(c, call, self.schema))

    async def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        key: str | None = None,
        delay: float = 0.0,
        run_at: Any = None,
        max_attempts: int | None = None,
        queue: str | None = None,
        conn: object | None = None,
    ) -> int:
        """Insert one job into `queue` (None: its handler's declared queue, see `jobs`, else
        the default one) and return its id; a key that exists returns the existing job's id."""
        new = NewJob(job_type, payload, key, delay, max_attempts, queue=_queue_for(self.registry, job_type, queue))
        with entered(self.middleware, [new]) as (job,):
            call = enqueue_call(job.type, job.payload, key=job.key, delay=job.delay, run_at=run_at,
                                max_attempts=job.max_attempts, meta=job.meta, queue=job.queue)  # fmt: skip
            return await self._with_conn(conn, lambda c: aenqueue(c, call, self.schema), autocommit=conn is None)

    async def enqueue_many(self, jobs: Iterable[NewJob], *, conn: object | None = None) -> list[int]:
        """Insert many jobs in one statement (COPY for large batches); ids in input order."""
        with entered(self.middleware, _with_queues(self.registry, jobs)) as batch:
            return await self._with_conn(conn, lambda c: aenqueue_many(c, batch, self.schema))
