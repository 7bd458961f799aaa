"""A viewer's console in `jobtui serve` cannot write at the database: it connects as a role
with the read grants of docs/grants.sql only (--viewer-dsn, JOBTUI_VIEWER_DSN), not as serve's.

A fault in the console stands as a hook that every console process imports at start
(tests/web.py, ConsoleFaults): the first connection a console opens sends a change of its own
(an audit row, a requeue, RESET ROLE then the audit row). A viewer's gets PostgreSQL's
permission error and the audit log stays as it was; an operator's, on serve's own role, could
have written (its statements are rolled back). Directly and through PgBouncer in transaction
mode; tests/integration/test_standby.py does the same on a standby. And serve refuses to start
for viewers without such a role, saying what to run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.web.users import VIEWER
from tests.roles import grant_roles
from tests.topology import PgBouncer
from tests.web import (
    PASSWORDS,
    ConsoleFaults,
    ServeProcess,
    audit_rows,
    header_where,
    open_console,
    read_only_role,
    seed_dead,
    signed_in,
    started_console,
    statuses,
    write_users,
)
from tests.workers import ROOT

DENIED = "42501 permission denied for table"


async def faults_of_both_roles(
    server: ServeProcess, faults: ConsoleFaults
) -> tuple[dict[str, str], dict[str, str], str]:
    """bob's console, then alice's: what each one's fault got, and bob's screen."""
    async with await signed_in(server.url, "bob") as client:
        _console, screen = await started_console(client, server.url, "the viewer's console")
        viewer = faults.next()
    async with await signed_in(server.url, "alice") as client:
        _console, _ = await started_console(client, server.url, "the operator's console")
        operator = faults.next()
    return viewer, operator, screen


def role(dsn: str) -> str:
    return str(conninfo_to_dict(dsn).get("user", "postgres"))


def assert_refused(viewer: dict[str, str]) -> None:
    assert viewer["audit"].startswith(f"{DENIED} audit"), viewer
    assert viewer["requeue"].startswith(f"{DENIED} job"), viewer
    assert viewer["reset role"].startswith(f"{DENIED} audit"), viewer  # RESET ROLE: still the viewers' role


async def test_a_viewers_console_gets_permission_errors_and_the_audit_log_stays(
    dsn: str, users: Path, tmp_path: Path
) -> None:
    ids = seed_dead(dsn, 2)
    faults = ConsoleFaults(tmp_path)
    with read_only_role(dsn) as viewer_dsn:
        server = ServeProcess(dsn, users, viewer_dsn=viewer_dsn, env=faults.env())
        try:
            viewer, operator, screen = await faults_of_both_roles(server, faults)
        finally:
            server.stop()
        assert (viewer["role"], operator["role"]) == (role(viewer_dsn), role(dsn)), (viewer, operator)
        assert f"{header_where(viewer_dsn)} schema jobtui" in screen  # the header names the viewers' role
    assert_refused(viewer)
    assert operator == {**operator, "audit": "ok", "requeue": "ok"}  # serve's own role: could have
    assert audit_rows(dsn) == []
    assert statuses(dsn, ids) == ["dead", "dead"]


async def test_a_viewers_console_through_pgbouncer_in_transaction_mode(dsn: str, users: Path, tmp_path: Path) -> None:
    ids = seed_dead(dsn, 2)
    faults = ConsoleFaults(tmp_path)
    params = conninfo_to_dict(dsn)
    with read_only_role(dsn) as direct:
        host, port = str(params.get("host", "")), int(str(params.get("port") or 5432))
        with PgBouncer.start(upstream_host=host, upstream_port=port, users=("postgres", role(direct))) as bouncer:
            pooled = bouncer.dsn(str(params["dbname"]))
            viewer_dsn = make_conninfo(pooled, user=role(direct))
            env = {**faults.env(), "JOBTUI_POOLER": "transaction"}
            server = ServeProcess(pooled, users, viewer_dsn=viewer_dsn, env=env)
            try:
                viewer, operator, _ = await faults_of_both_roles(server, faults)
            finally:
                server.stop()
    assert (viewer["role"], operator["role"]) == (role(direct), "postgres"), (viewer, operator)
    assert_refused(viewer)
    assert operator == {**operator, "audit": "ok", "requeue": "ok"}
    assert audit_rows(dsn) == []
    assert statuses(dsn, ids) == ["dead", "dead"]


def serve(dsn: str, users: Path, *args: str, viewer_dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    """`jobtui serve` as a user starts it, expected to stop before it listens."""
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL", "JOBTUI_VIEWER_DSN")}
    env["JOBTUI_DSN"] = dsn
    if viewer_dsn is not None:
        env["JOBTUI_VIEWER_DSN"] = viewer_dsn
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", *args, "serve", "--users", str(users), "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    [said] = result.stderr.splitlines()
    assert said.startswith("jobtui: error: ")
    return said


@pytest.fixture
def roles(dsn: str) -> Iterator[tuple[str, str]]:
    """The worker role's DSN and the read-only role's, made by docs/grants.sql."""
    with grant_roles(dsn) as made:
        yield made.worker_dsn, made.readonly_dsn


def test_serve_refuses_viewers_without_a_read_only_role_and_says_what_to_run(
    dsn: str, users: Path, roles: tuple[str, str]
) -> None:
    worker_dsn, readonly_dsn = roles
    run_grants = "-v read_only=1 -v create_role=1 -f docs/grants.sql"
    # No role for them: serve's own (a superuser here) may change everything.
    said = refusal(serve(dsn, users))
    assert "viewers (bob) must connect as a role that can change nothing" in said
    assert run_grants in said and "--viewer-dsn or JOBTUI_VIEWER_DSN" in said
    # The same for every console, operators' too, under --read-only.
    assert "every console (--read-only) must connect" in refusal(serve(dsn, users, "--read-only"))
    # A role that may write is no viewers' role.
    said = refusal(serve(dsn, users, viewer_dsn=worker_dsn))
    assert "its role holds INSERT on jobtui.audit, INSERT on jobtui.bulk_run" in said and run_grants in said
    # A role that does not exist: the driver's words, and what to run.
    nobody = make_conninfo(readonly_dsn, user="jobtui_nobody_here")
    said = refusal(serve(dsn, users, viewer_dsn=nobody))
    assert 'role "jobtui_nobody_here" does not exist' in said and run_grants in said
    # serve on the read-only role itself needs no second DSN when every console is read-only.
    server = ServeProcess(readonly_dsn, users, "--read-only")
    server.stop()
    assert "every console read-only" in server.log()


async def test_a_viewer_added_while_it_serves_operators_only_is_refused_a_console(dsn: str, tmp_path: Path) -> None:
    """Started for operators alone, serve needs no read-only role; a viewer added later gets
    no console (none on serve's role either), and is told why."""
    path = tmp_path / "users"
    users = write_users(path)
    users.remove("bob")
    server = ServeProcess(dsn, path)
    try:
        users.add("bob", PASSWORDS["bob"], role=VIEWER)
        async with await signed_in(server.url, "bob") as client:
            console = await open_console(client, server.url)
            assert await console.until_closed() == 4003
        assert "started without one (--viewer-dsn)" in console.screen.text()
        assert server.said("console refused to 'bob': no read-only role for viewers")
        assert server.consoles() == []
    finally:
        server.stop()
