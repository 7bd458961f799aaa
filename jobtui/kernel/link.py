"""Reconnecting async connections for long-running processes (workers, schedulers), and the
`Link` their connections share: one probe finds the database back after an outage, and
every connection comes back at once.

    link = Link(dsn, heartbeat_first=True)
    claims = Connection(dsn, "claim", link=link, gated=True)
    rows = await claims.run(call, schema)     # waits out an outage, then runs
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from jobtui.kernel.db import Call, aconnect, arun, first_line, is_connection_error, reconnect_delays
from jobtui.kernel.errors import DatabaseUnavailable

T = TypeVar("T")
log = logging.getLogger("jobtui.db")


class Link:
    """Whether the database answers, shared by the connections of one worker.

    When any of its connections fails, one probe tries to connect with the reconnect
    back-off, and every connection reconnects as soon as it succeeds, rather than each on a
    clock of its own. With `heartbeat_first`, connections opened as `gated` wait after each
    outage until `opened()` says the heartbeat went: a worker extends the leases it holds
    before it reaps or claims anything.

    The state is plain (up, how many times the database came back, which of those the
    heartbeat went for) and every waiter re-reads it after each change, so no wake-up is lost
    however outages and reconnects interleave.
    """

    def __init__(self, dsn: str, *, heartbeat_first: bool = False, pooler: str | None = None) -> None:
        self.dsn = dsn
        self.pooler = pooler
        self._heartbeat_first = heartbeat_first
        self._up = True
        self.generation = 0  # how many times the database came back
        self._opened = 0  # the generation the heartbeat went for
        self._changed = asyncio.Event()
        self._probe: asyncio.Task[None] | None = None
        self.down_since: float | None = None

    @property
    def up(self) -> bool:
        return self._up

    @property
    def open(self) -> bool:
        """Up, and (with heartbeat_first) the heartbeat went since it came back."""
        return self._up and self._opened == self.generation

    @property
    def heartbeat_due(self) -> bool:
        """The database is back and gated connections wait for the heartbeat."""
        return self._up and self._opened != self.generation

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def down(self, exc: BaseException) -> None:
        """A connection failed: wait for the database to answer again."""
        if not self._up:
            return
        self._up = False
        self.down_since = time.monotonic()
        self._probe = asyncio.get_running_loop().create_task(self._wait_until_back(exc), name="jobtui-probe")
        self._notify()

    def opened(self, generation: int) -> None:
        """The heartbeat after the database came back (`generation`) went: gated
        connections may go on, unless it went away again meanwhile."""
        if self._up and generation == self.generation and self._opened != generation:
            self._opened = generation
            self._notify()

    async def _wait_until_back(self, first: BaseException) -> None:
        delays = reconnect_delays()
        logged = False
        while True:
            try:
                conn = await aconnect(self.dsn, autocommit=True, pooler=self.pooler)
            except DatabaseUnavailable as exc:
                if not logged:
                    log.warning("database unreachable (%s); trying again every second at most", first_line(exc))
                    logged = True
                await asyncio.sleep(next(delays))
                continue
            with contextlib.suppress(Exception):
                await conn.close()
            break
        if logged and self.down_since is not None:
            log.warning("database back after %.1fs", time.monotonic() - self.down_since)
        self._up = True
        self.generation += 1
        if not self._heartbeat_first:
            self._opened = self.generation
        self._notify()

    async def wait_for(
        self, ready: Callable[[], bool], stopping: asyncio.Event | None = None, timeout: float | None = None
    ) -> bool:
        """Until `ready()` (re-read after every change of the link); False after `timeout`.
        Raises DatabaseUnavailable when `stopping` is set first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            if stopping is not None and stopping.is_set():
                raise DatabaseUnavailable("stopped while the database was unreachable")
            waits = [asyncio.ensure_future(self._changed.wait())]
            if stopping is not None:
                waits.append(asyncio.ensure_future(stopping.wait()))
            left = None if deadline is None else deadline - time.monotonic()
            try:
                if left is not None and left <= 0:
                    return False
                await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
        return True

    async def wait(self, gated: bool, stopping: asyncio.Event | None = None) -> None:
        """Until the database answers (and, when `gated`, the heartbeat went first)."""
        if self.open if gated else self._up:
            return
        await self.wait_for(lambda: self.open if gated else self._up, stopping)

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe


