"""The asyncio client, `AsyncClient`: what `Client` (client.py) does for enqueueing and reading,
for async applications.

    client = AsyncClient("postgresql://localhost/app")
    job_id = await client.enqueue("email.send", {"user_id": 42})
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from jobtui.clients.base import ClientBase, JobsQuery, check_schema, job_filter, jobs_query, migrate_schema, renamed
from jobtui.clients.reach import WAIT_SLICE, reporting_async_connection
from jobtui.core.adapters import async_connection
from jobtui.core.jobs import EnqueueOptions, aenqueue, aenqueue_many
from jobtui.core.middleware import entered
from jobtui.kernel.db import Call, abound_server_end, arun
from jobtui.kernel.domain import NewJob
from jobtui.kernel.jobfilter import JobFilter
from jobtui.reads.jobquery import JobCount, JobSummary, SearchResult, aquery, asearch, counts_call, jobs_call

T = TypeVar("T")


class AsyncClient(ClientBase):
    """The asyncio client for enqueueing from async applications.

    client = jobtui.AsyncClient(dsn)
    await client.enqueue("email.send", {"user_id": 42})
    """

    def _no_pool(self) -> None:
        self._pool: AsyncConnectionPool[Any] | None = None
        self._closing: set[asyncio.Task[None]] = set()  # pools the database left, closing

    async def _get_pool(self) -> tuple[AsyncConnectionPool[Any], int]:
        """See `Client._get_pool`."""
        reach = self._reach
        reach.check()
        pool, generation = self._pool, reach.generation
        if pool is not None and self._pool_generation == generation:
            return pool, generation
        if pool is not None:
            self._close_later(pool)
        pool = self._pool = AsyncConnectionPool(
            self.dsn,
            **self._pool_options(),
            connection_class=reporting_async_connection(lambda exc: self._lost(exc, generation)),
            check=lambda conn: self._check(conn, generation),  # see Client
            configure=self._configure,
        )
        self._pool_generation = generation
        await pool.open(wait=False)
        return pool, generation

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """See Client._configure."""
        await conn.set_autocommit(True)
        await abound_server_end(conn, self.dsn, self._pool_options()["kwargs"], self.pooler)
        await conn.set_autocommit(False)

    async def _check(self, conn: psycopg.AsyncConnection[Any], generation: int) -> None:
        began = time.monotonic()
        try:
            await AsyncConnectionPool.check_connection(conn)
        except psycopg.Error as exc:
            self._checked_slowly(began, exc, generation)
            raise

    def _drop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            self._close_later(pool)

    def _close_later(self, pool: AsyncConnectionPool[Any]) -> None:
        task = asyncio.get_running_loop().create_task(pool.close(), name="jobtui-pool-close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        self._reach.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def __aenter__(self) -> AsyncClient:
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
        """`fn` on `conn`, or on a pooled connection with the errors of `Client._with_conn`."""
        if conn is not None:
            return await fn(await async_connection(conn))
        pool, generation = await self._get_pool()
        pooled = await self._getconn(pool, generation)
        try:
            async with pooled:  # commits, or rolls back on an error (a pooled connection stays open)
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
                    self._failed_on(pooled, exc, generation)
                    raise
        finally:
            await pool.putconn(pooled)

    async def _getconn(self, pool: AsyncConnectionPool[Any], generation: int) -> psycopg.AsyncConnection[Any]:
        """See `Client._getconn`."""
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                got: psycopg.AsyncConnection[Any] = await pool.getconn(timeout=max(0.001, min(WAIT_SLICE, left)))
                return got
            except (PoolTimeout, PoolClosed) as exc:
                self._not_got(exc, left, generation)

    async def check_schema(self) -> int:
        """Raise SchemaNotMigrated unless `jobtui migrate` has been run for this code."""
        return await asyncio.to_thread(check_schema, self.dsn, self.schema, self.pooler)

    async def migrate(self) -> list[str]:
        """Apply the migrations the schema lacks (what `jobtui migrate` does); their names."""
        return await asyncio.to_thread(migrate_schema, self.dsn, self.schema, self.pooler)

    async def jobs(self, **options: Unpack[JobsQuery]) -> list[JobSummary]:
        """See `Client.jobs`."""
        filt, page = jobs_query(options)
        if filt.payload is not None:
            found = await self.search(filt, **page)
            return found.jobs
        call = jobs_call(filt, **page)
        result: list[JobSummary] = await self._with_conn(None, lambda c: aquery(c, call, self.schema))
        return result

    async def search(
        self, filt: JobFilter, *, error: str | None = None, limit: int = 100, before: int | None = None
    ) -> SearchResult:
        """See `Client.search`; cancel the task to stop it."""
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
        """See `Client.counts`."""
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
        """See `Client.enqueue`."""
        with self._enqueue_entered(job_type, payload, options) as call:
            return await self._with_conn(conn, lambda c: aenqueue(c, call, self.schema), autocommit=conn is None)

    async def enqueue_many(self, jobs: Iterable[NewJob], *, conn: object | None = None) -> list[int]:
        """Insert many jobs in one statement (COPY for large batches); ids in input order."""
        with entered(self.middleware, self._with_queues(jobs)) as batch:
            return await self._with_conn(conn, lambda c: aenqueue_many(c, batch, self.schema))


if TYPE_CHECKING:
    AsyncQueue = AsyncClient  # the name of 0.2.0, deprecated (see jobtui/__init__.py)
else:

    def __getattr__(name: str) -> type[ClientBase]:
        return renamed(__name__, name, {"AsyncQueue": AsyncClient})
