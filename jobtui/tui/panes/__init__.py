"""The console's panes, one module each; the order of `ALL` is that of the tabs and number keys."""

from __future__ import annotations

from jobtui.tui.panes.base import Goto, Pane, TablePane
from jobtui.tui.panes.charts import ChartsPane
from jobtui.tui.panes.dead import DeadPane
from jobtui.tui.panes.expiries import ExpiriesPane
from jobtui.tui.panes.queues import QueuesPane
from jobtui.tui.panes.ready import ReadyPane
from jobtui.tui.panes.running import RunningPane
from jobtui.tui.panes.schedules import SchedulesPane
from jobtui.tui.panes.why import WhyPane
from jobtui.tui.panes.worker import LogToWidget, WorkerPane
from jobtui.tui.panes.workers import WorkersPane

TABLES: tuple[type[TablePane], ...] = (
    ReadyPane, RunningPane, DeadPane, ExpiriesPane, SchedulesPane, QueuesPane, WorkersPane, WhyPane,
)  # fmt: skip
# In the order of their number keys (0 last, as on a keyboard); the worker's tab only with --work.
ALL: tuple[type[Pane], ...] = (
    ReadyPane, RunningPane, DeadPane, ExpiriesPane, SchedulesPane, WorkerPane, QueuesPane, ChartsPane, WorkersPane,
    WhyPane,
)  # fmt: skip

__all__ = [
    "ALL",
    "TABLES",
    "ChartsPane",
    "DeadPane",
    "ExpiriesPane",
    "Goto",
    "LogToWidget",
    "Pane",
    "QueuesPane",
    "ReadyPane",
    "RunningPane",
    "SchedulesPane",
    "TablePane",
    "WhyPane",
    "WorkerPane",
    "WorkersPane",
]
