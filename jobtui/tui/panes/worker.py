"""6 Worker: the worker running inside the console (--work), its state and its log."""

from __future__ import annotations

import collections
import logging
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Label, RichLog

from jobtui.kernel.safetext import SafeFormatter, block, line
from jobtui.tui import render
from jobtui.tui.console import View
from jobtui.tui.panes.base import Pane


def log_line(level: int, entry: str) -> Text:
    """A line of the embedded worker's log with its level name coloured (amber, red), escaped
    (a traceback keeps its lines).

    >>> log_line(logging.ERROR, "12:00:01 ERROR job 7 is dead").spans
    [Span(9, 14, 'bold red3')]
    """
    text = Text(block(entry))
    name = logging.getLevelName(level)
    at = text.plain.find(f" {name} ")
    kind = "crit" if level >= logging.ERROR else "warn" if level >= logging.WARNING else "ok"
    if at >= 0 and render.STYLE[kind]:
        text.stylize(render.STYLE[kind], at + 1, at + 1 + len(name))
    return text


class LogToWidget(logging.Handler):
    """Keeps the embedded worker's log lines for the Worker pane (instead of the terminal),
    escaped: they carry job types and errors."""

    def __init__(self, keep: int = 2000) -> None:
        super().__init__()
        self.lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=keep)
        self.total = 0  # lines ever emitted: the pane's position, still right once old lines are dropped
        self.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, self.format(record)))
        self.total += 1

    def since(self, seen: int) -> tuple[list[tuple[int, str]], int]:
        """The (level, line)s emitted after the first `seen` that are still kept, and the new total."""
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            new = min(self.total - seen, len(self.lines))
            return (list(self.lines)[len(self.lines) - new :] if new > 0 else []), self.total


class WorkerPane(Pane):
    """The local worker: running or paused, its jobs in flight, its counts and its log.

    The pane itself takes the focus (it has no table), so the filter key is live here too.
    """

    ID = "worker"
    KEY = "6"
    TITLE = "Worker"
    can_focus = True

    def __init__(self, worker: Any, logs: LogToWidget) -> None:
        super().__init__()
        self.worker = worker  # a jobtui Worker; not imported, so the console loads without it
        self.logs = logs
        self._lines_shown = 0

    def compose(self) -> ComposeResult:
        yield Label("", id="worker-state")
        yield RichLog(id="worker-log", max_lines=2000, wrap=False)

    def on_show(self) -> None:
        # At once when opened, not at the next tick: the log's lines are already kept.
        self.tick(None)

    def tick(self, view: View | None) -> None:
        w = self.worker
        state = "paused" if w.paused else ("running" if w.running else "stopped")
        flights = ", ".join(f"{f.job.id} {f.job.type}" for f in list(w.in_flight.values())[:8])
        counts = " · ".join(f"{k} {v}" for k, v in w.counts.items())
        pool = getattr(w, "children", None)
        executor = pool.describe() if pool is not None else f"sync handlers in {getattr(w, 'executor', 'thread')}s"
        self.query_one("#worker-state", Label).update(
            Text.assemble(
                f"local worker {line(str(w.worker_id))}: ",
                (state, "bold"),
                line(f" · {len(w.in_flight)}/{w.concurrency} in flight{': ' + flights if flights else ''}"),
                "\n",
                line(counts),
                "\n",
                line(executor),
            )
        )
        lines, self._lines_shown = self.logs.since(self._lines_shown)
        log = self.query_one("#worker-log", RichLog)
        for level, entry in lines:
            log.write(log_line(level, entry))
