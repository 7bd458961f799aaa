"""Keys that come in one read (jobtui/tui/keys.py), driven by Textual's pilot against a real
database: every key of a burst is posted to the app at once, as a terminal's read delivers
them, before any of them has been handled."""

from __future__ import annotations

import psycopg
from textual import events
from textual.command import CommandInput, CommandList, CommandPalette

from jobtui.tui.app import JobtuiApp
from jobtui.tui.screens import ConfirmScreen, JobListScreen

from .helpers import audit, query, seed, wait_for
from .test_console import console
from .test_queues_pane import control, on_default_queue

CHARACTERS = {"enter": "\r", "escape": "\x1b", "slash": "/", "colon": ":"}


def burst(app: JobtuiApp, *keys: str) -> None:
    """`keys` as one read of the terminal: all in the app's queue before the first is handled."""
    for key in keys:
        app.post_message(events.Key(key, CHARACTERS.get(key, key)))


async def test_a_pane_its_drill_down_its_key_and_the_answer_in_one_read(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        burst(app, "3", "enter", "r", "y")  # the dead pane, a group's jobs, requeue its first, yes
        await wait_for(pilot, lambda: len(audit(dsn)) == 1, what="the requeue")
        [(actor, action, _, job_ids, rows)] = audit(dsn)
        assert (actor, action, rows) == ("console", "requeue", 1)  # one job: not the whole group
        assert job_ids[0] in [*s.dead_billing, *s.dead_reset, s.failed]
        assert isinstance(app.screen, JobListScreen)


async def test_a_filter_typed_with_its_slash_goes_into_the_box(dsn: str) -> None:
    seed(dsn)
    async with console(dsn) as (app, pilot):
        burst(app, "slash", "s", "m", "s", "enter")
        await wait_for(pilot, lambda: app.needle == "sms", what="the filter")


async def test_a_key_after_a_filter_goes_to_the_pane_not_into_the_box(dsn: str) -> None:
    """enter in the filter box closes it; the key typed after it is the pane's (3: the dead
    pane), not one more letter of the filter."""
    seed(dsn)
    async with console(dsn) as (app, pilot):
        burst(app, "slash", "s", "m", "s", "enter", "3")
        await wait_for(pilot, lambda: app.pane == "dead", what="the dead pane")
        assert app.needle == "sms"


async def test_a_search_and_its_bulk_key_in_one_read(dsn: str) -> None:
    """The search words and enter open the jobs search; r typed with them asks about its jobs
    (it would land in the filter box, which the search empties)."""
    seed(dsn)
    async with console(dsn) as (app, pilot):
        burst(app, "slash", *"status", "colon", *"dead", "enter", "r")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the bulk question")
        assert [type(s).__name__ for s in app.screen_stack[-2:]] == ["JobSearchScreen", "ConfirmScreen"]


async def test_a_limit_typed_with_its_answer_in_one_read(dsn: str) -> None:
    """A limit's value, enter and y in one read: the y answers the question the value opens (it
    would land in the limit's box as it closes, and the question would wait unanswered)."""
    seed(dsn)
    async with console(dsn, actor="olga") as (app, pilot):
        await on_default_queue(app, pilot)
        burst(app, "l", "5", "enter", "y")
        await wait_for(pilot, lambda: control(dsn) == [("queue", "default", None, 5)], what="the limit")
    assert [(a[1], a[4]) for a in audit(dsn)] == [("queue-limit", 1)]


async def test_a_rate_typed_with_its_answer_in_one_read(dsn: str) -> None:
    seed(dsn)
    async with console(dsn, actor="olga") as (app, pilot):
        await on_default_queue(app, pilot)
        burst(app, "t", "2", "0", "slash", "s", "enter", "y")
        await wait_for(
            pilot,
            lambda: query(dsn, "SELECT rate_per_second FROM jobtui.queue_control") == [(20.0,)],
            what="the rate",
        )
    assert [(a[1], a[4]) for a in audit(dsn)] == [("queue-rate", 1)]


async def test_enter_in_the_command_palette_holds_no_key(dsn: str) -> None:
    """Textual's own boxes submit to Textual, which tells the console nothing: enter there
    holds no key (the keys after it would wait HOLD_LIMIT for a submission never seen)."""
    seed(dsn)
    async with console(dsn) as (app, pilot):
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the palette")
        await pilot.press(*"0000")  # no command has a 0: at no point is one there to run
        box, found = app.screen.query_one(CommandInput), app.screen.query_one(CommandList)
        await wait_for(
            pilot, lambda: box.value == "0000" and app.focused is box and found.option_count == 0, what="no match"
        )
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette)  # nothing ran: it stays open
        assert not app.keys.waiting and not app.keys.held


async def test_escape_leaves_a_list_whose_rows_do_not_come_and_drops_the_keys_before_it(dsn: str) -> None:
    seed(dsn)
    with psycopg.connect(dsn) as locker:
        async with console(dsn) as (app, pilot):
            await pilot.press("3")
            await wait_for(pilot, lambda: app.pane == "dead", what="the dead pane")
            locker.execute("LOCK TABLE jobtui.job IN ACCESS EXCLUSIVE MODE")  # the list's read waits
            burst(app, "enter", "r", "y")
            await wait_for(pilot, lambda: isinstance(app.screen, JobListScreen), what="the list")
            await pilot.pause(0.3)
            assert app.keys.held and isinstance(app.screen, JobListScreen)  # r and y wait for its rows
            burst(app, "escape")
            await wait_for(pilot, app.on_main_screen, timeout=2.0, what="back at once")
            assert not app.keys.held  # r and y were for the list: dropped, not sent to the dead pane
            locker.rollback()
            await pilot.pause(0.5)
            assert app.on_main_screen() and not any(isinstance(x, ConfirmScreen) for x in app.screen_stack)
    assert audit(dsn) == []
