"""The Queues pane driven by Textual's pilot against a real database: pausing a type from the
Ready pane in three keys, resuming it, setting a queue's limit, and read-only refusing all.

Every change is checked in queue_control and in the audit log.
"""

from __future__ import annotations

from typing import Any

from jobtui import Client
from jobtui.kernel.domain import NewJob
from jobtui.tui.panes.queues import QueuesPane
from jobtui.tui.screens import ConfirmScreen
from jobtui.tui.widgets import KeyedTable

from .helpers import audit, query, seed, stays, wait_for
from .test_console import answer, confirm_question, console, keys, open_pane, table


def control(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT kind, name, paused_by, max_running FROM jobtui.queue_control ORDER BY kind, name")


async def on_default_queue(app: Any, pilot: Any) -> KeyedTable:
    """The Queues pane, its cursor on the default queue's line: its table."""
    await pilot.press("7")
    await wait_for(pilot, lambda: "queue:default" in keys(table(app, "queues")), what="the default queue")
    t = table(app, "queues")
    t.move_cursor(row=keys(t).index("queue:default"))
    await pilot.pause(0.05)
    return t


async def test_a_type_is_paused_from_the_ready_pane_in_three_keys_and_resumed(dsn: str) -> None:
    seed(dsn)
    async with console(dsn, actor="olga") as (app, pilot):
        await open_pane(pilot, app, "ready", "sms.send")
        await pilot.press("7")  # 1: the Queues pane, on the type selected in the Ready pane
        await wait_for(pilot, lambda: app.pane == "queues", what="the Queues pane")
        assert table(app, "queues").selected_key == "type:sms.send"
        await pilot.press("p")  # 2
        question = await confirm_question(pilot, app)
        assert "Pause type sms.send on every worker?" in question and "1 ready job(s) wait" in question
        await answer(pilot, app, "y")  # 3
        await wait_for(pilot, lambda: control(dsn) == [("type", "sms.send", "olga", None)], what="the pause")
        rows = table(app, "queues")
        await wait_for(pilot, lambda: "by olga" in str(rows.get_row("type:sms.send")), what="shown paused")
        await pilot.press("p")
        assert "Resume type sms.send?" in await confirm_question(pilot, app)
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: control(dsn) == [("type", "sms.send", None, None)], what="the resume")
    assert [(a[1], a[2], a[4]) for a in audit(dsn)] == [
        ("type-pause", "type sms.send", 1),
        ("type-resume", "type sms.send", 1),
    ]


async def test_a_queue_limit_is_typed_then_confirmed(dsn: str) -> None:
    seed(dsn)
    async with console(dsn, actor="olga") as (app, pilot):
        t = await on_default_queue(app, pilot)
        await pilot.press("l")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "LimitScreen", what="the limit box")
        await pilot.press("x", "enter")  # not a number: says so, changes nothing
        await wait_for(pilot, lambda: app.on_main_screen(), what="the box closed")
        assert any("not a number of jobs" in str(n.message) for n in app._notifications)
        await pilot.press("l")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "LimitScreen", what="the limit box")
        await pilot.press("3", "enter")
        question = await confirm_question(pilot, app)
        assert "at most 3 running at once across every worker" in question and "It was none" in question
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: control(dsn) == [("queue", "default", None, 3)], what="the limit")
        await wait_for(pilot, lambda: "3" in str(t.get_row("queue:default")[8]), what="the limit shown")
    assert [(a[1], a[2], a[4]) for a in audit(dsn)] == [("queue-limit", "queue default", 1)]


async def test_read_only_offers_no_lever_and_changes_nothing(dsn: str) -> None:
    seed(dsn)
    async with console(dsn, read_only=True) as (app, pilot):
        await pilot.press("7")
        await wait_for(pilot, lambda: app.pane == "queues", what="the Queues pane")
        await wait_for(pilot, lambda: table(app, "queues").row_count > 0, what="its rows")
        shown = {b.binding.action for b in app.screen.active_bindings.values()}
        assert not shown & set(QueuesPane.actions() - {"open", "filter", "sort", "why"})  # 0 (why) only reads
        await pilot.press("p", "l")
        await stays(pilot, lambda: app.on_main_screen() and not isinstance(app.screen, ConfirmScreen), 0.3)
    assert control(dsn) == [] and audit(dsn) == []


async def test_the_done_column_is_read_when_the_pane_opens_and_only_while_it_is_open(dsn: str) -> None:
    """Off the Queues pane the refreshes leave the done jobs by queue out (the header needs
    none); opened, the pane reads them at once and shows them, not zeros."""
    seed(dsn)
    query(dsn, "UPDATE jobtui.job SET status = 'done', finished_at = now() WHERE type = 'sms.send' RETURNING id")
    async with console(dsn) as (app, pilot):
        await wait_for(pilot, lambda: app.latest is not None, what="a first read")
        assert app.latest is not None and not app.latest.queues_done and not app.source.done_wanted
        t = await on_default_queue(app, pilot)
        await wait_for(
            pilot, lambda: app.latest is not None and app.latest.queues_done, what="a read with the done jobs"
        )
        await wait_for(pilot, lambda: str(t.get_row("type:sms.send")[7]) == "1", what="sms.send's done job shown")
        await pilot.press("1")
        await wait_for(pilot, lambda: not app.source.done_wanted, what="the Ready pane")


async def test_a_console_started_on_a_queue_with_done_jobs_only_reads_them_at_once(dsn: str) -> None:
    """`--open queue:NAME` on a queue whose jobs are all done: its line, with its done count,
    comes with the reads of the first moments, not a timer's interval later."""
    from jobtui.kernel.views import parse_view
    from jobtui.tui.app import JobtuiApp

    with Client(dsn, max_connections=1) as client:
        client.enqueue_many([NewJob("fast.ping", {}, queue="fast") for _ in range(3)])
    query(dsn, "UPDATE jobtui.job SET status = 'done', finished_at = now() WHERE queue = 'fast' RETURNING id")
    app = JobtuiApp(dsn, refresh_interval=30.0, open_view=parse_view("queue:fast"))
    app.animation_level = "none"
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: app.latest is not None and app.latest.queues_done, what="the done jobs read")
        t = table(app, "queues")
        await wait_for(pilot, lambda: t.selected_key == "queue:fast", what="the cursor on queue fast")
        assert str(t.get_row("queue:fast")[7]) == "3"


async def test_the_workers_pane_knows_a_queue_by_its_done_jobs(dsn: str) -> None:
    """The Workers pane's filter names a queue whose jobs of the last minute are all done."""
    from jobtui.tui.panes.workers import known_queues

    with Client(dsn, max_connections=1) as client:
        client.enqueue_many([NewJob("fast.ping", {}, queue="fast") for _ in range(2)])
    query(dsn, "UPDATE jobtui.job SET status = 'done', finished_at = now() WHERE queue = 'fast' RETURNING id")
    async with console(dsn) as (app, pilot):
        await pilot.press("9")
        await wait_for(pilot, lambda: app.pane == "workers" and app.source.done_wanted, what="the Workers pane")
        await wait_for(
            pilot, lambda: (v := app.view()) is not None and "fast" in known_queues(v), what="queue fast known"
        )
