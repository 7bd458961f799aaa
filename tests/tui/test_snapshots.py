"""Pictures of the console's main views on fixed data (pytest-textual-snapshot).

The data, the clock and the history are fixed (fixtures.FixedApp), so the pictures only change
when the console's look does. After an intended change, look at the report, then:

    JOBTUI_TEST_DSN=... .venv/bin/pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from jobtui.tui.screens import ConfirmScreen, HelpScreen, JobDetailScreen, JobListScreen
from jobtui.tui.widgets import KeyedTable

from . import fixtures as fx
from .helpers import wait_for

SIZE = (120, 36)

Compare = Callable[..., bool]


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
        await pilot.pause(0.1)

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
