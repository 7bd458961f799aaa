"""The console on a real database of hostile rows, driven by Textual's pilot (issue 16):
any filter text is survived and shown literally; every pane, dialog, title, toast and the
job detail show the data escaped and never as markup."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from textual.widgets import Input

from jobtui.reads.metrics import DeadGroup
from jobtui.tui.panes import dead as dead_pane
from jobtui.tui.screens import ConfirmScreen, JobDetailScreen, JobListScreen
from tests.hostile import Texts, assert_safe, hostile, seed, visible

from .helpers import wait_for
from .test_console import confirm_question, console, keys, open_pane, table, text

HOSTILE = Texts(
    type="t\x1b]0;pwned-title\x07[/]",
    worker="w\x1b[2J\x1b[H[bold red]",
    error="e\x9b2J\u202e[link=http://evil.example]click[/link]",
    key="k\n",
    schedule="s[/red\u2066",
    actor="a",
)
ISSUE_FILTERS = ["[/]", "[/red", "list[int]", "[bold red]x[/]", "[link=http://e]x[/link]", "\\", "'", "x\x1b]0;t\x07"]


async def apply_filter(pilot: Any, app: Any, typed: str) -> None:
    """Type `typed` into the filter (as a paste would) and press enter."""
    await pilot.press("slash")
    box = app.query_one("#filter", Input)
    await wait_for(pilot, lambda: box.has_focus, what="the filter box")
    box.value = typed
    await wait_for(pilot, lambda: box.value == visible(typed), what="the filter escaped")
    await pilot.press("enter")
    needle = visible(typed).strip()
    await wait_for(pilot, lambda: app.needle == needle, what="the filter applied")
    status = text(app.query_one("#status"))
    assert (f"filter: '{needle}'" in status) if needle else ("filter:" not in status), status
    assert_safe(status)


async def filters_survive(dsn: str, filters: list[str]) -> None:
    async with console(dsn) as (app, pilot):
        ready = table(app, "ready")
        for typed in filters:
            await apply_filter(pilot, app, typed)
            shown = visible(typed).strip().lower()
            expected = [HOSTILE.type] if shown in visible(HOSTILE.type).lower() else []
            await wait_for(pilot, lambda e=expected: keys(ready) == e, what=f"rows for {typed!r}")
        await pilot.press("slash", "escape")
        await wait_for(pilot, lambda: keys(ready) == [HOSTILE.type], what="the filter cleared")
        read = app.latest
        await wait_for(pilot, lambda: app.latest is not read, what="a refresh after the filters")


@pytest.fixture
def hostile_dsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, HOSTILE)
    return dsn


async def test_the_issue_filters_are_shown_literally(hostile_dsn: str) -> None:
    await filters_survive(hostile_dsn, [*ISSUE_FILTERS, visible(HOSTILE.type)[1:9]])


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(hostile(), min_size=8, max_size=8))
def test_the_console_survives_any_filter(hostile_dsn: str, filters: list[str]) -> None:
    asyncio.run(filters_survive(hostile_dsn, filters))


async def test_every_pane_dialog_title_toast_and_detail_shows_hostile_rows_escaped(hostile_dsn: str) -> None:
    t = HOSTILE
    async with console(hostile_dsn) as (app, pilot):
        for pane, values in (
            ("ready", [t.type]),
            ("running", [t.type, t.worker]),
            ("dead", [t.type]),
            ("expiries", [t.type, t.worker]),
            ("schedules", [t.schedule, t.type]),
        ):
            shown = await open_pane(pilot, app, pane)
            await wait_for(pilot, lambda s=shown: s.row_count >= 1, what=f"rows in {pane}")
            cells = [cell.plain for row in shown.ordered_rows for cell in shown.get_row(row.key)]
            for cell in cells:
                assert_safe(cell)
            for value in values:
                assert visible(value) in cells, (pane, value, cells)

        assert app.latest is not None
        group = next(g for g in app.latest.snapshot.dead if g.status == "dead")
        await open_pane(pilot, app, "dead", dead_pane.dead_key(group))
        await pilot.press("r")
        question = await confirm_question(pilot, app)
        assert_safe(question, keep="\n")
        assert question.split("\n") == [
            f"Requeue every dead job of type {visible(t.type)} with error",
            f"  {visible(group.fingerprint)}",
            "1 row(s) will change (back to ready, attempts reset).",
            "Only these 1: jobs that join the group before you answer",
            "stay dead (press r again for them).",
        ]
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="the dialog closed")

        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobListScreen), what="the group's jobs")
        title = text(app.screen.query_one("#title"))
        assert title == f"dead jobs of {visible(t.type)}: {visible(group.fingerprint)}"
        await pilot.press("escape")

        await open_pane(pilot, app, "running", next(iter(keys(table(app, "running")))))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), what="the job detail")
        detail = app.screen.query_one("#detail")
        await wait_for(pilot, lambda: text(detail).startswith("Job "), what="the job read")
        assert_safe(text(detail), keep="\n")
        assert f"  worker        {visible(t.worker)}" in text(detail).split("\n")
        await pilot.press("escape")

        await open_pane(pilot, app, "schedules", t.schedule)
        await pilot.press("p")
        question = await confirm_question(pilot, app)  # pausing asks first, like every action
        assert_safe(question, keep="\n")
        assert visible(t.schedule) in question
        await pilot.press("y")
        toast = f"schedule {visible(t.schedule)} paused"
        await wait_for(pilot, lambda: any(str(n.message) == toast for n in app._notifications), what="the toast")
        for note in app._notifications:
            assert_safe(str(note.message))
            assert not note.markup


def test_a_dead_key_names_the_group_exactly() -> None:
    """Keys stay the exact data (rows are found by them), only what is shown is escaped."""
    group = DeadGroup("dead", HOSTILE.type, HOSTILE.error, 1, None, None, 1, 1)
    assert dead_pane.dead_rows([group], "")[0][0] == f"dead\x1f{HOSTILE.type}\x1f{HOSTILE.error}"
