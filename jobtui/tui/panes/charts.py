"""7 Charts: the queue's last hour in charts, from the database from the first frame.

The history is the archiver's queue_minute rows (Snapshot.minutes) and the done jobs of each
minute (Snapshot.done_per_minute), never the console's own memory: a console opened in the
middle of an incident shows the hour before it. Drawn with textual-plotext (plotext in a
Textual widget): axes with values, which an operator reads, where a sparkline only shows a
shape. A chart is drawn again only when its figures change, once a minute or so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Grid
from textual_plotext import PlotextPlot

from jobtui.kernel.donehistory import MINUTE, calendar_minute
from jobtui.reads.metrics import Snapshot
from jobtui.tui.console import View
from jobtui.tui.panes.base import Pane

# Short enough to stay in a chart's title at 80 columns; docs/operations.md says where the rows come from.
NO_MINUTES = "no minute rows yet"


@dataclass(frozen=True, slots=True)
class Series:
    """One chart: its title and (minutes ago, value) points, oldest first."""

    title: str
    points: tuple[tuple[int, float], ...]


def series(snap: Snapshot) -> list[Series]:
    """The five charts of the last hour, x in minutes before the current one (-59..0)."""
    current = calendar_minute(snap.taken_at)
    rows = [(-round((current - m.minute) / MINUTE), m) for m in snap.minutes]
    rows = [(x, m) for x, m in rows if -60 <= x <= 0]

    def of(title: str, values: Sequence[tuple[int, float]]) -> Series:
        return Series(title if values or "done" in title else f"{title} ({NO_MINUTES})", tuple(values))

    # Whole minutes only: the current one (index 0) is still counting.
    done = [(-i, float(n)) for i, n in reversed(list(enumerate(snap.done_per_minute))) if i > 0]
    return [
        of("oldest ready age, s", [(x, m.oldest_ready_age or 0.0) for x, m in rows]),
        of("ready jobs", [(x, float(m.ready)) for x, m in rows]),
        of("done per minute", done),
        of("dead and failed per minute", [(x, float(m.dead)) for x, m in rows]),
        of("lease expiries per minute", [(x, float(m.lease_expiries)) for x, m in rows]),
    ]


class Chart(PlotextPlot):
    """One series as a line chart over the last hour."""

    def __init__(self, index: int) -> None:
        super().__init__(id=f"chart-{index}")
        self.drawn: Series | None = None

    def draw(self, data: Series) -> None:
        if data == self.drawn:
            return
        self.drawn = data
        plt = self.plt
        plt.clear_figure()
        plt.title(data.title)
        plt.xlim(-60, 0)
        plt.xlabel("minutes ago")
        if data.points:
            xs, ys = zip(*data.points, strict=True)
            plt.plot(list(xs), list(ys), marker="braille")
            plt.ylim(0, max(max(ys) * 1.1, 1.0))
        self.refresh()


class ChartsPane(Pane):
    """The last hour: oldest ready age, ready jobs, done, dead and failed, lease expiries."""

    ID = "charts"
    KEY = "8"
    TITLE = "Charts"
    DEFAULT_CSS = """
    #charts-grid { grid-size: 2 3; grid-gutter: 0 1; height: 1fr; }
    Chart { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        with Grid(id="charts-grid"):
            for i in range(5):
                yield Chart(i)

    def show(self, view: View) -> None:
        charts = list(self.query(Chart))
        drawn = series(view.snapshot)
        if len(charts) != len(drawn):  # a refresh while the pane is still being mounted
            return  # the next refresh draws them
        for chart, data in zip(charts, drawn, strict=True):
            chart.draw(data)
