"""Removing jobtui from a database: its schema, whole, and the roles docs/grants.sql created
for it (`jobtui uninstall`, which shows `inspect`'s answer and asks before `drop`).

A role is dropped only when its comment carries the mark grants.sql leaves when it creates a
role for this schema and database (`-v create_role=1`): a role that existed before, such as
the application's own, keeps existing, and loses only its privileges on the schema's objects,
which go with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from jobtui.kernel import migrate as migrations
from jobtui.kernel.db import Call, Rows, run
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import InvalidInput

# The comment docs/grants.sql puts on a role it creates, as format() fills it in with the
# schema and the database (tests/unit/test_deploy.py checks that the file says the same).
ROLE_MARK = "created by jobtui's docs/grants.sql for schema %I of database %I: jobtui uninstall drops it"
# Rows are counted up to this many per table before asking.
COUNT_CAP = 1_000_000
LOCK_TIMEOUT = "5s"


@dataclass(frozen=True, slots=True)
class Contents:
    """What `jobtui uninstall` would drop, and whether it may now."""

    schema: str
    database: str
    owner: str
    version: int
    tables: int
    sequences: int
    views: int
    functions: int
    jobs: int
    archived: int
    schedules: int
    audit_rows: int
    live_leases: int
    workers: list[str]
    read_only: bool
    roles_dropped: list[str] = field(default_factory=list)
    roles_kept: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Dropped:
    roles: list[str]
    kept: list[tuple[str, str]]  # (role, why it could not be dropped)


def _contents(rows: Rows) -> dict[str, object]:
    return rows.dicts()[0] if rows else {}


def _roles(rows: Rows) -> list[tuple[str, bool]]:
    role, made = rows.columns("role", "made_by_grants")
    return [(str(r[role]), bool(r[made])) for r in rows]


def inspect(conn: psycopg.Connection[object], schema: str = DEFAULT_SCHEMA) -> Contents:
    """What the schema holds and which roles go with it; InvalidInput when it is not a
    jobtui schema (no migration table: jobtui did not make it, and it drops nothing else)."""
    version = migrations.applied_version(conn, schema)
    if version is None:
        raise InvalidInput(
            f"schema {schema!r} is not jobtui's here (it does not exist, or has no migration table):"
            " nothing to uninstall; check --schema and --dsn"
        )
    try:
        with conn.transaction():
            found = run(conn, Call("uninstall_contents", {"schema_name": schema, "cap": COUNT_CAP}, _contents), schema)
    except psycopg.errors.UndefinedTable:
        raise InvalidInput(
            f"schema {schema!r} is at version {version}, older than any jobtui release: drop it yourself"
            " (DROP SCHEMA ... CASCADE), or `jobtui migrate` it first"
        ) from None
    roles = run(conn, Call("uninstall_roles", {"schema_name": schema, "mark": ROLE_MARK}, _roles), schema)

    def count(name: str) -> int:
        return int(str(found[name]))

    return Contents(
        schema=schema,
        database=str(found["database"]),
        owner=str(found["owner"]),
        version=version,
        tables=count("tables"),
        sequences=count("sequences"),
        views=count("views"),
        functions=count("functions"),
        jobs=count("jobs"),
        archived=count("archived"),
        schedules=count("schedules"),
        audit_rows=count("audit_rows"),
        live_leases=count("live_leases"),
        workers=[str(w) for w in found["workers"]],  # type: ignore[attr-defined]
        read_only=bool(found["read_only"]),
        roles_dropped=[r for r, made in roles if made],
        roles_kept=[r for r, made in roles if not made],
    )


def describe(contents: Contents) -> list[str]:
    """The lines `jobtui uninstall` shows before it asks."""

    def rows(n: int, what: str) -> str:
        return f"{'more than ' if n >= COUNT_CAP else ''}{min(n, COUNT_CAP):,} {what}"

    c = contents
    lines = [
        f"jobtui uninstall drops, in database {c.database!r}:",
        f"  schema {c.schema!r} (version {c.version}, owned by {c.owner}) and everything in it:"
        f" {c.tables} tables, {c.sequences} sequences, {c.views} views, {c.functions} functions;",
        f"  {rows(c.jobs, 'job(s)')}, {rows(c.archived, 'archived job(s)')}, {rows(c.schedules, 'schedule(s)')},"
        f" {rows(c.audit_rows, 'audit row(s)')} (`jobtui audit --json` keeps a copy of the audit log);",
    ]
    for role in c.roles_dropped:
        lines.append(f"  role {role!r}, which docs/grants.sql created for this schema;")
    if not c.roles_dropped:
        lines.append("  no role (none was created by docs/grants.sql for this schema).")
    if c.roles_kept:
        kept = ", ".join(repr(r) for r in c.roles_kept)
        lines.append(f"It keeps the roles {kept}: jobtui did not create them (their grants here go with the schema).")
    return lines


def drop(conn: psycopg.Connection[object], contents: Contents) -> Dropped:
    """Drop the schema and its roles in one transaction. A role that cannot be dropped (it
    holds privileges or objects elsewhere, or this role may not drop roles) is kept, with why."""
    schema = contents.schema
    dropped: list[str] = []
    kept: list[tuple[str, str]] = []
    with conn.transaction():
        run(conn, Call("uninstall_lock_timeout", {"lock_timeout": LOCK_TIMEOUT}, _none), schema)
        drop_schema(conn, schema)
        for role in contents.roles_dropped:
            try:
                with conn.transaction():  # a savepoint: a role that stays keeps the rest
                    run(conn, Call("uninstall_role_to_drop", {"role": role}, _none), schema)
                    run(conn, Call("uninstall_role_drop", {}, _none), schema)
                dropped.append(role)
            except psycopg.errors.DependentObjectsStillExist as exc:
                detail = (exc.diag.message_detail or "").replace("\n", "; ")
                kept.append((role, f"it is still used elsewhere: {detail}" if detail else "it is still used elsewhere"))
            except psycopg.errors.InsufficientPrivilege as exc:
                why = exc.diag.message_primary or "permission denied"
                kept.append((role, f"{why}: a role with CREATEROLE drops it"))
    return Dropped(dropped, kept)


def drop_schema(conn: psycopg.Connection[object], schema: str) -> None:
    """Drop `schema` whole, if it exists, in `conn`'s transaction: `jobtui uninstall`, and the
    schemas of `jobtui demo --reset` and `jobtui bench`, their own."""
    run(conn, Call("uninstall_schema_drop", {}, _none), schema)


def _none(rows: Rows) -> None:
    return None
