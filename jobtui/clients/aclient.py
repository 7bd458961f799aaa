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
from typing import Any, TypeVar, Unpack

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from jobtui.clients.base import (
    DEFAULT_CLIENT_TIMEOUT,
    ClientBase,
    check_schema,
    job_filter,
    migrate_schema,
    reachable,
)
from jobtui.core.adapters import async_connection
from jobtui.core.middleware import EnqueueHook, entered
from jobtui.core.queue import EnqueueOptions, aenqueue, aenqueue_many
from jobtui.core.registry import Jobs
from jobtui.kernel.db import Call, arun, unavailable
from jobtui.kernel.domain import DEFAULT_SCHEMA, NewJob
from jobtui.kernel.jobfilter import JobFilter
from jobtui.reads.jobquery import JobCount, JobSummary, SearchResult, aquery, asearch, counts_call, jobs_call

T = TypeVar("T")


class AsyncQueue(ClientBase):
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
        super().__init__(
            dsn,
            schema=schema,
            max_connections=max_connections,
            timeout=timeout,
            middleware=middleware,
            pooler=pooler,
            jobs=jobs,
        )
        self._pool: AsyncConnectionPool[Any] | None = None

    async def _get_pool(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            self._pool = AsyncConnectionPool(
                self.dsn,
                **self._pool_options(),
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
                    if reachable(pooled):
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
        filt = job_filter(status, type, queue, since, payload)
        if payload is not None:
            found = await self.search(filt, error=error, limit=limit, before=before)
            return found.jobs
        call = jobs_call(filt, error=error, limit=limit, before=before)
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
        return await self.run(counts_call(job_filter(status, type, queue)))

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
        self, job_type: str, payload: Any = None, *, conn: object | None = None, **options: Unpack[EnqueueOptions]
    ) -> int:
        """See `Queue.enqueue`."""
        with self._enqueue_entered(job_type, payload, options) as call:
            return await self._with_conn(conn, lambda c: aenqueue(c, call, self.schema), autocommit=conn is None)

    async def enqueue_many(self, jobs: Iterable[NewJob], *, conn: object | None = None) -> list[int]:
        """Insert many jobs in one statement (COPY for large batches); ids in input order."""
        with entered(self.middleware, self._with_queues(jobs)) as batch:
            return await self._with_conn(conn, lambda c: aenqueue_many(c, batch, self.schema))
