"""The statement kernel: the named statements of sql/, how a `Call` runs and how its rows
are read (by column name), connecting, and what a connection failure looks like.

Every runtime statement is a named block (`-- name: NAME`) of one of the files of sql/, one
file per owning module (claims.sql, core/claims.py); a name is unique across them all. A
fragment (`-- fragment: NAME`), text that several statements share, is written into each
statement (or fragment) that names it as `{NAME}` ({schema} and {channel} in it filled in as
in statements).

Nothing here imports another jobtui module but `domain` and `errors`: everything that runs
SQL builds on it.

    call = Call("server_now", {}, lambda rows: rows[0][0])
    with connect(dsn) as conn:
        now = run(conn, call)
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import ExecStatus
from psycopg.rows import TupleRow

from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import DatabaseUnavailable, InvalidInput
from jobtui.kernel.errors import first_line as first_line  # where its callers have always found it

T = TypeVar("T")


class Rows(Sequence[TupleRow]):
    """The rows a statement returned, and its column names: decoders read a column by its
    name, so that a column added to a statement cannot shift the others. Row by row it reads
    as a list of tuples.

    >>> rows = Rows([(7, "email.send")], ("id", "type"))
    >>> i, t = rows.columns("id", "type")
    >>> [(r[i], r[t]) for r in rows], rows.dicts()
    ([(7, 'email.send')], [{'id': 7, 'type': 'email.send'}])
    """

    __slots__ = ("_rows", "names")

    def __init__(self, rows: list[TupleRow], names: Sequence[str]) -> None:
        self._rows = rows
        self.names = tuple(names)

    @overload
    def __getitem__(self, index: int) -> TupleRow: ...
    @overload
    def __getitem__(self, index: slice) -> list[TupleRow]: ...
    def __getitem__(self, index: int | slice) -> TupleRow | list[TupleRow]:
        return self._rows[index]

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[TupleRow]:
        return iter(self._rows)

    def columns(self, *names: str) -> tuple[int, ...]:
        """The positions of the columns `names`; KeyError naming one the statement lacks."""
        try:
            return tuple(self.names.index(name) for name in names)
        except ValueError:
            missing = [n for n in names if n not in self.names]
            raise KeyError(
                f"the statement returns no column {', '.join(missing)} (it has {', '.join(self.names)})"
            ) from None

    def dicts(self) -> list[dict[str, Any]]:
        """Each row as a dict by column name."""
        return [dict(zip(self.names, row, strict=True)) for row in self._rows]


def _names(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> tuple[str, ...] | None:
    """The names of the result's columns, or None when the statement returned no rows.

    Read from the result itself: `cur.description` builds a Column object per column, with
    its type looked up, each time it is read (a claim's eleven columns, several times a
    statement, were most of what a small claim cost the worker).
    """
    res = cur.pgresult
    if res is None or not (res.nfields or res.status == ExecStatus.TUPLES_OK):
        return None
    # The statements of sql/ name their columns in ASCII.
    return tuple((res.fname(i) or b"").decode() for i in range(res.nfields))


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One named statement to run and how to read its rows."""

    name: str
    params: dict[str, Any]
    decode: Callable[[Rows], T]
    # Rows in binary: cheaper to load for many rows of numbers and timestamps (claims).
    binary: bool = False


_BLOCK_LINE = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema_name(schema: str) -> str:
    """Return `schema` if it is a plain lower-case identifier; raise InvalidInput otherwise."""
    if not _SCHEMA_NAME.match(schema):
        raise InvalidInput(f"bad schema name {schema!r}: use lower-case letters, digits and _ (at most 63)")
    return schema


# The fields filled in after the fragments: no fragment may take their names.
FIELDS = ("schema", "channel")


def parse_blocks(files: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The statements and the fragments of each file's text, by name; RuntimeError naming both
    files when a name is defined twice."""
    blocks: tuple[dict[str, str], dict[str, str]] = ({}, {})
    defined_in: dict[str, str] = {}
    for file, text in files.items():
        parts = _BLOCK_LINE.split(text)
        # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
        for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            if name in defined_in:
                raise RuntimeError(f"{file} defines statement {name!r}, which {defined_in[name]} defines already")
            if kind == "fragment" and name in FIELDS:
                raise RuntimeError(f"{file} names a fragment {name!r}, the name of a field filled in after fragments")
            blocks[kind == "fragment"][name] = body.strip()
            defined_in[name] = file
    return blocks


def parse_statements(files: dict[str, str]) -> dict[str, str]:
    """The statements of each file's text, by name (see parse_blocks)."""
    return parse_blocks(files)[0]


_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_]\w*)?\$")


