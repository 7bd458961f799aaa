"""Pictures of the Workers pane and what the fleet adds to the console, on fixed data
(fixtures.fleet): the pane, read-only, the question before a quiet, a worker's jobs under
Running, the header's findings in an incident, and views opened by a link.

After an intended change, look at the report, then:

    JOBTUI_TEST_DSN=... .venv/bin/pytest tests/tui/test_workers_snapshots.py --snapshot-update
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobtui.kernel.views import parse_view
from jobtui.reads.fleet import Fleet
from jobtui.tui.screens import ConfirmScreen
from jobtui.tui.widgets import KeyedTable

from . import fixtures as fx
from .helpers import wait_for
from .test_snapshots import SIZE, after

Compare = Callable[..., bool]


def test_workers_pane(snap_compare: Compare) -> None:
    # Live, quiet, stopping and lost processes, a scheduler and a server; render-2's lease
    # has a lost row behind it.
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("9"))


def test_workers_pane_read_only(snap_compare: Compare) -> None:
    # The fleet is shown; no key to quiet or stop anything.
    assert snap_compare(fx.FixedApp(read_only=True), terminal_size=SIZE, run_before=after("9"))


def test_confirm_quiet_worker(snap_compare: Compare) -> None:
    asking = after("9", "p", until=lambda app: isinstance(app.screen, ConfirmScreen))
    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=asking)


def test_a_workers_jobs_under_running(snap_compare: Compare) -> None:
    def held(app: Any) -> bool:
        return bool(app.pane == "running" and app.query_one("#table-running", KeyedTable).row_count == 2)

    assert snap_compare(fx.FixedApp(), terminal_size=SIZE, run_before=after("9", "enter", until=held))


def incident() -> Fleet:
    """worker-a lost: the queues `imports` and `reports` are served only by a worker that
    stops; a newer version rolls out on app-2, whose app no longer handles report.build."""
    before = {p.name: p for p in fx.fleet().processes}
    newer = [t for t in fx.ALL_TYPES if t != "report.build"]
    return Fleet(
        [
            before["worker-a"]._replace(lost=True, seen_ago=64.0),
            before["worker-b"]._replace(version="0.3.1", state="running", wanted="running", in_flight=5,
                    queues={"default": 6, "emails": 2}, types=newer),
            before["reports-1"]._replace(types=newer),
            before["render-2"],
            before["app-1:881"],
        ]
    )  # fmt: skip


def test_fleet_findings_in_the_header(snap_compare: Compare) -> None:
    app = fx.FixedApp()
    assert isinstance(app.source, fx.FixedSource)
    app.source.fleet = incident()
    assert snap_compare(app, terminal_size=SIZE, run_before=after("9"))


def test_opened_on_a_type_of_dead_letters(snap_compare: Compare) -> None:
    app = fx.FixedApp(open_view=parse_view("dead:invoice.render"))

    async def run_before(pilot: Any) -> None:
        dead = pilot.app.query_one("#table-dead", KeyedTable)
        await wait_for(pilot, lambda: dead.row_count == 2, what="the type's two groups")
        await pilot.pause(0.1)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
