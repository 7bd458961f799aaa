"""The console and the measures on a real hot standby (pg_basebackup of a primary of the test's
own): nothing they run writes or fails in recovery, and each says it reads a standby and how
far behind the primary it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from prometheus_client.core import Metric
from psycopg.conninfo import make_conninfo
from textual.widgets import Static

from jobtui import Client, NewJob
from jobtui.kernel import migrate
from jobtui.reads.metrics import snapshot
from jobtui.service.prometheus import QueueCollector
from jobtui.tui.app import JobtuiApp
from tests.cluster import LocalCluster
from tests.roles import run_grants
from tests.topology import PRIMARY_SETTINGS, Standby
from tests.tui.helpers import wait_for
from tests.waits import wait_until
from tests.web import ConsoleFaults, ServeProcess, open_console, signed_in, write_users
from tests.workers import ROOT


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[LocalCluster, Standby]]:
    """A migrated primary with 30 ready jobs and 2 dead ones, and its standby, caught up."""
    with LocalCluster.create(settings=PRIMARY_SETTINGS) as primary:
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            migrate.migrate(conn)
            with Client(primary.dsn()) as queue:
                queue.enqueue_many([NewJob("mail.send", {"n": i}) for i in range(30)])
            conn.execute(
                "INSERT INTO jobtui.job (type, status, attempts, max_attempts, finished_at, last_error)"
                " SELECT 'pdf.render', 'dead', 3, 3, now(), 'KeyError: ' || i FROM generate_series(1, 2) i"
            )
        with Standby.of(primary) as standby:
            standby.wait_replayed(primary)
            yield primary, standby


def test_stats_on_a_standby_say_so_and_show_the_replay_lag(pair: tuple[LocalCluster, Standby]) -> None:
    _, standby = pair
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    command = [sys.executable, "-m", "jobtui.cli", "--dsn", standby.dsn()]
    shown = subprocess.run([*command, "stats"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "standby · replay lag" in shown.stdout.splitlines()[0]
    data = subprocess.run([*command, "stats", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert data.returncode == 0, data.stderr
    figures = json.loads(data.stdout)
    assert figures["standby"] is True and figures["replay_lag"] >= 0
    assert figures["totals"]["ready"] == 30 and figures["totals"]["dead"] == 2
    dead = subprocess.run([*command, "dead"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert dead.returncode == 0 and "KeyError" in dead.stdout, dead.stderr


def test_the_primary_is_no_standby(pair: tuple[LocalCluster, Standby]) -> None:
    primary, _ = pair
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        snap = snapshot(conn)
    assert (snap.standby, snap.replay_lag, snap.standby_note) == (False, None, "")


def test_the_standby_lag_grows_while_it_does_not_replay(pair: tuple[LocalCluster, Standby]) -> None:
    primary, standby = pair
    touch = "UPDATE jobtui.job SET run_at = run_at WHERE type = 'mail.send'"
    with psycopg.connect(primary.dsn(), autocommit=True) as writer, psycopg.connect(standby.dsn()) as conn:
        conn.autocommit = True
        writer.execute(touch)
        standby.wait_replayed(primary)
        assert snapshot(conn).replay_lag == 0  # streaming and caught up
        conn.execute("SELECT pg_wal_replay_pause()")
        try:
            writer.execute(touch)
            # Received, not replayed: behind by the time since the last transaction it replayed.
            lags: list[float | None] = []

            def behind() -> bool:
                lags.append(snapshot(conn).replay_lag)
                return lags[-1] is not None and lags[-1] >= 0.5

            wait_until(behind, 30, "the standby's replay lag to reach 0.5 s", lambda: str(lags))
        finally:
            conn.execute("SELECT pg_wal_replay_resume()")
    standby.wait_replayed(primary)


def test_prometheus_on_a_standby_exports_the_lag(pair: tuple[LocalCluster, Standby]) -> None:
    _, standby = pair
    metrics: dict[str, Metric] = {m.name: m for m in QueueCollector(standby.dsn()).collect()}
    assert metrics["jobtui_up"].samples[0].value == 1
    assert metrics["jobtui_standby"].samples[0].value == 1
    assert metrics["jobtui_standby_replay_lag_seconds"].samples[0].value >= 0
    ready = {s.labels["type"]: s.value for s in metrics["jobtui_jobs"].samples if s.labels["status"] == "ready"}
    assert ready == {"mail.send": 30, "pdf.render": 0}


async def test_the_read_only_console_on_a_standby_says_standby_and_shows_the_queue(
    pair: tuple[LocalCluster, Standby],
) -> None:
    _, standby = pair
    app = JobtuiApp(standby.dsn(), read_only=True, refresh_interval=0.25)
    app.animation_level = "none"
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        for _ in range(4):  # a few refreshes, each a snapshot and the running list
            seen = app.latest
            await wait_for(pilot, lambda seen=seen: app.latest is not seen, what="a refresh")
        assert app.connected, app.last_error
        header = str(app.query_one("#vitals", Static).content)
        assert "standby · replay lag" in header
        assert app.latest is not None and app.latest.snapshot.ready == 30


async def test_a_console_on_a_standby_is_read_only_by_itself_and_says_so(pair: tuple[LocalCluster, Standby]) -> None:
    """Started without --read-only: it asks the server whether it is in recovery, hides every
    change key, refuses a change before asking, and its header says why."""
    _, standby = pair
    app = JobtuiApp(standby.dsn(), refresh_interval=0.25)
    app.animation_level = "none"
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        await wait_for(pilot, lambda: app.read_only, what="the console read-only by itself")
        header = str(app.query_one("#vitals", Static).content)
        assert "read-only console (the server is a standby)" in header, header
        assert app.sub_title == "read-only"
        await pilot.press("3")  # the dead pane: 2 dead jobs, `r` would requeue them
        await wait_for(pilot, lambda: app.pane == "dead", what="the dead pane")
        assert app.check_action("requeue", ()) is False
        shown = {key for key, active in app.screen.active_bindings.items() if active.enabled and active.binding.show}
        assert "r" not in shown and "slash" in shown  # the filter stays
        await pilot.press("r")
        await pilot.pause(0.2)
        assert len(app.screen_stack) == 1  # no question asked
        app.confirm_then("Requeue?", lambda: "done")  # what a key would ask: refused, saying why
        await pilot.pause(0.1)
        assert len(app.screen_stack) == 1
        assert any("standby" in str(n.message) for n in app._notifications)


async def test_serve_on_a_standby_gives_viewers_the_read_only_role(
    pair: tuple[LocalCluster, Standby], tmp_path: Path
) -> None:
    """`jobtui serve` on a standby checks the viewers' role from the replicated catalog: one
    that may write is refused (a promotion would let it), the read-only role of docs/grants.sql
    is taken, and a fault in a viewer's console changes nothing."""
    primary, standby = pair
    role = f"viewer_standby_{os.getpid()}"
    run_grants(primary.dsn(), role, read_only=True, create_role=True)
    standby.wait_replayed(primary)
    users = tmp_path / "users"
    write_users(users)
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL", "JOBTUI_VIEWER_DSN")}
    env |= {"JOBTUI_DSN": standby.dsn(), "JOBTUI_VIEWER_DSN": standby.dsn()}
    writer = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "serve", "--users", str(users), "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert writer.returncode == 2 and "its role holds INSERT on jobtui.audit" in writer.stderr, writer.stderr
    faults = ConsoleFaults(tmp_path)
    viewer_dsn = make_conninfo(standby.dsn(), user=role)
    server = ServeProcess(standby.dsn(), users, viewer_dsn=viewer_dsn, env=faults.env())
    try:
        async with await signed_in(server.url, "bob") as client:
            console = await open_console(client, server.url)
            screen = await console.wait("the viewer's console", lambda s: "3 Dead" in s and "updated" in s)
            fault = faults.next()
    finally:
        server.stop()
    assert f"{role}@" in screen and "standby" in screen
    assert fault["role"] == role
    for change in ("audit", "requeue", "reset role"):  # the standby refuses first, then the role would
        assert fault[change].startswith("25006 cannot execute"), fault
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobtui.audit").fetchone() == (0,)


