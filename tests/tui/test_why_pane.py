"""The Why pane on fixed data (fixtures.facts): pictures of the pane, of one queue opened from
the Queues pane, of a read-only console, and of the header naming the first cause; and pilots:
enter goes where the fix is, `a` shows every queue again, the database not answering comes
first.

After an intended change, look at the report, then:

    JOBTUI_TEST_DSN=... .venv/bin/pytest tests/tui/test_why_pane.py --snapshot-update
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.widgets import TabbedContent

from jobtui.reads.diagnosis import diagnose, unanswered
from jobtui.reads.fleet import Fleet
from jobtui.reads.overview import QueueLine
from jobtui.reads.scene import Scene
from jobtui.reads.why import Facts, Running, Waiting
from jobtui.tui import header, render
from jobtui.tui.app import WHY_ROWS
from jobtui.tui.data import Fetched
from jobtui.tui.panes.queues import QueuesPane
from jobtui.tui.panes.why import WhyPane, detail, why_rows
from jobtui.tui.screens import ConfirmScreen
from jobtui.tui.widgets import KeyedTable
from tests.hostile import assert_safe

from . import fixtures as fx
from .helpers import wait_for
from .test_key_gate import burst
from .test_snapshots import SIZE, after

Compare = Callable[..., bool]


def why_read(app: Any) -> bool:
    return bool(app.pane == "why" and app.query_one("#table-why", KeyedTable).row_count > 0)


def test_why_pane(snap_compare: Compare) -> None:
    # The paused queue first (its oldest wait is the longest), then the limit of reports, the
    # crash loop and the rate in default, the ramp and the full slots of imports; the header
    # names the first cause beside the oldest age.
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("0", until=why_read))


def test_why_of_one_queue_from_the_queues_pane(snap_compare: Compare) -> None:
    async def run_before(pilot: Any) -> None:
        await after("7")(pilot)
        pilot.app.query_one(QueuesPane).select("queue:imports")
        await pilot.press("0")
        await wait_for(pilot, lambda: why_read(pilot.app), what="the Why pane")
        await pilot.press("down")  # the full slots: run time now against the hour, slots needed
        await pilot.pause(0.1)

    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=run_before)


def test_why_pane_read_only(snap_compare: Compare) -> None:
    # The same diagnosis; the fix's key is an operator's console's, and the detail says so.
    assert snap_compare(fx.FixedApp(read_only=True), terminal_size=SIZE, run_before=after("0", until=why_read))


async def test_enter_goes_where_the_fix_is_and_a_shows_every_queue() -> None:
    app = fx.FixedApp()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        await pilot.press("7")
        app.query_one(QueuesPane).select("queue:reports")
        await pilot.press("0")
        await wait_for(pilot, lambda: why_read(app), what="the Why pane")
        why = app.query_one(WhyPane)
        assert why.only == ("queue", "reports")
        keys = [str(r.key.value) for r in app.query_one("#table-why", KeyedTable).ordered_rows]
        assert keys == ["queue:reports#0", "queue:reports#1"]
        assert "limit of 3 running at once holds queue reports" in str(app.query_one("#why-detail").render())
        await pilot.press("enter")  # the limit: its line in Queues, where l changes it
        await wait_for(pilot, lambda: app.pane == "queues", what="the Queues pane")
        assert app.query_one(QueuesPane).selected_key == "queue:reports"
        await pilot.press("0", "a")
        await wait_for(pilot, lambda: why.only is None, what="every queue again")
        shown = {str(r.key.value).split("#")[0] for r in app.query_one("#table-why", KeyedTable).ordered_rows}
        assert {"queue:emails", "queue:default", "type:email.send"} <= shown


async def test_keys_typed_as_the_why_pane_opens_wait_for_its_rows_and_follow_enter() -> None:
    """0, enter and p in one read: enter takes the first row (the paused queue) to its line in
    Queues once the rows are there, and p asks there to resume it."""
    app = fx.FixedApp()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        read, gate = app.source.fetch, threading.Event()

        def slow(needle: str = "") -> Fetched:
            gate.wait(5)  # the diagnosis is still being read while the keys come
            return read(needle)

        app.source.fetch = slow  # type: ignore[method-assign]
        burst(app, "0", "enter", "p")
        await wait_for(pilot, lambda: app.pane == "why" and len(app.keys.held) == 2, what="enter and p held")
        gate.set()
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        assert app.pane == "queues" and app.query_one(QueuesPane).selected_key == "queue:emails"


async def test_the_why_pane_left_before_its_rows_came_holds_no_key() -> None:
    """Left by a click (no key) while its diagnosis is read: the reads bring none from then on,
    and the keys typed on the pane it went to must not wait for one."""
    app = fx.FixedApp()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        read, gate = app.source.fetch, threading.Event()

        def slow(needle: str = "") -> Fetched:
            gate.wait(5)
            return read(needle)

        app.source.fetch = slow  # type: ignore[method-assign]
        await pilot.press("0")
        await wait_for(pilot, lambda: WHY_ROWS in app.keys.waiting, what="the Why pane's keys held")
        app.query_one("#panes", TabbedContent).active = "ready"
        await wait_for(pilot, lambda: not app.keys.waiting, timeout=2.0, what="nothing held on the Ready pane")
        gate.set()


async def test_the_database_not_answering_comes_first() -> None:
    app = fx.FixedApp()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        await pilot.press("0")
        await wait_for(pilot, lambda: why_read(app), what="the Why pane")
        assert isinstance(app.source, fx.FixedSource)
        app.source.unreachable = True
        app.refresh_data()
        caption = app.query_one("#why-caption")
        await wait_for(pilot, lambda: "not answering" in str(caption.render()), what="the database named first")
        assert "connection refused" in str(caption.render())


def test_rows_and_detail_escape_what_comes_from_the_database() -> None:
    d = fx.diagnosis()
    hostile = unanswered("boom \x1b[31m[red]x[/red]")
    rows = why_rows(hostile, None, "", render.Thresholds())
    assert rows[0][0] == "database#0"
    told = detail(hostile, "database#0").plain
    paused = detail(d, "queue:emails#0", read_only=True).plain
    assert "an operator's console: 7 p (this one is read-only)" in paused and "press 7" not in paused
    assert "\x1b" not in told and "\\x1b[31m[red]x[/red]" in told
    # Every subject with jobs waiting has a row; the one whose oldest wait is longest first.
    assert why_rows(d, None, "", render.Thresholds())[0][0] == "queue:emails#0"


def test_a_cause_of_part_of_a_queues_jobs_escapes_the_names_it_gives() -> None:
    """A paused type holds some of a queue's due jobs: the detail says of which queue, the
    queue's name and the type's from the database, shown and never acted on."""
    queue, paused = "q\x1b]8;;http://x\x07click\x1b]8;;\x07\x1b[2J\u202e", "t\x9b2J[red]x[/red]"
    worker = fx.process("w1", "worker", "h", 1, every_queue=1, types=[paused, "b"])
    facts = Facts(
        waiting=[Waiting(True, queue, paused, False, 3, 9.0, 1.0), Waiting(True, queue, "b", False, 2, 9.0, 1.0)],
        due_seen=5,
        running=[Running("w1", queue, "b", 1, 0, 2.0, 2.0)],
    )
    lines = [
        QueueLine("queue", queue, 5, 5, 1, 0, 30.0, None, None, None),
        QueueLine("type", paused, 3, 3, 0, 0, 30.0, None, fx.NOW, "ops"),
        QueueLine("type", "b", 2, 2, 0, 0, 30.0, None, None, None),
    ]
    d = diagnose(Scene.of(fx.snapshot(), lines, Fleet([worker]), facts))
    told = detail(d, f"queue:{queue}#0").plain
    assert "of the due jobs of queue" in told
    assert_safe(told, keep="\n")


def test_the_header_names_the_first_cause_once_the_oldest_wait_is_late() -> None:
    d, snap = fx.diagnosis(), fx.snapshot()
    late = header.first_cause(d, snap, render.Thresholds(oldest_ready_warn=60))
    assert late is not None and late.text == "queue emails is paused (by ops@bastion)"
    assert header.first_cause(d, snap, render.Thresholds(oldest_ready_warn=3600)) is None
    piece = header.cause_piece(late)
    assert isinstance(piece, Text) and piece.plain == "why queue emails is paused (by ops@bastion) (0)"
