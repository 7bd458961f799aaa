"""Forward-only migrations, each applied under a transaction's advisory lock, so many
processes may race (through a transaction pooler too)."""

from __future__ import annotations

import itertools
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from jobtui.kernel.db import Call, check_schema_name, first_line, int_set, migrations_dir, run
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import MigrationLockTimeout, SchemaNotMigrated, SchemaTooNew

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    path: Path

    def text(self, schema: str) -> str:
        # Only the schema identifier is substituted, always quoted; nothing else is templated.
        quoted = '"' + check_schema_name(schema) + '"'
        return self.path.read_text(encoding="utf-8").replace("{schema}", quoted)


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


def applied_version(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> int | None:
    """The newest applied version, or None when the schema has no migration table."""
    if not _migration_table_exists(conn, schema):
        return None
    return max(run(conn, Call("schema_versions", {}, int_set), schema), default=0)


def applied_versions(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> set[int]:
    """Every version applied to `schema` (empty without a migration table)."""
    if not _migration_table_exists(conn, schema):
        return set()
    return run(conn, Call("schema_versions", {}, int_set), schema)


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
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident),
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


def pending(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> tuple[int | None, list[Migration]]:
    """The schema's version (None: not migrated at all) and the migrations this code would
    apply to it, changing nothing (`jobtui migrate --check` and `--dry-run`): every one it
    lacks, a number handed out earlier and landed later included."""
    version = applied_version(conn, schema)
    applied = applied_versions(conn, schema)
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        conn.rollback()
    return version, [m for m in available() if m.version not in applied]


def dry_run_sql(schema: str, version: int | None, todo: list[Migration]) -> str:
    """The SQL `jobtui migrate` would run on a schema at `version`, as one psql script."""
    parts = ["BEGIN;", *(f"{statement.as_string(None)};" for statement in _bootstrap(schema))]
    if version is None:
        parts[1:1] = [f"-- schema {schema!r} is missing: it and its migration table are created"]
    for migration in todo:
        parts += [
            f"\n-- {migration.path.name}",
            migration.text(schema).strip(),
            f"{_recorded(schema, migration).as_string(None)};",
        ]
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"


# A migration's DDL that waits for a table's lock (behind a long query on the archive, say)
# makes every claim queue behind it: each try waits at most this long, then lets go.
LOCK_TIMEOUT = 5.0
LOCK_TRIES = 60


def migrate(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    *,
    lock_timeout: float = LOCK_TIMEOUT,
    tries: int = LOCK_TRIES,
    waited: Callable[[str], None] | None = None,
) -> list[Migration]:
    """Apply every missing migration to `schema`, in one transaction; return the ones applied.

    Safe to run from several processes at once: the transaction first takes the schema's
    advisory lock, so the others wait and then find nothing left to do. The lock is the
    transaction's, never the session's, so this works through a transaction pooler too.
    Refuses a schema newer than this code.

    A table lock it cannot get within `lock_timeout` seconds (0: wait as long as it takes)
    rolls the transaction back, so that the claims queued behind its request go on; it tries
    again after a pause, `tries` times in all, saying so to `waited`, then raises
    MigrationLockTimeout.
    """
    check_schema_name(schema)
    for attempt in range(1, max(1, tries) + 1):
        try:
            return _migrate_once(conn, schema, lock_timeout)
        except psycopg.errors.LockNotAvailable as exc:
            blocked = first_line(exc)
            if attempt >= tries:
                raise MigrationLockTimeout(
                    f"no migration applied: a table lock was not granted in {tries} tries of {lock_timeout:g}s"
                    f" ({blocked}); find what holds it in pg_stat_activity, or run again with a longer"
                    " --lock-timeout"
                ) from None
            pause = min(10.0, float(attempt))
            if waited is not None:
                waited(
                    f"a table lock was not granted within {lock_timeout:g}s ({blocked}); nothing applied,"
                    f" the claims go on; trying again in {pause:g}s ({attempt} of {tries})"
                )
            time.sleep(pause)
    raise AssertionError("unreachable")


def _migrate_once(conn: psycopg.Connection[Any], schema: str, lock_timeout: float) -> list[Migration]:
    ident = sql.Identifier(schema)
    conn.autocommit = True
    known = available()
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
        applied = {int(r[0]) for r in conn.execute(sql.SQL("SELECT version FROM {}.migration").format(ident))}
        todo = [m for m in known if m.version not in applied]
        for migration in todo:
            conn.execute(migration.text(schema).encode())
            _execute(conn, _recorded(schema, migration))
        return todo
