"""Pictures of the console's main views on fixed data (pytest-textual-snapshot).

The data, the clock and the history are fixed (fixtures.FixedApp), so the pictures only change
when the console's look does. The jobs search reads the database itself: its pictures read
fixed rows of a real one. After an intended change, look at the report, then:

    JOBTUI_TEST_DSN=... .venv/bin/pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from textual.widgets import Input

from jobtui.tui.panes.queues import ValueScreen
from jobtui.tui.screens import ConfirmScreen, HelpScreen, JobDetailScreen, JobListScreen
from jobtui.tui.search import JobSearchScreen
from jobtui.tui.widgets import KeyedTable

from . import fixtures as fx
from .helpers import wait_for

SIZE = (120, 36)

Compare = Callable[..., bool]


async def steady(pilot: Any) -> None:
    """Let the screen settle, with the text boxes' cursors shown steadily: a blinking cursor
    would be drawn on or off depending on when the picture is taken."""
    for box in pilot.app.screen.query(Input):
        box.cursor_blink = False
    await pilot.pause(0.1)


def after(*keys: str, until: Callable[[Any], Any] | None = None) -> Callable[[Any], Awaitable[None]]:
    """A run_before: wait for the first read, press `keys`, wait for `until(app)`."""

    async def run_before(pilot: Any) -> None:
        app = pilot.app
        await wait_for(pilot, lambda: app.latest is not None, what="the fixed data")
        await wait_for(pilot, lambda: app.query_one("#table-ready", KeyedTable).row_count > 0, what="rows")
        for key in keys:
            await pilot.press(key)
        if until is not None:
            await wait_for(pilot, lambda: until(app), what=f"the view after {keys}")
        await steady(pilot)

    return run_before


def detail_loaded(app: Any) -> bool:
    return isinstance(app.screen, JobDetailScreen) and "Loading" not in str(app.screen.query_one("#detail").render())


def list_loaded(app: Any) -> bool:
    return isinstance(app.screen, JobListScreen) and app.screen.query_one(KeyedTable).row_count > 0


def test_ready_pane(snap_compare: Compare) -> None:
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after())


def test_ready_pane_80x24(snap_compare: Compare) -> None:
    # The vitals wrap onto a second line instead of being cut off.
    assert snap_compare(fx.FixedApp(), terminal_size=(80, 24), run_before=after())


def test_running_pane_with_an_expired_lease(snap_compare: Compare) -> None:
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("2"))


def test_queues_pane(snap_compare: Compare) -> None:
    # Opened from the Ready pane's first row (email.send): the cursor is on that type.
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("7"))


def test_dead_pane(snap_compare: Compare) -> None:
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("3"))


def test_dead_group_drilldown(snap_compare: Compare) -> None:
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("3", "enter", until=list_loaded))


def test_schedules_pane(snap_compare: Compare) -> None:
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("5"))


def test_job_detail(snap_compare: Compare) -> None:
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("2", "enter", until=detail_loaded))


def test_confirm_requeue_group(snap_compare: Compare) -> None:
    confirming = after("3", "r", until=lambda app: isinstance(app.screen, ConfirmScreen))
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=confirming)


def test_help(snap_compare: Compare) -> None:
    helping = after("question_mark", until=lambda app: isinstance(app.screen, HelpScreen))
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=helping)


def test_read_only_dead_pane(snap_compare: Compare) -> None:
    # No action keys in the footer.
    assert snap_compare(fx.FixedApp(read_only=True), terminal_size=SIZE, run_before=after("3"))


def test_database_unreachable(snap_compare: Compare) -> None:
    app = fx.FixedApp()

    async def run_before(pilot: Any) -> None:
        await after()(pilot)
        assert isinstance(app.source, fx.FixedSource)
        app.source.unreachable = True
        app.refresh_data()
        await wait_for(pilot, lambda: not app.connected, what="the failed read")
        await pilot.pause(0.3)  # a tick redraws the header

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_database_not_answering(snap_compare: Compare) -> None:
    app = fx.FixedApp()

    async def run_before(pilot: Any) -> None:
        await after()(pilot)
        assert isinstance(app.source, fx.FixedSource)
        app.source.hung_for = 4.0
        await pilot.pause(0.3)  # a tick redraws the header

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_last_hour_charts(snap_compare: Compare) -> None:
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("8"))


def test_rate_box(snap_compare: Compare) -> None:
    # t in the Queues pane on the type email.send, which has a rate of 20/s.
    assert snap_compare(
        fx.FixedApp(), terminal_size=SIZE,
        run_before=after("7", "t", until=lambda app: app.screen.__class__.__name__ == "ValueScreen"),
    )  # fmt: skip


def test_ramp_box(snap_compare: Compare) -> None:
    # u in the Queues pane on the queue emails, paused by ops@bastion.
    async def run_before(pilot: Any) -> None:
        await after("7")(pilot)
        queues = pilot.app.query_one("#table-queues", KeyedTable)
        queues.move_cursor(row=[str(r.key.value) for r in queues.ordered_rows].index("queue:emails"))
        await pilot.press("u")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ValueScreen), what="the ramp box")
        await steady(pilot)

    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=run_before)


# The jobs search reads the database itself: fixed rows of a real one, read in UTC.
ACME_JOBS = [
    # id, type, queue, status, attempts, max_attempts, last error, created (2025-03-14, UTC)
    (4219, "invoice.render", "billing", "dead", 3, 3, "KeyError: 'customer 311 has no billing address'", "09:24:13"),
    (4218, "invoice.render", "billing", "failed", 1, 3, "Permanent: currency XYZ of invoice 9 is not supported",
     "09:21:40"),
    (4217, "email.send", "emails", "ready", 0, None, None, "09:20:02"),
    (4215, "report.build", "reports", "running", 1, 3, None, "09:12:55"),
    (4214, "email.send", "emails", "done", 1, 25, None, "09:05:31"),
    (4212, "webhook.deliver", "default", "dead", 6, 6,
     "ConnectionError: POST https://hooks.example.com/12: connection reset by peer", "08:58:07"),
]  # fmt: skip
OTHER_JOBS = [4216, 4213]  # another account's, left out by the filter


@pytest.fixture
def search_dsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET TimeZone = 'UTC'").format(sql.Identifier(conn.info.dbname)))
        for job_id, job_type, queue, status, attempts, max_attempts, error, created in ACME_JOBS:
            at = f"2025-03-14 {created}+00"
            locked_until = "2099-01-01 00:00:00+00" if status == "running" else None
            finished = at if status in ("done", "dead", "failed") else None
            conn.execute(
                "INSERT INTO jobtui.job (id, type, queue, payload, status, attempts, max_attempts, last_error,"
                " created_at, run_at, locked_until, finished_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (job_id, job_type, queue, '{"account": "acme"}', status, attempts, max_attempts, error, at, at,
                 locked_until, finished),
            )  # fmt: skip
        for job_id in OTHER_JOBS:
            conn.execute(
                "INSERT INTO jobtui.job (id, type, payload, created_at) VALUES (%s, 'email.send', %s, %s)",
                (job_id, '{"account": "globex"}', "2025-03-14 09:00:00+00"),
            )
    return dsn


def searched(app: Any) -> bool:
    screen = app.screen
    if not isinstance(screen, JobSearchScreen) or screen.query_one("#search-progress").has_class("busy"):
        return False  # still reading (the count goes on after the page)
    return "match" in str(screen.query_one("#search-status").render())


def search_for(words: str) -> Callable[[Any], Awaitable[None]]:
    """A run_before: the filter box's words, then the search's page once counted."""

    async def run_before(pilot: Any) -> None:
        await after()(pilot)
        await pilot.press("slash", *words, "enter")
        await wait_for(pilot, lambda: searched(pilot.app), what="the search's page")
        # The progress bar animates to its end after the count: the picture is taken after.
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.1)

    return run_before


def test_jobs_search(snap_compare: Compare, search_dsn: str) -> None:
    # Six jobs of the account, newest first, in every status; another account's are left out.
    assert snap_compare(fx.FixedApp(search_dsn), terminal_size=SIZE, run_before=search_for("payload:account=acme"))


def test_confirm_bulk_discard(snap_compare: Compare, search_dsn: str) -> None:
    # d over the search: the three dead and failed jobs of the six, counted, then asked.
    async def run_before(pilot: Any) -> None:
        await search_for("payload:account=acme")(pilot)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen), what="the question")
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.1)

    assert snap_compare(fx.FixedApp(search_dsn), terminal_size=SIZE, run_before=run_before)