async def test_a_console_on_a_standby_shows_the_fleet_and_gives_no_order(pair: tuple[LocalCluster, Standby]) -> None:
    from textual.widgets import DataTable

    from jobtui.core.members import Member, Status, register_call
    from jobtui.kernel.db import run

    primary, standby = pair
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        run(conn, register_call(Member("w-standby", "worker", 600.0, every_queue=4), Status("running")))
    standby.wait_replayed(primary)
    app = JobtuiApp(standby.dsn(), refresh_interval=0.25)
    app.animation_level = "none"
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.latest is not None and app.read_only, what="the read-only console")
        await pilot.press("9")
        await wait_for(pilot, lambda: app.pane == "workers", what="the Workers pane")
        rows = app.query_one("#table-workers", DataTable)
        await wait_for(pilot, lambda: rows.row_count == 1, what="the fleet's row")
        assert not any(app.check_action(a, ()) for a in ("quiet", "stop", "quiet_shown", "stop_shown"))
        for key in ("p", "x", "P", "X"):
            await pilot.press(key)
        await pilot.pause(0.2)
        assert len(app.screen_stack) == 1  # no question asked
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT wanted FROM jobtui.fleet WHERE name = 'w-standby'").fetchone() == ("running",)
        conn.execute("DELETE FROM jobtui.fleet")
