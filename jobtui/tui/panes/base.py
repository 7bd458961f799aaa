"""What every pane of the console is: a tab that owns its keys and shows a `View`."""

from __future__ import annotations

from typing import ClassVar, cast

from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TabPane

from jobtui.tui import render
from jobtui.tui.console import Console, View, bound_actions, change_actions
from jobtui.tui.widgets import KeyedTable


class Goto(Message):
    """A pane sends the console to another pane: `kind` and `name` say where in it (a queue's
    or a type's line in Queues, a type's dead letters, the Why pane on one queue or type).
    The app moves the focus, so panes never import each other (Pane.goto sends it)."""

    def __init__(self, pane: str, kind: str | None = None, name: str | None = None) -> None:
        super().__init__()
        self.pane = pane
        self.kind = kind
        self.name = name


class Pane(TabPane):
    """A pane of the console.

    Its keys are live while the focus is in it (Textual's binding chain), so a pane offers
    only its own; keys declared as `Change` are refused in read-only. The filter and the
    sort come first so that the footer shows them before the pane's changes.
    """

    ID: ClassVar[str]  # also the tab's id, for `TabbedContent.active`
    KEY: ClassVar[str]  # the number key that opens it, shown on its tab
    TITLE: ClassVar[str]

    BINDINGS = [
        Binding("enter", "open", "Open", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
    ]

    def __init__(self) -> None:
        super().__init__(f"{self.KEY} {self.TITLE}", id=self.ID)

    @property
    def console(self) -> Console:
        return cast(Console, self.app)

    def goto(self, pane: str, kind: str | None = None, name: str | None = None) -> None:
        """Send the console to `pane` (at `kind` `name`). To the app at once, not up through
        this pane's queue: a key typed after the one that sent it, on its way up behind it,
        must find the pane switch begun and wait for it (keys.py)."""
        self.app.post_message(Goto(pane, kind, name))

    @classmethod
    def actions(cls) -> frozenset[str]:
        """The actions of the pane's keys."""
        return bound_actions(cls)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Textual asks before it shows or runs a key: False hides it. The keys act on the
        pane's selection, so not while another screen covers the panes (the footer behind a
        dialog shows none of them); and the changes not in read-only."""
        if not self.console.on_main_screen():
            return False
        return not (action in change_actions(type(self)) and self.console.read_only)

    @property
    def selected_key(self) -> str | None:
        """The key of the row under the cursor, if the pane has rows."""
        return None

    def focus_default(self) -> None:
        """Take the focus (after a switch or the filter), so the pane's keys are live."""
        self.focus()

    def aim(self, kind: str, name: str) -> None:
        """Open on `kind` `name` (a `Goto` or a link's view): a line to select, a scope. Here,
        nothing to aim at."""

    def show(self, view: View) -> None:
        """Draw a read, or the same read again after the filter or the sort changed."""

    def tick(self, view: View | None) -> None:
        """Between reads, four times a second: move on what moves with the clock."""

    def action_filter(self) -> None:
        self.console.show_filter()

    def action_sort(self) -> None:
        """Nothing to sort here (a pane without a table)."""

    def action_open(self) -> None:
        """Nothing to drill down into here."""


class TablePane(Pane):
    """A pane that is one table: its `COLUMNS`, and its `rows` of a view, both defined in the
    pane's module."""

    COLUMNS: ClassVar[list[str]]

    def compose(self) -> ComposeResult:
        yield self.new_table()

    def new_table(self) -> KeyedTable:
        """The pane's table, for a pane that shows more than it (a caption above, a detail below)."""
        return KeyedTable(self.COLUMNS, id=f"table-{self.ID}")

    @property
    def table(self) -> KeyedTable:
        return self.query_one(KeyedTable)

    @property
    def selected_key(self) -> str | None:
        return self.table.selected_key

    def rows(self, view: View) -> list[render.Row]:
        raise NotImplementedError

    def show(self, view: View) -> None:
        self.table.sync(self.rows(view))

    def focus_default(self) -> None:
        self.table.focus()

    def action_sort(self) -> None:
        self.app.notify(self.table.cycle_sort(), timeout=2)
        view = self.console.view()
        if view is not None:
            self.show(view)

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        event.stop()  # enter (or a click) on a row: this pane's drill-down
        self.action_open()