def without_comments(text: str) -> str:
    """A statement's text as it is sent: its `--` comments cut, what is inside quotes kept.

    Shorter text is cheaper for the client on every execution: psycopg caches its parsing of
    a statement only up to a length (4 kB in 3.3), and the claim's comments alone took it past.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            so_far = "".join(out)
            line_start = so_far.rfind("\n") + 1
            if so_far[line_start:].strip():  # after code: the spaces before it go too
                out = [so_far.rstrip(" \t")]
            else:  # a line of its own: the whole line goes
                out, end = [so_far[:line_start]], end + 1
            i = end
            continue
        if c in "'\"":
            end = _quoted_end(text, i, escapes=c == "'" and _after_e_prefix(text, i))
        elif c == "$" and (tag := _DOLLAR_TAG.match(text, i)):
            close = text.find(tag.group(), tag.end())
            end = n if close < 0 else close + len(tag.group())
        else:
            end = i + 1
        out.append(text[i:end])
        i = end
    return "".join(out).strip()


def _after_e_prefix(text: str, quote: int) -> bool:
    """Whether the literal opened at `quote` is an E'' string: an E of its own before it, not
    the last letter of a word (`time'12:00'` is a typed literal)."""
    if quote < 1 or text[quote - 1] not in "Ee":
        return False
    return quote < 2 or not (text[quote - 2].isalnum() or text[quote - 2] in "_$")


def _quoted_end(text: str, start: int, *, escapes: bool) -> int:
    """Where the literal or quoted identifier opened at `start` ends: its quote doubled is
    part of it, and so, in an E'' string, is a quote after a backslash."""
    quote, i, n = text[start], start + 1, len(text)
    while i < n:
        if escapes and text[i] == "\\":
            i += 2
        elif text[i] == quote:
            if text.startswith(quote * 2, i):
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return n


@cache
def _blocks() -> tuple[dict[str, str], dict[str, str]]:
    folder = resources.files("jobtui.kernel").joinpath("sql")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return parse_blocks({f"sql/{f.name}": f.read_text(encoding="utf-8") for f in files})


def _query_texts() -> dict[str, str]:
    return _blocks()[0]


# `{NAME}`, not inside doubled braces (`{{...}}`, a literal brace for psycopg's format()).
_FRAGMENT_FIELD = re.compile(r"(?<!\{)\{(\w+)\}(?!\})")


def with_fragments(text: str, fragments: dict[str, str], within: tuple[str, ...] = ()) -> str:
    """`text` with each of `fragments` it names (`{NAME}`) written out, comments cut, and so
    the fragments those name in turn; {schema}, {channel} and other fields are left as they are.
    `within`: the fragments being written out around this text (a fragment naming itself,
    directly or not, is a defect of sql/)."""

    def written(m: re.Match[str]) -> str:
        name = m[1]
        if name not in fragments:
            return m[0]
        if name in within:
            raise ValueError(f"sql/ fragment {name!r} names itself (through {' -> '.join(within)})")
        return with_fragments(without_comments(fragments[name]), fragments, (*within, name))

    return _FRAGMENT_FIELD.sub(written, text)


def query_names() -> list[str]:
    """The names of every statement of sql/."""
    return list(_query_texts())


class Statements:
    """The named statements of sql/, bound to one schema.

    >>> Statements("jobtui")["claim_take"]  # doctest: +SKIP
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
            # Its name first, for whoever reads pg_stat_activity or pg_stat_statements.
            text = f"-- jobtui: {name}\n{without_comments(_query_texts()[name])}"
            # {schema} is the schema, {channel} its LISTEN/NOTIFY channel (an identifier too),
            # {NAME} a fragment's text, as if written out where it stands (planned as such).
            channel = sql.Identifier(self.channel)
            composed = sql.SQL(with_fragments(text, _blocks()[1])).format(schema=self._identifier, channel=channel)  # type: ignore[arg-type,unused-ignore]
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
        names = _names(cur)
        return call.decode(Rows(cur.fetchall(), names) if names is not None else Rows([], ()))


async def arun(conn: psycopg.AsyncConnection[Any], call: Call[T], schema: str = DEFAULT_SCHEMA) -> T:
    """Async counterpart of `run`."""
    async with conn.cursor(binary=call.binary) as cur:
        await cur.execute(statements(schema)[call.name], call.params)
        names = _names(cur)
        return call.decode(Rows(await cur.fetchall(), names) if names is not None else Rows([], ()))


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
        raise InvalidInput(
            f"bad DSN {describe_dsn(dsn)!r} ({first_line(exc)}); write it like postgresql://user@host:5432/dbname"
        ) from None
    return dsn


def connect_timeout(dsn: str) -> dict[str, Any]:
    """The default connect timeout, unless the DSN (or PGCONNECT_TIMEOUT) sets its own."""
    if "connect_timeout" in conninfo_to_dict(check_dsn(dsn)) or os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": DEFAULT_CONNECT_TIMEOUT}


