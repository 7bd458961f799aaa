"""The console as its panes and screens see it: what they show (`View`), what they may ask
of the app (`Console`), and how a key says it changes the queue (`Change`).

Panes and screens import this, not app.py, so the app sits on top of its parts and nothing
below it imports it back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from textual.binding import Binding

from jobtui.reads.metrics import DeadGroup, Snapshot
from jobtui.tui.data import Actions, DataSource, Fetched
from jobtui.tui.keys import KeyGate
from jobtui.tui.render import Thresholds


@dataclass(frozen=True, slots=True)
class View:
    """One picture of the queue for every pane: the last read, its age, the filter."""

    fetched: Fetched
    elapsed: float  # seconds since the read: countdowns and ages move on between reads
    needle: str
    thresholds: Thresholds

    @property
    def snapshot(self) -> Snapshot:
        return self.fetched.snapshot

    @property
    def dead_matched(self) -> list[DeadGroup] | None:
        """The groups of the jobs whose error matches the filter, if read for this filter."""
        return self.fetched.dead_matched if self.fetched.needle == self.needle else None


class Console(Protocol):
    """What panes and screens use of the app besides Textual's own API."""

    @property
    def read_only(self) -> bool:
        """No change to the queue from here: asked for (--read-only), or the server takes none."""
        ...

    source: DataSource
    actions_: Actions | None  # None in read-only
    connected: bool  # the last read reached the database
    last_error: str  # why it did not, when it did not
    keys: KeyGate  # holds the keys while something a key opened is not ready

    def screen_loaded(self, screen: Any) -> None:
        """A screen of `LOADS_ROWS` shows its first rows (or why not): the keys held go on."""
        ...

    def on_main_screen(self) -> bool:
        """False while a drill-down, detail or dialog screen is on top of the panes."""
        ...

    def view(self) -> View | None:
        """The picture to show now, None before the first read."""
        ...

    def confirm_then(self, question: str | list[str], action: Callable[..., Any], *args: Any) -> None:
        """Ask `question`; on yes, run `action(*args)` in a worker thread (refused in read-only)."""
        ...

    def ask_requeue_group(self, status: str, job_type: str, fingerprint: str, error: str | None = None) -> None:
        """Count a dead group's jobs now, then ask to requeue exactly those."""
        ...

    def show_filter(self) -> None:
        """Open the filter box, which filters every pane."""
        ...

    def refresh_data(self) -> Any:
        """Read again now (in a worker thread)."""
        ...


@dataclass(frozen=True)
class Change(Binding):
    """A key whose action changes the queue: it asks first and is hidden in read-only."""


def bound_actions(cls: type[object]) -> frozenset[str]:
    """The actions of the keys `cls` declares in its BINDINGS and its bases'."""
    return frozenset(b.action for k in cls.__mro__ for b in vars(k).get("BINDINGS", ()) if isinstance(b, Binding))


def change_actions(cls: type[object]) -> frozenset[str]:
    """The actions of the keys of `cls` that change the queue (declared as `Change`)."""
    return frozenset(b.action for k in cls.__mro__ for b in vars(k).get("BINDINGS", ()) if isinstance(b, Change))
