"""The console's panes, one module each; the order of `ALL` is that of the tabs and number keys."""

from __future__ import annotations

from .base import Pane, TablePane
from .charts import ChartsPane
from .dead import DeadPane
from .expiries import ExpiriesPane
from .queues import QueuesPane
from .ready import ReadyPane
from .running import RunningPane
from .schedules import SchedulesPane
from .worker import LogToWidget, WorkerPane

TABLES: tuple[type[TablePane], ...] = (ReadyPane, RunningPane, DeadPane, ExpiriesPane, SchedulesPane, QueuesPane)
# In the order of their number keys; the worker's tab only with --work.
ALL: tuple[type[Pane], ...] = (
    ReadyPane, RunningPane, DeadPane, ExpiriesPane, SchedulesPane, WorkerPane, QueuesPane, ChartsPane,
)  # fmt: skip

__all__ = [
    "ALL",
    "TABLES",
    "ChartsPane",
    "DeadPane",
    "ExpiriesPane",
    "LogToWidget",
    "Pane",
    "QueuesPane",
    "ReadyPane",
    "RunningPane",
    "SchedulesPane",
    "TablePane",
    "WorkerPane",
]