# A connection whose peer stops answering (a silent partition, a host gone, a firewall or NAT
# that forgot the connection) fails within about this many seconds, rather than waiting out
# TCP's retransmissions (about 15 minutes on Linux). docs/scaling.md says why and how.
DEAD_SOCKET_SECONDS = 5.0
TCP_PARAMETERS = ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout")
# Those the server has too (tcp_keepalives_idle and so on, set by any role): its end of a
# long-lived session (connection_tcp_bound) and of once()'s transaction (job_effect_record).
SERVER_TCP_SETTINGS = ("keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout")


def tcp_bounds(dsn: str, within: float = DEAD_SOCKET_SECONDS) -> dict[str, Any]:
    """libpq's TCP parameters that end a connection to `dsn` within about `within` seconds of
    its peer going silent, sending or idle (those the DSN sets itself are left to it).

    `tcp_user_timeout` ends it when what it sent stays unacknowledged that long (a statement
    on a dead socket); keepalives probe an idle one (a LISTEN, a pooled connection) from
    half that on, every second. A server that is slow but reachable acknowledges both, so
    neither ends a long statement. Unix sockets ignore them.

    >>> tcp_bounds("postgresql://db/app")
    {'keepalives': 1, 'keepalives_idle': 2, 'keepalives_interval': 1, 'keepalives_count': 3, 'tcp_user_timeout': 5000}
    """
    seconds = max(1, round(within))
    idle = max(1, seconds // 2)
    bounds = {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": 1,
        "keepalives_count": max(1, seconds - idle),
        "tcp_user_timeout": round(max(1.0, within) * 1000),
    }
    given = conninfo_to_dict(check_dsn(dsn))
    return {k: v for k, v in bounds.items() if k not in given}


def connection_options(dsn: str, within: float = DEAD_SOCKET_SECONDS) -> dict[str, Any]:
    """The libpq options jobtui gives its own connections to `dsn`, for a handler's own:
    a connect timeout and the TCP bounds of `tcp_bounds` (each unless the DSN sets it).

        with psycopg.connect(dsn, **jobtui.connection_options(dsn)) as conn: ...
    """
    return {**connect_timeout(dsn), **tcp_bounds(dsn, within)}


def server_words(error: str) -> str:
    """What the server (or the network) answered, without libpq's prefix naming where it
    connected, which the message names already and which a socket's long path would make
    crowd out the answer.

    >>> server_words('connection failed: connection to server at "db" failed: FATAL:  role "x" does not exist')
    'FATAL: role "x" does not exist'
    """
    head, sep, tail = error.rpartition(" failed: ")
    if not sep or not head.startswith("connection"):
        return error
    return " ".join(tail.split())


def unavailable(dsn: str, exc: BaseException, *, waited: float | None = None) -> DatabaseUnavailable:
    """A one-line DatabaseUnavailable for `dsn`, naming the driver's first line of error (or,
    when a pool had no connection to give, how long the caller waited)."""
    why = f"no connection within {waited:g}s" if waited is not None else server_words(first_line(exc))
    return DatabaseUnavailable(
        f"cannot reach PostgreSQL at {describe_dsn(dsn)} ({why}); "
        "check that the server runs and --dsn / JOBTUI_DSN is right"
    )


# The poolers jobtui knows how to work behind. `transaction` is PgBouncer's pool_mode =
# transaction: a client holds a server connection only for one transaction, so nothing may
# outlive a transaction (no session SET, no prepared statement, no LISTEN, no session lock).
# Session pooling keeps one server connection per client, as a direct connection does.
POOLERS = ("none", "session", "transaction")


def pooler_mode(pooler: str | None = None) -> str:
    """`pooler`, else JOBTUI_POOLER, else "none": "transaction" or "none" (session pooling is
    the same as none); InvalidInput saying what to write otherwise."""
    value = (pooler if pooler is not None else os.environ.get("JOBTUI_POOLER") or "none").strip().lower()
    if value not in POOLERS:
        raise InvalidInput(
            f"bad pooler {value!r}: use --pooler transaction (JOBTUI_POOLER=transaction) behind PgBouncer's "
            "pool_mode = transaction, or none"
        )
    return "transaction" if value == "transaction" else "none"


def transaction_pooled(pooler: str | None = None) -> bool:
    """Whether connections go through a transaction pooler (see pooler_mode)."""
    return pooler_mode(pooler) == "transaction"


def pooler_options(pooler: str | None = None) -> dict[str, Any]:
    """Connection options for `pooler`: behind a transaction pooler, no statement is
    prepared (psycopg prepares one after five runs, on a server connection the next
    transaction may not get)."""
    return {"prepare_threshold": None} if transaction_pooled(pooler) else {}


def server_bound_call(dsn: str, options: dict[str, Any], pooler: str | None = None) -> Call[None] | None:
    """The statement that bounds the server's end of a new session as its client's end is
    bounded (the DSN's TCP parameters, else `options`', else tcp_bounds'); None behind a
    transaction pooler, whose server connections other clients share, or when the DSN turns
    keepalives off."""
    params = server_tcp_params(dsn, options)
    if transaction_pooled(pooler) or params is None:
        return None
    return Call("connection_tcp_bound", params, lambda rows: None)


def server_tcp_params(dsn: str, options: dict[str, Any]) -> dict[str, str] | None:
    """The server's TCP settings for a connection to `dsn` made with `options`: the bounds its
    client end has (the DSN's, else `options`', else tcp_bounds'); None when it turns
    keepalives off."""
    given = conninfo_to_dict(dsn)
    if str(given.get("keepalives", options.get("keepalives", 1))) == "0":
        return None
    defaults = tcp_bounds("")
    return {k: str(given.get(k, options.get(k, defaults[k]))) for k in SERVER_TCP_SETTINGS}


def bound_server_end(
    conn: psycopg.Connection[Any], dsn: str, options: dict[str, Any], pooler: str | None = None
) -> None:
    """Run server_bound_call's statement on a new, long-lived connection in autocommit.

    Its callers run it where a statement that waits is watched as any other (the worker's
    link, the console's first read, a pool's new connection); `connect` does not, so that
    its `connect_timeout` bounds it alone. A server that refuses it (set_config revoked) only
    loses the bound, never the connection."""
    call = server_bound_call(dsn, options, pooler)
    if call is not None:
        with _refusal_told():
            run(conn, call)


async def abound_server_end(
    conn: psycopg.AsyncConnection[Any], dsn: str, options: dict[str, Any], pooler: str | None = None
) -> None:
    """Async counterpart of `bound_server_end`."""
    call = server_bound_call(dsn, options, pooler)
    if call is not None:
        with _refusal_told():
            await arun(conn, call)


@contextlib.contextmanager
def _refusal_told() -> Iterator[None]:
    """A refusal of the bound (not a lost connection) is told once, and the connection kept."""
    try:
        yield
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        _unbounded(exc)


_told_unbounded = False


def _unbounded(exc: psycopg.Error) -> None:
    global _told_unbounded
    if not _told_unbounded:
        _told_unbounded = True
        log.warning(
            "the server refused to bound its end of jobtui's connections (%s): a client cut off by "
            "the network keeps its session until the server's TCP keepalive ends it",
            first_line(exc),
        )


def connect(dsn: str, *, autocommit: bool = False, pooler: str | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
    """A new connection, or DatabaseUnavailable with a message that says what to check.
    `pooler` defaults to JOBTUI_POOLER (see pooler_mode). Its TCP bounds (tcp_bounds) are the
    defaults; `kwargs` override them."""
    options = {**connection_options(dsn), **pooler_options(pooler), **kwargs}
    try:
        return psycopg.connect(dsn, autocommit=autocommit, **options)
    except psycopg.OperationalError as exc:
        raise unavailable(dsn, exc) from None


async def aconnect(
    dsn: str, *, autocommit: bool = False, pooler: str | None = None, **kwargs: Any
) -> psycopg.AsyncConnection[Any]:
    """Async counterpart of `connect`."""
    options = {**connection_options(dsn), **pooler_options(pooler), **kwargs}
    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, **options)
    except psycopg.OperationalError as exc:
        raise unavailable(dsn, exc) from None


def migrations_dir() -> Path:
    """The migrations shipped in the wheel, or the repository's own when run from source."""
    packaged = Path(str(resources.files("jobtui"))) / "migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "migrations"


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


def wait_for_database(
    dsn: str, timeout: float, *, what: str = "jobtui", pooler: str | None = None
) -> psycopg.Connection[Any]:
    """A connection to `dsn` (behind `pooler`), trying for up to `timeout` seconds with the
    reconnect back-off; logs once while it waits. Raises DatabaseUnavailable when the time is up."""
    deadline = time.monotonic() + timeout
    delays = reconnect_delays()
    waited = False
    while True:
        try:
            conn = connect(dsn, pooler=pooler)
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


# Decoders of one-column results: a single column cannot shift.


def first_int(rows: Rows) -> int | None:
    """The first row's only column as an int, or None without rows."""
    return int(rows[0][0]) if rows else None


def int_set(rows: Rows) -> set[int]:
    return {int(r[0]) for r in rows}


def int_list(rows: Rows) -> list[int]:
    return [int(r[0]) for r in rows]
