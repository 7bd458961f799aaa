"""Forward-only migrations, each applied under a transaction's advisory lock, so many
processes may race (through a transaction pooler too).

Most migrations run in one transaction. An online migration builds indexes on large tables
(`job`) with CREATE INDEX CONCURRENTLY, which cannot run in a transaction and takes no lock
that an enqueue, a claim or an outcome waits for: it is built between the transactions that
apply the migrations before and after it, and recorded, under the advisory lock, once its
indexes are valid. A build that was interrupted (the process or its session killed) leaves
an invalid index: the next `jobtui migrate` finds it, drops it and builds it again.
"""

from __future__ import annotations

import itertools
import re
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from jobtui.kernel.db import (
    Call,
    Rows,
    check_schema_name,
    first_int,
    first_line,
    int_set,
    migrations_dir,
    run,
    without_comments,
)
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import MigrationLockTimeout, SchemaNotMigrated, SchemaTooNew

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
# The one kind of statement an online migration holds: each of its index builds names its
# index and its table, so that the runner can tell a valid index from an interrupted build.
_BUILD = re.compile(
    r"^CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)\s+ON\s+\{schema\}\.(\w+)\b",
    re.IGNORECASE,
)
_CONCURRENTLY = re.compile(r"\bCONCURRENTLY\b", re.IGNORECASE)

# A migration's DDL that waits for a table's lock (behind a long query on the archive, say)
# makes every claim queue behind it: each try waits at most this long, then lets go.
LOCK_TIMEOUT = 5.0
LOCK_TRIES = 60
# How often a migration waiting for another's index build looks whether it ended.
BUILD_POLL = 0.5
# An online migration's indexes on tables smaller than this (a new install, a test's) are
# built in the migration's transaction: that takes milliseconds, while a CONCURRENTLY build
# waits for every transaction of the database older than it, whatever tables it reads.
SMALL_TABLE_BYTES = 8 * 2**20


@dataclass(frozen=True, slots=True)
class IndexBuild:
    """One index an online migration builds CONCURRENTLY: its name, its table, and the
    statement that builds it (`{schema}` not yet substituted)."""

    name: str
    table: str
    statement: str

    def text(self, schema: str) -> str:
        return self.statement.replace("{schema}", '"' + check_schema_name(schema) + '"')

    def plain(self, schema: str) -> str:
        """The build in a transaction, for a small table (SMALL_TABLE_BYTES)."""
        return re.sub(r"\s+CONCURRENTLY\b", "", self.text(schema), count=1, flags=re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    path: Path

    def text(self, schema: str) -> str:
        # Only the schema identifier is substituted, always quoted; nothing else is templated.
        quoted = '"' + check_schema_name(schema) + '"'
        return self.path.read_text(encoding="utf-8").replace("{schema}", quoted)

    def builds(self) -> tuple[IndexBuild, ...]:
        """The index builds of an online migration; empty for one run in a transaction."""
        return _builds(self.path)

    @property
    def online(self) -> bool:
        return bool(self.builds())


@cache
def _builds(path: Path) -> tuple[IndexBuild, ...]:
    text = without_comments(path.read_text(encoding="utf-8"))
    if not _CONCURRENTLY.search(text):
        return ()
    found = []
    for statement in (s.strip() for s in text.split(";")):
        match = _BUILD.match(statement)
        if statement and not match:
            raise RuntimeError(
                f"migration {path.name} builds an index CONCURRENTLY, so it may hold only `CREATE INDEX"
                f" CONCURRENTLY IF NOT EXISTS name ON {{schema}}.table ...` statements: {statement[:80]!r}"
            )
        if match:
            found.append(IndexBuild(match.group(1), match.group(2), statement))
    return tuple(found)


def available(directory: Path | None = None) -> list[Migration]:
    """The migrations this code ships, in version order."""
    found = []
    for path in sorted((directory or migrations_dir()).iterdir()):
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), path))
    versions = [m.version for m in found]
    # Increasing from 1, each number once; a number may be skipped (one kept for another change).
    if not versions or versions[0] != 1 or any(b <= a for a, b in itertools.pairwise(versions)):
        raise RuntimeError(f"migrations must be numbered from 1, each number once, found {versions}")
    for migration in found:
        migration.builds()  # an online migration that holds anything else is refused here
    return found