class Connection:
    """One database connection that reconnects when its `Link` finds the database back,
    logging each outage once.

    `gated` connections wait for the link to open after an outage (see Link). `on_connect`
    sets the session up; behind a transaction pooler, where a session setting would reach
    whichever client gets the server connection next, `each_transaction` sets each call's
    own transaction up instead (SET LOCAL), and runs the call inside it.
    """

    def __init__(
        self,
        dsn: str,
        role: str,
        *,
        link: Link | None = None,
        gated: bool = False,
        on_connect: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
        each_transaction: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
        pooler: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.role = role
        self.link = link or Link(dsn, pooler=pooler)
        self._gated = gated
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._on_connect = on_connect
        self._each_transaction = each_transaction
        # Callers that share the connection (a worker's claims and its reaper) take turns
        # with their transactions: psycopg would nest one inside the other.
        self._one_transaction = asyncio.Lock()
        self._pooler = pooler
        self._down_since: float | None = None

    async def get(self, stopping: asyncio.Event | None = None) -> psycopg.AsyncConnection[Any]:
        """The open connection, after waiting for the database (and the gate) if need be."""
        while True:
            await self.link.wait(self._gated, stopping)
            if self._conn is not None and not self._conn.closed:
                return self._conn
            try:
                conn = await aconnect(self.dsn, autocommit=True, pooler=self._pooler)
            except DatabaseUnavailable as exc:
                self.lost(exc)
                continue
            try:
                if self._on_connect is not None:
                    await self._on_connect(conn)
            except BaseException as exc:
                await self._close(conn)
                if not is_connection_error(exc):
                    raise
                self.lost(exc)
                continue
            self._conn = conn
            if self._down_since is not None:
                log.warning("%s connection back after %.1fs", self.role, time.monotonic() - self._down_since)
                self._down_since = None
            return conn

    def lost(self, exc: BaseException) -> None:
        """Forget the connection after an error; the next `get` reconnects."""
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("%s connection lost (%s); reconnecting", self.role, first_line(exc))
        if self._conn is not None and not self._conn.closed:
            # Close quietly in the background: the server may be gone.
            asyncio.get_running_loop().create_task(self._close(self._conn))
        self._conn = None
        self.link.down(exc)

    @staticmethod
    async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
        # Closing a broken connection can fail in many ways; it is gone either way.
        with contextlib.suppress(Exception):
            await conn.close()

    async def run(self, call: Call[T], schema: str, stopping: asyncio.Event | None = None, *, retry: bool = True) -> T:
        """Run `call`, reconnecting and retrying while the database is unreachable.

        Only connection failures are retried: every call the worker makes is fenced by
        lease token, so running it again after an unknown outcome is harmless. With
        retry=False the failure is raised once the connection is forgotten.
        """
        return (await self.run_timed(call, schema, stopping, retry=retry))[0]

    async def run_timed(
        self, call: Call[T], schema: str, stopping: asyncio.Event | None = None, *, retry: bool = True
    ) -> tuple[T, float]:
        """`run`, and the monotonic time just before the statement that answered was sent
        (never later than the server received it: a lease it grants lasts at least that long
        from then)."""
        while True:
            conn = await self.get(stopping)
            try:
                if self._each_transaction is None:
                    sent = time.monotonic()
                    return await arun(conn, call, schema), sent
                async with self._one_transaction:
                    sent = time.monotonic()  # before BEGIN, whose now() the statement reads
                    async with conn.transaction():
                        await self._each_transaction(conn)
                        return await arun(conn, call, schema), sent
            except psycopg.OperationalError as exc:
                self.lost(exc)
                if not retry or (stopping is not None and stopping.is_set()):
                    raise

    async def close(self) -> None:
        if self._conn is not None:
            await self._close(self._conn)
            self._conn = None
