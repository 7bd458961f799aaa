"""Database roles for tests, made the way docs/grants.sql says: a worker role and a read-only
role of the test's own (roles belong to the whole server, so each name carries the test
process's id and a counter), created and granted by psql running the file.

    with grant_roles(admin_dsn) as roles:
        psycopg.connect(roles.readonly_dsn)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

GRANTS = Path(__file__).resolve().parents[1] / "docs" / "grants.sql"
_counter = itertools.count()


@dataclass(frozen=True)
class Roles:
    worker: str
    readonly: str
    worker_dsn: str
    readonly_dsn: str


def psql() -> str:
    found = shutil.which("psql")
    if found is None:
        pytest.skip("psql is not installed: docs/grants.sql is a psql script")
    return found


def run_grants(admin_dsn: str, role: str, *, schema: str = "jobtui", read_only: bool = False,
               create_role: bool = False) -> None:  # fmt: skip
    """`psql -v schema=... -v role=... [-v read_only=1] [-v create_role=1] -f docs/grants.sql`."""
    variables = ["-v", f"schema={schema}", "-v", f"role={role}"]
    variables += ["-v", "read_only=1"] if read_only else []
    variables += ["-v", "create_role=1"] if create_role else []
    subprocess.run([psql(), "-X", "-q", admin_dsn, *variables, "-f", str(GRANTS)], check=True, timeout=60)


def role_names(prefix: str = "jobtui") -> tuple[str, str]:
    n = f"{os.getpid()}_{next(_counter)}"
    return f"{prefix}_worker_{n}", f"{prefix}_readonly_{n}"


def drop_roles(admin_dsn: str, *roles: str) -> None:
    """Drop `roles` wherever they are left (a failed test), with their privileges here."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        for role in roles:
            exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            if not exists:
                continue
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@contextlib.contextmanager
def grant_roles(admin_dsn: str, *, schema: str = "jobtui") -> Iterator[Roles]:
    """A worker role and a read-only role, created and granted by docs/grants.sql."""
    worker, readonly = role_names()
    try:
        run_grants(admin_dsn, worker, schema=schema, create_role=True)
        run_grants(admin_dsn, readonly, schema=schema, read_only=True, create_role=True)
        yield Roles(worker, readonly, make_conninfo(admin_dsn, user=worker), make_conninfo(admin_dsn, user=readonly))
    finally:
        drop_roles(admin_dsn, worker, readonly)
