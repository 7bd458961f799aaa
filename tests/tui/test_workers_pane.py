"""The Workers pane and the fleet's findings, driven by Textual's pilot on a real database.

The fleet's rows are written with the statement a process writes its own with
(core/members.register_call); what a process does with an order is tested with real worker
processes in tests/integration/test_fleet.py.
"""

from __future__ import annotations

from typing import Any

import psycopg
from textual.widgets import Input

from jobtui.core.members import Member, Status, register_call
from jobtui.kernel.db import run
from jobtui.kernel.views import parse_view
from jobtui.reads.fleet import read_fleet
from tests.hostile import assert_safe, visible

from .helpers import query, wait_for
from .test_console import answer, confirm_question, console, keys, table, text

Conn = psycopg.Connection[Any]


def register(dsn: str, name: str, **fields: Any) -> int:
    member = Member(name, fields.pop("kind", "worker"), 10.0, **fields)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row, _ = run(conn, register_call(member, Status("running")))
    return row


def enqueue(dsn: str, job_type: str, queue: str = "default") -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO jobtui.job (type, queue) VALUES (%s, %s)", (job_type, queue))


def header(app: Any) -> str:
    return text(app.query_one("#vitals"))


async def test_the_header_names_a_queue_no_worker_serves_and_a_type_none_handles_until_fixed(dsn: str) -> None:
    register(dsn, "w-default", queues={"default": 4}, types=["email.send"])
    async with console(dsn) as (app, pilot):
        assert "no live worker" not in header(app) and "no handler" not in header(app)
        enqueue(dsn, "email.send", "reports")  # a queue nobody serves
        enqueue(dsn, "pdf.render")  # a type nobody handles
        # Within one refresh of being staged (the console refreshes every 0.25 s here).
        await wait_for(pilot, lambda: "no live worker serves queue reports: 1 due" in header(app), timeout=3)
        await wait_for(pilot, lambda: "type pdf.render has 1 due job and no handler" in header(app), timeout=3)
        register(dsn, "w-reports", queues={"reports": 2}, types=["email.send", "pdf.render"])
        await wait_for(pilot, lambda: "no live worker" not in header(app), what="the queue served", timeout=3)
        await wait_for(pilot, lambda: "no handler" not in header(app), what="the type handled", timeout=3)
        # Two versions at once (a rolling upgrade) are named, in amber.
        register(dsn, "w-next", every_queue=4, types=["email.send"], version="9.9.9")
        await wait_for(pilot, lambda: "2 versions running: 0.3.0 (2), 9.9.9 (1)" in header(app), timeout=3)


async def test_quiet_and_stop_from_the_pane_ask_first_and_write_the_order_with_its_audit(dsn: str) -> None:
    row = register(dsn, "w1", every_queue=5, types=["email.send"])
    register(dsn, "w2", every_queue=5, types=["email.send"], host="other-host")
    async with console(dsn, actor="alice@ops") as (app, pilot):
        await pilot.press("9")
        workers = table(app, "workers")
        await wait_for(pilot, lambda: sorted(keys(workers)) == sorted([str(row), str(row + 1)]), what="two rows")
        workers.move_cursor(row=keys(workers).index(str(row)))
        await pilot.press("p")
        question = await confirm_question(pilot, app)
        assert question.split("\n")[:2] == [
            f"Quiet worker w1 on {read_fleet_host(dsn, 'w1')} (0 in flight)?",
            "It claims no new jobs; its jobs in flight finish.",
        ]
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: wanted(dsn, "w1") == "quiet", what="the order written")
        assert query(dsn, "SELECT actor, action, rows FROM jobtui.audit") == [("alice@ops", "fleet-quiet", 1)]
        # Stop every process the filter shows: the other host's only.
        await pilot.press("slash")
        box = app.query_one("#filter", Input)
        await wait_for(pilot, lambda: box.has_focus, what="the filter box")
        box.value = "other-host"
        await pilot.press("enter")
        await wait_for(pilot, lambda: keys(workers) == [str(row + 1)], what="the filtered row")
        await pilot.press("X")
        question = await confirm_question(pilot, app)
        assert question.startswith("Stop worker w2 on other-host")
        await answer(pilot, app, "n")
        assert wanted(dsn, "w2") == "running"  # no: nothing changed
        await pilot.press("X")
        await confirm_question(pilot, app)
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: wanted(dsn, "w2") == "stopping", what="the stop written")
        assert wanted(dsn, "w1") == "quiet"


def wanted(dsn: str, name: str) -> str:
    [(value,)] = query(dsn, "SELECT wanted FROM jobtui.fleet WHERE name = %s", name)
    return str(value)


def read_fleet_host(dsn: str, name: str) -> str:
    with psycopg.connect(dsn) as conn:
        return next(p.host for p in read_fleet(conn).processes if p.name == name)


async def test_read_only_shows_the_fleet_and_gives_no_order(dsn: str) -> None:
    register(dsn, "w1", every_queue=5)
    async with console(dsn, read_only=True) as (app, pilot):
        await pilot.press("9")
        await wait_for(pilot, lambda: table(app, "workers").row_count == 1, what="the row")
        for key in ("p", "x", "P", "X"):
            await pilot.press(key)
        await pilot.pause(0.2)
        assert wanted(dsn, "w1") == "running"
        assert not any(app.active_pane.check_action(a, ()) for a in ("quiet", "stop", "quiet_shown", "stop_shown"))


async def test_a_worker_that_never_registered_shows_by_its_leases_and_enter_shows_its_jobs(dsn: str) -> None:
    register(dsn, "new-1", every_queue=5)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobtui.job (type, status, attempts, locked_by, locked_until, lease_token, heartbeat_at,"
            " started_at) VALUES ('old.type', 'running', 1, 'old-release:7', now() + interval '1 hour', 1, now(),"
            " now())"
        )
    async with console(dsn, open_view=parse_view("workers")) as (app, pilot):
        workers = table(app, "workers")
        await wait_for(pilot, lambda: "holder:old-release:7" in keys(workers), what="the holder's row")
        caption = text(app.query_one("#workers-caption"))
        assert "1 worker(s) hold leases unregistered (workers before 0.3.0 do not register)" in caption
        row = [c.plain for c in workers.get_row("holder:old-release:7")]
        assert row[:4] == ["old-release:7", "-", "not registered", "1 held"]
        workers.move_cursor(row=keys(workers).index("holder:old-release:7"))
        await pilot.press("enter")
        running = table(app, "running")
        await wait_for(pilot, lambda: app.pane == "running" and running.row_count == 1, what="its job")
        assert "held by old-release:7" in text(app.query_one("#running-page"))
        await pilot.press("a")
        await wait_for(pilot, lambda: "held by" not in text(app.query_one("#running-page")), what="every worker")


async def test_hostile_names_hosts_and_versions_are_shown_escaped(dsn: str) -> None:
    name, host, version = "w\x1b]0;pwned\x07[/]", "h\x1b[2J[bold]", "1.0\u202e[link=x]"
    register(dsn, name, host=host, version=version, every_queue=2)
    async with console(dsn) as (app, pilot):
        await pilot.press("9")
        workers = table(app, "workers")
        await wait_for(pilot, lambda: workers.row_count == 1, what="the row")
        cells = [c.plain for c in workers.get_row(keys(workers)[0])]
        for cell in cells:
            assert_safe(cell)
        assert {visible(name), visible(host), visible(version)} <= set(cells)
        assert_safe(header(app), keep="\n")
        await pilot.press("p")
        question = await confirm_question(pilot, app)
        assert_safe(question, keep="\n")
        assert visible(name) in question