def code_version() -> int:
    """The schema version this code expects: its newest migration's."""
    return available()[-1].version


def _lock_key(schema: str) -> int:
    # A stable 32-bit key per schema, in the namespace of the jobtui lock class.
    return zlib.crc32(f"jobtui.kernel.migrate.{schema}".encode())


def _migration_table_exists(conn: psycopg.Connection[Any], schema: str) -> bool:
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f'"{check_schema_name(schema)}".migration',)
    ).fetchone()
    return bool(exists and exists[0])


def versions_call() -> Call[set[int]]:
    """Every applied migration's version (numbers may land out of order)."""
    return Call("migration_versions", {}, int_set)


def applied_version(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> int | None:
    """The newest applied version, or None when the schema has no migration table."""
    if not _migration_table_exists(conn, schema):
        return None
    versions = run(conn, versions_call(), schema)
    return max(versions, default=0)


def applied_versions(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> set[int]:
    """Every version applied to `schema` (empty without a migration table)."""
    if not _migration_table_exists(conn, schema):
        return set()
    return run(conn, versions_call(), schema)


def check(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> int:
    """Raise SchemaNotMigrated unless the schema has every migration of this code."""
    version, todo = pending(conn, schema)
    if version is None or todo:
        command = "jobtui migrate" if schema == DEFAULT_SCHEMA else f"jobtui --schema {schema} migrate"
        raise SchemaNotMigrated(
            f"{lacking(schema, version, todo)}: run `{command}` of this release first, as the schema's owner"
            f" (`{command} --dry-run` prints its SQL)"
        )
    return version


def lacking(schema: str, version: int | None, todo: list[Migration]) -> str:
    """What `schema` lacks of this code's migrations (`todo`, as `pending` lists them), in the
    words of every refusal: its version and this code's, or the migrations it lacks when one is
    numbered below its newest (numbers are handed out ahead, so they may land out of order)."""
    expected = code_version()
    if version is None:
        return f"schema {schema!r} is missing, this jobtui needs version {expected}"
    if all(m.version > version for m in todo):
        return f"schema {schema!r} is at version {version}, this jobtui needs version {expected}"
    names = ", ".join(f"{m.version:04d}_{m.name}" for m in todo)
    return f"schema {schema!r} is at version {version} but lacks {names}, which this jobtui needs"


def _bootstrap(schema: str) -> list[sql.Composed]:
    """What a migration's transaction runs first: the lock, and the schema and its migration
    table when they are missing."""
    ident = sql.Identifier(check_schema_name(schema))
    return [
        sql.SQL("SELECT pg_advisory_xact_lock({})").format(sql.Literal(_lock_key(schema))),
        # CREATE SCHEMA IF NOT EXISTS asks for CREATE on the database even when the schema
        # exists: a schema a DBA made for the owner role must not need it.
        sql.SQL(
            "DO $bootstrap$ BEGIN"
            " IF NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = {name}) THEN CREATE SCHEMA {ident}; END IF;"
            " END $bootstrap$"
        ).format(name=sql.Literal(schema), ident=ident),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.migration ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(ident),
    ]


def _execute(conn: psycopg.Connection[Any], statement: sql.Composed) -> None:
    conn.execute(statement)


def _recorded(schema: str, migration: Migration) -> sql.Composed:
    return sql.SQL("INSERT INTO {}.migration (version, name) VALUES ({}, {})").format(
        sql.Identifier(schema), sql.Literal(migration.version), sql.Literal(migration.name)
    )


def _dropped(schema: str, build: IndexBuild, *, concurrently: bool = True) -> sql.Composed:
    """What makes way for a build again: the invalid index an interrupted one left."""
    how = sql.SQL("CONCURRENTLY " if concurrently else "")
    return sql.SQL("DROP INDEX {}IF EXISTS {}.{}").format(how, sql.Identifier(schema), sql.Identifier(build.name))


def pending(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> tuple[int | None, list[Migration]]:
    """The schema's version (None: not migrated at all) and the migrations this code would
    apply to it, changing nothing (`jobtui migrate --check` and `--dry-run`): every one it
    lacks, a number handed out earlier and landed later included."""
    version = applied_version(conn, schema)
    applied = applied_versions(conn, schema)
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        conn.rollback()
    return version, [m for m in available() if m.version not in applied]


# What becomes of an index an online migration builds, as _index_states reads it.
VALID, MISSING, INVALID, BUILDING = "valid", "missing", "invalid", "building"


def _index_states(conn: psycopg.Connection[Any], schema: str, builds: list[IndexBuild]) -> dict[str, str]:
    def decode(rows: Rows) -> dict[str, str]:
        states = {}
        for d in rows.dicts():
            if d["valid"]:
                states[d["name"]] = VALID
            elif not d["present"]:
                states[d["name"]] = MISSING
            else:
                states[d["name"]] = BUILDING if d["building"] else INVALID
        return states

    params = {"schema_name": schema, "names": [b.name for b in builds]}
    return run(conn, Call("migration_indexes", params, decode), schema) if builds else {}


def interrupted(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> list[IndexBuild]:
    """The indexes of this code's online migrations, applied or not, that an interrupted build
    left invalid (and no build works on now): `jobtui migrate` drops and builds them again."""
    builds = [b for m in available() for b in m.builds()]
    if not builds or applied_version(conn, schema) is None:
        return []
    states = _index_states(conn, schema, builds)
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        conn.rollback()
    return [b for b in builds if states.get(b.name) == INVALID]


def small(conn: psycopg.Connection[Any], schema: str, migration: Migration) -> bool:
    """Whether an online migration's tables are small enough (SMALL_TABLE_BYTES, a table
    not made yet included) for its indexes to be built in the migration's transaction."""
    tables = sorted({b.table for b in migration.builds()})
    size = run(conn, Call("migration_table_bytes", {"schema_name": schema, "tables": tables}, first_int), schema)
    return (size or 0) < SMALL_TABLE_BYTES


def dry_run_sql(
    schema: str,
    version: int | None,
    todo: list[Migration],
    invalid: list[IndexBuild] | None = None,
    in_transaction: set[int] | None = None,
) -> str:
    """The SQL `jobtui migrate` would run on a schema at `version`, as one psql script; the
    indexes `invalid` (an interrupted build's) are dropped before they are built again, and
    the online migrations of `in_transaction` (versions: their tables are small now) are
    built in the transaction."""
    broken = {b.name for b in invalid or []}
    begin = ["BEGIN;", *(f"{statement.as_string(None)};" for statement in _bootstrap(schema))]
    parts = list(begin)
    if version is None:
        parts[1:1] = [f"-- schema {schema!r} is missing: it and its migration table are created"]
    for migration in todo:
        parts.append(f"\n-- {migration.path.name}")
        builds = migration.builds()
        if not builds:
            parts += [migration.text(schema).strip(), f"{_recorded(schema, migration).as_string(None)};"]
            continue
        if migration.version in (in_transaction or set()):
            parts.append(f"-- its tables are under {SMALL_TABLE_BYTES // 2**20} MiB: built in the transaction")
            for build in builds:
                if build.name in broken:
                    parts.append(f"{_dropped(schema, build, concurrently=False).as_string(None)};")
                parts.append(f"{build.plain(schema)};")
            parts.append(f"{_recorded(schema, migration).as_string(None)};")
            continue
        parts += [
            "-- built CONCURRENTLY, outside a transaction: enqueues and claims go on meanwhile",
            "COMMIT;",
            *_build_sql(schema, builds, broken),
            *begin,
            f"{_recorded(schema, migration).as_string(None)};",
        ]
    parts.append("COMMIT;")
    todo_builds = {b.name for m in todo for b in m.builds()}
    again = [b for b in invalid or [] if b.name not in todo_builds]
    if again:
        parts += ["\n-- indexes of migrations applied earlier, left invalid by a build that was interrupted"]
        parts += _build_sql(schema, again, broken)
    return "\n".join(parts) + "\n"


def _build_sql(schema: str, builds: tuple[IndexBuild, ...] | list[IndexBuild], broken: set[str]) -> list[str]:
    lines = []
    for build in builds:
        if build.name in broken:
            lines.append(f"{_dropped(schema, build).as_string(None)};  -- invalid: a build was interrupted")
        lines.append(f"{build.text(schema)};")
    return lines


def migrate(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    *,
    lock_timeout: float = LOCK_TIMEOUT,
    tries: int = LOCK_TRIES,
    waited: Callable[[str], None] | None = None,
    built: Callable[[str], None] | None = None,
) -> list[Migration]:
    """Apply every missing migration to `schema`; return the ones applied.

    The migrations up to an online one are applied in one transaction; its indexes are then
    built CONCURRENTLY, outside any transaction, and it is recorded with those after it. An
    index an interrupted build left invalid is dropped and built again (told to `built`, with
    each build and how long it took).

    Safe to run from several processes at once: each transaction first takes the schema's
    advisory lock, so the others wait and then find nothing left to do; a process that finds
    another building an index waits for that build. The lock is the transaction's, never the
    session's, so this works through a transaction pooler too. Refuses a schema newer than
    this code.

    A table lock it cannot get within `lock_timeout` seconds (0: wait as long as it takes)
    rolls the transaction back, so that the claims queued behind its request go on; it tries
    again after a pause, `tries` times in all, saying so to `waited`, then raises
    MigrationLockTimeout.
    """
    check_schema_name(schema)
    applied: list[Migration] = []
    for attempt in range(1, max(1, tries) + 1):
        try:
            _migrate_once(conn, schema, lock_timeout, applied, built or (lambda _: None))
            return applied
        except psycopg.errors.LockNotAvailable as exc:
            blocked = first_line(exc)
            if attempt >= tries:
                done = "no migration applied" if not applied else f"applied up to {applied[-1].path.stem}, no further"
                raise MigrationLockTimeout(
                    f"{done}: a table lock was not granted in {tries} tries of {lock_timeout:g}s"
                    f" ({blocked}); find what holds it in pg_stat_activity, or run again with a longer"
                    " --lock-timeout"
                ) from None
            pause = min(10.0, float(attempt))
            if waited is not None:
                since = "" if not applied else f" after {applied[-1].path.stem}"
                waited(
                    f"a table lock was not granted within {lock_timeout:g}s ({blocked}); nothing applied{since},"
                    f" the claims go on; trying again in {pause:g}s ({attempt} of {tries})"
                )
            time.sleep(pause)
    raise AssertionError("unreachable")


def _migrate_once(
    conn: psycopg.Connection[Any],
    schema: str,
    lock_timeout: float,
    applied: list[Migration],
    built: Callable[[str], None],
) -> None:
    conn.autocommit = True
    while True:
        online = _apply_until_online(conn, schema, lock_timeout, applied)
        if online is None:
            break
        for build in online.builds():
            _build(conn, schema, build, built)
    # An index of a migration applied earlier may be invalid too: a build of it by hand (as
    # the notes of 0.3.0's migration 0015 advised) that was interrupted, which that
    # migration's IF NOT EXISTS then took for built.
    for build in interrupted(conn, schema):
        _build(conn, schema, build, built)


def _apply_until_online(
    conn: psycopg.Connection[Any], schema: str, lock_timeout: float, applied: list[Migration]
) -> Migration | None:
    """In one transaction under the advisory lock: apply the missing migrations in order, up
    to the first online one whose indexes are not all valid yet, which is returned (None
    once every migration is applied). One whose indexes are valid is recorded."""
    ident = sql.Identifier(schema)
    known = available()
    now_applied: list[Migration] = []
    with conn.transaction():
        for statement in _bootstrap(schema):
            _execute(conn, statement)
        # After the advisory lock, which may wait for another migration as long as it takes.
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(lock_timeout * 1000)}ms",))
        current = applied_version(conn, schema) or 0
        if current > known[-1].version:
            raise SchemaTooNew(
                f"schema {schema!r} is at version {current} but this jobtui knows only "
                f"{known[-1].version}: upgrade jobtui instead of migrating"
            )
        # Every missing one: numbers are handed out ahead, one per change under way, so one may
        # land after a higher one was applied.
        done = {int(r[0]) for r in conn.execute(sql.SQL("SELECT version FROM {}.migration").format(ident))}
        online = None
        for migration in (m for m in known if m.version not in done):
            builds = list(migration.builds())
            if not builds:
                conn.execute(migration.text(schema).encode())
            else:
                states = _index_states(conn, schema, builds)
                if set(states.values()) != {VALID}:
                    if BUILDING in states.values() or not small(conn, schema, migration):
                        online = migration
                        break
                    _build_here(conn, schema, builds, states)
            _execute(conn, _recorded(schema, migration))
            now_applied.append(migration)
    applied.extend(now_applied)  # committed
    return online


def _build_here(conn: psycopg.Connection[Any], schema: str, builds: list[IndexBuild], states: dict[str, str]) -> None:
    """Build the indexes of an online migration on small tables, in the transaction."""
    for build in builds:
        if states[build.name] == INVALID:
            _execute(conn, _dropped(schema, build, concurrently=False))
        if states[build.name] != VALID:
            conn.execute(build.plain(schema).encode())


def _build(conn: psycopg.Connection[Any], schema: str, build: IndexBuild, built: Callable[[str], None]) -> None:
    """Make `build`'s index valid, outside any transaction: drop it when an interrupted build
    left it invalid, and build it CONCURRENTLY; one process at a time (_building)."""
    rebuilt = False
    with _building(conn, schema, build):
        while True:
            state = _index_states(conn, schema, [build])[build.name]
            if state == VALID:
                return
            if state == BUILDING:
                # A build no `jobtui migrate` holds the lock for: one whose process was killed
                # while its session builds on, or one started by hand. Its end is awaited.
                time.sleep(BUILD_POLL)
                continue
            if state == INVALID:
                _execute(conn, _dropped(schema, build))
                rebuilt = True
            started = time.monotonic()
            conn.execute(build.text(schema).encode())
            took = time.monotonic() - started
            why = " (invalid: a build was interrupted)" if rebuilt else ""
            built(f"{'rebuilt' if rebuilt else 'built'} index {build.name}{why} concurrently in {took:.1f}s")


@contextmanager
def _building(conn: psycopg.Connection[Any], schema: str, build: IndexBuild) -> Iterator[None]:
    """Hold the lock of `build`'s index while it is built, so that two processes never build
    it at once: a build waiting for the table's lock behind another holds a snapshot, which
    the other's last phase waits for, and the deadlock this makes kills one of them.

    The lock is an advisory lock of a transaction held open on a second connection: a
    transaction, so that it works through a transaction pooler, and ends with the process.
    That transaction holds no snapshot and no transaction id between its statements, so no
    build waits for it. The others take it in turns with a try every BUILD_POLL seconds, each
    a short transaction of its own, rather than by waiting in a statement: a waiting
    statement holds a snapshot, which the build would wait for while it waits for the build.
    """
    # Two keys of 31 bits, the schema's and the index's: apart from the migration's own lock,
    # one key of 64 bits. Literals, not bound parameters: the portal of a statement with
    # parameters keeps its snapshot until the transaction's next statement.
    lock = sql.SQL("SELECT pg_try_advisory_xact_lock({}, {})").format(
        sql.Literal(_lock_key(schema) & 0x7FFFFFFF), sql.Literal(zlib.crc32(build.name.encode()) & 0x7FFFFFFF)
    )
    with psycopg.connect(conn.info.dsn, password=conn.info.password or None, prepare_threshold=None) as holder:
        while holder.execute(lock).fetchone() != (True,):
            holder.rollback()
            time.sleep(BUILD_POLL)
        try:
            yield
        finally:
            holder.rollback()  # the lock goes with the transaction
