"""`jobtui uninstall` on a schema with jobs, schedules, audit rows and the roles docs/grants.sql
created for it: it shows what it drops, asks first, refuses in --read-only, and leaves nothing
of them behind (the catalog says so), while a role jobtui did not create keeps existing."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from jobtui.clients.client import Client
from jobtui.core import scheduler as sched
from jobtui.core.history import record_flow
from jobtui.core.registry import ScheduleSpec
from tests.roles import drop_roles, role_names, run_grants
from tests.workers import ROOT

Conn = psycopg.Connection[Any]


def jobtui(dsn: str, *args: str, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "--actor", "olga", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False, stdin=stdin,
    )  # fmt: skip


@pytest.fixture
def installed(dsn: str) -> Iterator[tuple[str, str, str]]:
    """The test database with jobs, a schedule, audit rows, the two roles grants.sql creates,
    and a role of the application's own that was granted the worker's privileges."""
    worker, readonly = role_names()
    own = f"app_{worker}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(own)))
    try:
        run_grants(dsn, worker, create_role=True)
        run_grants(dsn, readonly, read_only=True, create_role=True)
        run_grants(dsn, own)  # it exists: granted, not created, so not jobtui's to drop
        with Client(dsn) as q:
            ids = [q.enqueue("email.send", {"n": n}) for n in range(5)]
            q.cancel(ids[:2], actor="olga")
        with psycopg.connect(dsn, autocommit=True) as conn:
            with conn.transaction():
                sched.upsert(conn, ScheduleSpec(name="nightly", cron="0 3 * * *", type="report"), source="cli")
            sched.pause(conn, "nightly", actor="olga")
        yield worker, readonly, own
    finally:
        drop_roles(dsn, worker, readonly, own)


def catalog(conn: Conn, roles: tuple[str, ...]) -> dict[str, Any]:
    def one(query: str, *params: Any) -> Any:
        row = conn.execute(query.encode(), params).fetchone()
        assert row is not None
        return row[0]

    return {
        "schema": one("SELECT count(*) FROM pg_namespace WHERE nspname = 'jobtui'"),
        "relations": one("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                         " WHERE n.nspname = 'jobtui'"),
        "functions": one("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                         " WHERE n.nspname = 'jobtui'"),
        "types": one("SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
                     " WHERE n.nspname = 'jobtui'"),
        "triggers": one("SELECT count(*) FROM pg_trigger WHERE tgname LIKE '%%job%%' AND NOT tgisinternal"),
        "roles": sorted(r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)",
                                                    (list(roles),)).fetchall()),
        "role_comments": one("SELECT count(*) FROM pg_shdescription d JOIN pg_roles r ON r.oid = d.objoid"
                             " WHERE r.rolname = ANY(%s)", list(roles)),
        "grants": one("SELECT count(*) FROM pg_shdepend d JOIN pg_roles r ON r.oid = d.refobjid"
                      " WHERE r.rolname = ANY(%s)", list(roles)),
    }  # fmt: skip


def test_uninstall_leaves_nothing_of_jobtui(dsn: str, installed: tuple[str, str, str]) -> None:
    worker, readonly, own = installed
    roles = (worker, readonly, own)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # What the levers leave (migration 0013): a rate's bucket, a flow span, a bulk run, and
        # the payload's optional index (`jobtui index payload`).
        conn.execute("INSERT INTO jobtui.rate_bucket (kind, name, tokens, refilled_at) VALUES ('type', 't', 1, now())")
        record_flow(conn)
        conn.execute("INSERT INTO jobtui.bulk_run (action, filter, cutoff, last_id, next_id, started_by)"
                     " VALUES ('requeue', '{}', now(), 0, 1, 'olga')")  # fmt: skip
        conn.execute("CREATE INDEX job_payload_idx ON jobtui.job USING gin (payload jsonb_path_ops)")
        levers = "SELECT count(*) FROM pg_class WHERE oid = ANY(%s::regclass[])"
        made = ["jobtui.rate_bucket", "jobtui.queue_flow", "jobtui.bulk_run", "jobtui.job_payload_idx"]
        assert conn.execute(levers, (made,)).fetchone() == (4,)
        before = catalog(conn, roles)
        assert conn.execute("SELECT count(*) FROM jobtui.audit").fetchone() == (2,)
    assert before["schema"] == 1 and before["relations"] > 10 and before["functions"] >= 4
    assert before["roles"] == sorted(roles) and before["role_comments"] == 2 and before["grants"] > 0
    result = jobtui(dsn, "uninstall", "--yes")
    assert result.returncode == 0, result
    shown = result.stdout
    assert "schema 'jobtui' (version" in shown
    assert "5 job(s), 0 archived job(s), 1 schedule(s), 2 audit row(s)" in shown
    assert f"role {worker!r}, which docs/grants.sql created" in shown
    assert f"role {readonly!r}, which docs/grants.sql created" in shown
    assert f"It keeps the roles {own!r}" in shown
    assert shown.strip().splitlines()[-1] == f"dropped schema 'jobtui', role {readonly!r}, role {worker!r}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        after = catalog(conn, roles)
    assert after == {
        "schema": 0,
        "relations": 0,
        "functions": 0,
        "types": 0,
        "triggers": 0,
        "roles": [own],  # the application's role stays, with nothing of jobtui's granted
        "role_comments": 0,
        "grants": 0,
    }
    again = jobtui(dsn, "uninstall", "--yes")
    assert again.returncode == 2 and "nothing to uninstall" in again.stderr


def test_uninstall_asks_first_and_refuses_without_an_answer(dsn: str, installed: tuple[str, str, str]) -> None:
    refused = jobtui(dsn, "uninstall")  # no terminal, no --yes
    assert refused.returncode == 2 and "uninstall asks first" in refused.stderr, refused
    read_only = jobtui(dsn, "--read-only", "uninstall", "--yes")
    assert read_only.returncode == 2 and "--read-only forbids" in read_only.stderr, read_only
    # In a terminal it asks; a wrong answer drops nothing.
    main, child = pty.openpty()
    try:
        os.write(main, b"jobtu\n")
        typed = jobtui(dsn, "uninstall", stdin=child)
    finally:
        os.close(main)
        os.close(child)
    assert typed.returncode == 1 and "not confirmed: nothing dropped" in typed.stdout, typed
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobtui.job").fetchone() == (5,)
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = ANY(%s)", (list(installed),)).fetchone() == (
            3,
        )


def test_uninstall_refuses_while_leases_live(dsn: str) -> None:
    with Client(dsn) as q:
        q.enqueue("t")
        assert q.claim(["t"], worker="w1", limit=1)
    result = jobtui(dsn, "uninstall", "--yes")
    assert result.returncode == 2 and "1 job(s) run under live leases (workers w1)" in result.stderr, result
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'jobtui'").fetchone() == (1,)


def test_a_role_used_elsewhere_is_kept_and_said(dsn: str, server_dsn: str) -> None:
    worker, _ = role_names()
    other = f"jobtui_other_{os.getpid()}"
    try:
        run_grants(dsn, worker, create_role=True)
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(other)))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(other)))
            admin.execute(
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(other), sql.Identifier(worker))
            )
        result = jobtui(dsn, "uninstall", "--yes")
        assert result.returncode == 1, result
        assert result.stdout.strip().splitlines()[-1] == "dropped schema 'jobtui'"
        assert f"kept role {worker!r}: it is still used elsewhere: privileges for database {other}" in result.stderr
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(other)))
        drop_roles(dsn, worker)


def test_uninstall_refuses_a_read_only_server(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        database = sql.Identifier(str(conninfo_to_dict(dsn)["dbname"]))
        conn.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(database))
    result = jobtui(dsn, "uninstall", "--yes")
    assert result.returncode == 2 and "the server is read-only" in result.stderr, result
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'jobtui'").fetchone() == (1,)
