"""Reconnecting async connections for long-running processes (workers, schedulers), and the
`Link` their connections share: one probe finds the database back after an outage, and
every connection comes back at once.

    link = Link(dsn, heartbeat_first=True)
    claims = Connection(dsn, "claim", link=link, gated=True)
    rows = await claims.run(call, schema)     # waits out an outage, then runs

No statement waits on a dead socket for long. Every connection ends within `within` seconds
of its peer going silent (libpq's TCP keepalives and tcp_user_timeout, db.tcp_bounds); a
statement that waited longer than that makes the link check, on a new connection, that the
database answers (which the TCP bounds cannot see behind a pooler, or from a server that
is frozen). When the link decides the database is unreachable, every connection on it is
abandoned at once (its socket shut down, so a statement in flight fails now, and reset
when closed, so nothing it sent arrives later), and none is used again: each opens anew
once the database answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from jobtui.kernel.db import (
    DEAD_SOCKET_SECONDS,
    Call,
    abound_server_end,
    aconnect,
    arun,
    first_line,
    is_connection_error,
    reconnect_delays,
    tcp_bounds,
)
from jobtui.kernel.errors import DatabaseUnavailable
from jobtui.kernel.server import now_call

T = TypeVar("T")
log = logging.getLogger("jobtui.db")

# How often the link looks for statements that waited too long.
WATCH_EVERY = 0.5


def abort(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> None:
    """End `conn`'s socket now, from any thread or task, without closing the descriptor
    psycopg owns: a statement waiting on it fails at once, and closing it later resets the
    connection (SO_LINGER 0) rather than sending on what was queued."""
    with (
        contextlib.suppress(OSError, ValueError, psycopg.Error),
        socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock,
    ):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)


def _nothing(rows: object) -> None:
    return None


async def answers(dsn: str, *, pooler: str | None, within: float, deadline: float) -> None:
    """Return once a new connection to `dsn` ran a statement; DatabaseUnavailable (or the
    driver's error) when it did not within `deadline` seconds. The statement goes through
    a pooler, which accepts connections without a server behind it."""
    try:
        async with asyncio.timeout(deadline):  # connecting: cancelled cleanly
            conn = await aconnect(dsn, autocommit=True, pooler=pooler, **tcp_bounds(dsn, within))
    except TimeoutError:
        raise DatabaseUnavailable(f"no connection within {deadline:g}s") from None
    try:
        await within_deadline(conn, arun(conn, now_call()), deadline)
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


async def within_deadline(conn: psycopg.AsyncConnection[Any], work: Awaitable[Any], deadline: float) -> None:
    """Run `work` (statements on `conn`); DatabaseUnavailable when it has not ended within
    `deadline` seconds, the connection aborted then (not a cancel: psycopg would wait to
    cancel the statement on the server, which may not answer)."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait((task,), timeout=deadline)
        if not done:
            raise DatabaseUnavailable(f"no answer to a statement within {deadline:g}s")
        task.result()
    finally:
        if not task.done():
            abort(conn)
            with contextlib.suppress(BaseException):
                await task


def attempt_deadline(within: float) -> float:
    """How long one attempt to reach the database may take, connection and statement."""
    return max(3.0, 2 * within)


async def until_answering(
    dsn: str,
    *,
    pooler: str | None,
    within: float,
    failed: Callable[[BaseException], None] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> bool:
    """Return True once a new connection to `dsn` ran a statement (`answers`), trying with
    the reconnect back-off (a new attempt at most every second) while older attempts still
    wait: after a silent partition heals, the newest attempt's packets get through at once,
    where a lone attempt would wait out its own retransmissions. `failed` hears each attempt
    that failed; returns False when `stopped()` turns true first."""
    loop = asyncio.get_running_loop()
    delays = reconnect_delays()
    attempts: set[asyncio.Future[None]] = set()
    deadline = attempt_deadline(within)
    next_at = loop.time()
    try:
        while stopped is None or not stopped():
            if loop.time() >= next_at:
                attempts.add(asyncio.ensure_future(answers(dsn, pooler=pooler, within=within, deadline=deadline)))
                next_at = loop.time() + next(delays)
            wait = max(0.0, next_at - loop.time())
            if stopped is not None:
                wait = min(wait, 0.2)
            if not attempts:
                await asyncio.sleep(wait)
                continue
            done, _ = await asyncio.wait(attempts, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            attempts -= done
            for task in done:
                exc = task.exception()
                if exc is None:
                    return True
                if failed is not None:
                    failed(exc)
        return False
    finally:
        for task in attempts:
            task.cancel()
        if attempts:
            await asyncio.gather(*attempts, return_exceptions=True)


class Link:
    """Whether the database answers, shared by the connections of one worker.

    When any of its connections fails, or a statement waits longer than `within` and a new
    connection gets no answer either, the link decides the database is unreachable: every
    connection on it is abandoned (see the module), and one probe tries to connect, a new
    attempt at most every second while older ones still wait, so that the first packet
    after a partition heals or a server restarts is answered. Every connection reconnects
    as soon as one attempt ran a statement, rather than each on a clock of its own. With
    `heartbeat_first`, connections opened as `gated` wait after each outage until
    `opened()` says the heartbeat answered: a worker extends the leases it holds before it
    reaps or claims anything.

    The state is plain (up, how many times the database came back, which of those the
    heartbeat went for) and every waiter re-reads it after each change, so no wake-up is lost
    however outages and reconnects interleave.
    """

    def __init__(
        self,
        dsn: str,
        *,
        heartbeat_first: bool = False,
        pooler: str | None = None,
        within: float = DEAD_SOCKET_SECONDS,
    ) -> None:
        self.dsn = dsn
        self.pooler = pooler
        # A connection ends this long after its peer went silent, and a statement that waited
        # this long makes the link check that the database answers.
        self.within = within
        self._heartbeat_first = heartbeat_first
        self._up = True
        self.generation = 0  # how many times the database came back
        self._opened = 0  # the generation the heartbeat went for
        self._changed = asyncio.Event()
        self._probe: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._members: weakref.WeakSet[Connection] = weakref.WeakSet()
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

    def join(self, conn: Connection) -> None:
        """`conn` is one of this link's: abandoned with the others, watched when it waits."""
        self._members.add(conn)

    def down(self, exc: BaseException) -> None:
        """The database is unreachable: abandon every connection, and wait for it to answer."""
        if not self._up:
            return
        self._up = False
        self.down_since = time.monotonic()
        for member in list(self._members):
            member.abandon()
        self._probe = asyncio.get_running_loop().create_task(self._wait_until_back(exc), name="jobtui-probe")
        self._notify()

    def opened(self, generation: int) -> None:
        """The heartbeat after the database came back (`generation`) went: gated
        connections may go on, unless it went away again meanwhile."""
        if self._up and generation == self.generation and self._opened != generation:
            self._opened = generation
            self._notify()

    async def _wait_until_back(self, first: BaseException) -> None:
        logged = False

        def failed(exc: BaseException) -> None:
            nonlocal logged
            if not logged:
                log.warning("database unreachable (%s); trying again every second at most", first_line(exc))
                logged = True

        await until_answering(self.dsn, pooler=self.pooler, within=self.within, failed=failed)
        if logged and self.down_since is not None:
            log.warning("database back after %.1fs", time.monotonic() - self.down_since)
        self._up = True
        self.generation += 1
        if not self._heartbeat_first:
            self._opened = self.generation
        self._notify()

    @property
    def _deadline(self) -> float:
        return attempt_deadline(self.within)

    def watching(self) -> None:
        """Start the watch of waiting statements (from a task of the link's loop)."""
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_statements(), name="jobtui-link-watch")

    async def _watch_statements(self) -> None:
        """Decide the database unreachable when a statement waited longer than `within` and
        a new connection gets no answer within its deadline either; a statement that is only
        slow costs one new connection per `within` while it waits."""
        checked = 0.0
        while True:
            await asyncio.sleep(WATCH_EVERY)
            now = time.monotonic()
            waiting = [m.busy_since for m in list(self._members) if m.busy_since is not None]
            if not self._up or not waiting or now - min(waiting) < self.within or now - checked < self.within:
                continue
            oldest = now - min(waiting)
            try:
                await answers(self.dsn, pooler=self.pooler, within=self.within, deadline=self._deadline)
            except (psycopg.Error, DatabaseUnavailable) as exc:
                if self._up:
                    log.warning(
                        "a statement has waited %.1fs and a new connection got no answer (%s): "
                        "abandoning every connection",
                        oldest,
                        first_line(exc),
                    )
                    self.down(exc)
            checked = time.monotonic()

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
        for task in (self._probe, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._probe = self._watch = None


class Connection:
    """One database connection that reconnects when its `Link` finds the database back,
    logging each outage once.

    `gated` connections wait for the link to open after an outage (see Link). A connection
    opened before an outage is never used after it: it may have missed it. `on_connect`
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
        self._own_link = link is None
        self.link = link or Link(dsn, pooler=pooler)
        self.link.join(self)
        self._gated = gated
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._generation = -1  # the link's generation the connection was opened in
        self._on_connect = on_connect
        self._each_transaction = each_transaction
        # Callers that share the connection (a worker's claims and its reaper) take turns
        # with their transactions: psycopg would nest one inside the other.
        self._one_transaction = asyncio.Lock()
        self._pooler = pooler
        self._down_since: float | None = None
        self.busy_since: float | None = None  # when the statement in flight was sent
        self._busy = 0

    async def get(self, stopping: asyncio.Event | None = None) -> psycopg.AsyncConnection[Any]:
        """The open connection, after waiting for the database (and the gate) if need be."""
        self.link.watching()
        while True:
            await self.link.wait(self._gated, stopping)
            if self._conn is not None:
                if not self._conn.closed and self._generation == self.link.generation:
                    return self._conn
                stale, self._conn = self._conn, None  # from before an outage: never reused
                abort(stale)
                if not self._busy:  # else the statement on it fails, and its caller closes it
                    await self._close(stale)
            generation = self.link.generation
            try:
                conn = await aconnect(
                    self.dsn, autocommit=True, pooler=self._pooler, **tcp_bounds(self.dsn, self.link.within)
                )
            except DatabaseUnavailable as exc:
                self.lost(exc)
                continue
            try:
                # The server's end bounded as this end is; watched by its own deadline, as the
                # link's watch sees only statements of a connection `get` gave out.
                bound = abound_server_end(conn, self.dsn, tcp_bounds(self.dsn, self.link.within), self._pooler)
                await within_deadline(conn, bound, attempt_deadline(self.link.within))
                if self._on_connect is not None:
                    await self._on_connect(conn)
            except BaseException as exc:
                await self._close(conn)
                if not is_connection_error(exc):
                    raise
                self.lost(exc)
                continue
            if generation != self.link.generation or not self.link.up:
                await self._close(conn)  # an outage began meanwhile
                continue
            self._conn, self._generation = conn, generation
            if self._down_since is not None:
                log.warning("%s connection back after %.1fs", self.role, time.monotonic() - self._down_since)
                self._down_since = None
            return conn

    def lost(self, exc: BaseException, conn: psycopg.AsyncConnection[Any] | None = None) -> None:
        """Forget the connection after an error (`conn`, the one that failed, when known);
        the next `get` reconnects."""
        if conn is not None and conn is not self._conn:
            # Replaced since (an outage came and went): only that one goes, quietly. Its
            # failure says nothing about the database now.
            abort(conn)
            asyncio.get_running_loop().create_task(self._close(conn))
            return
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("%s connection lost (%s); reconnecting", self.role, first_line(exc))
        # A connection from before the last outage failing says nothing about the database now.
        stale = self._conn is not None and self._generation != self.link.generation
        if self._conn is not None and not self._conn.closed:
            # Close quietly in the background: the server may be gone.
            abort(self._conn)
            asyncio.get_running_loop().create_task(self._close(self._conn))
        self._conn = None
        if not stale:
            self.link.down(exc)

    def abandon(self) -> None:
        """The link decided the database is unreachable: end the socket now. A statement in
        flight fails at once (its caller forgets the connection); an idle connection is
        closed by the next `get`, which opens a new one."""
        if self._conn is not None and not self._conn.closed:
            abort(self._conn)
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning("%s connection lost (abandoned: the database is unreachable); reconnecting", self.role)

    @contextlib.asynccontextmanager
    async def busy(self) -> AsyncIterator[None]:
        """Around statements sent on the connection got from `get`: the link watches how long
        they wait (a LISTEN's wait for notifications is not one)."""
        self._busy += 1
        if self.busy_since is None:
            self.busy_since = time.monotonic()
        try:
            yield
        finally:
            self._busy -= 1
            if not self._busy:
                self.busy_since = None

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
                async with self.busy():
                    if self._each_transaction is None:
                        sent = time.monotonic()
                        return await arun(conn, call, schema), sent
                    async with self._one_transaction:
                        sent = time.monotonic()  # before BEGIN, whose now() the statement reads
                        async with conn.transaction():
                            await self._each_transaction(conn)
                            return await arun(conn, call, schema), sent
            except psycopg.OperationalError as exc:
                self.lost(exc, conn)
                if not retry or (stopping is not None and stopping.is_set()):
                    raise

    async def close(self) -> None:
        if self._conn is not None:
            await self._close(self._conn)
            self._conn = None
        if self._own_link:
            await self.link.close()
