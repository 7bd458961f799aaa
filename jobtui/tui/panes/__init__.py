"""The console's panes, one module each; the order of `ALL` is that of the tabs and number keys."""

from __future__ import annotations

from .base import Pane, TablePane
from .charts import ChartsPane
from .dead import DeadPane
from .expiries import ExpiriesPane
from .ready import ReadyPane
from .running import RunningPane
from .schedules import SchedulesPane
from .worker import LogToWidget, WorkerPane

TABLES: tuple[type[TablePane], ...] = (ReadyPane, RunningPane, DeadPane, ExpiriesPane, SchedulesPane)
ALL: tuple[type[Pane], ...] = (*TABLES, WorkerPane, ChartsPane)  # the worker's tab only with --work

__all__ = [
    "ALL",
    "TABLES",
    "ChartsPane",
    "DeadPane",
    "ExpiriesPane",
    "LogToWidget",
    "Pane",
    "ReadyPane",
    "RunningPane",
    "SchedulesPane",
    "TablePane",
    "WorkerPane",
]
