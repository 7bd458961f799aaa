"""The console's own widgets: a DataTable that is updated by row key, so refreshes never
flicker or lose the cursor, and the input box whose enter the console acts on."""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Input

from jobtui.kernel.safetext import line
from jobtui.tui.render import Row


class SubmitBox(Input):
    """An input box whose enter the console acts on (the filter, a limit, a rate, a ramp): the
    keys typed after the enter wait until what it submits is done (keys.py). Textual's own
    boxes (the command palette's) submit to Textual, which says nothing back."""


_NUMBER = re.compile(r"^~?(-?[\d,]+(\.\d+)?)$")  # `~`: an estimate, sorted as its number


def literal(cell: Text | str) -> Text:
    """A cell as text shown as is: DataTable reads plain strings as markup, and job types,
    workers and error messages are free text (`list[int]` would lose `[int]`, `[/x]` would fail);
    escaped too, whoever made the row.
    """
    return cell if isinstance(cell, Text) else Text(line(cell))


def sort_value(cell: Text | str) -> tuple[int, Any]:
    """Numbers sort as numbers, everything else as lower-case text."""
    plain = cell.plain if isinstance(cell, Text) else str(cell)
    number = _NUMBER.match(plain)
    if number:
        return (0, float(number.group(1).replace(",", "")))
    return (1, plain.lower())


class KeyedTable(DataTable[Any]):
    """Rows carry keys; `sync` adds, updates and removes rows to match new data."""

    def __init__(self, columns: list[str], **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.column_names = columns
        self.sort_column: int | None = None
        self.sort_reverse = False
        self._order: list[str] = []
        self._given: dict[str, list[Text | str]] = {}  # each row's cells as last given to sync

    def on_mount(self) -> None:
        for name in self.column_names:
            self.add_column(name, key=name)

    @property
    def selected_key(self) -> str | None:
        """The key of the row under the cursor."""
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:  # the cursor can point past the end for a moment after removals
            return None
        return None if row_key.value is None else str(row_key.value)

    def cycle_sort(self) -> str:
        """Sort by the next column (then the same one reversed); returns a description."""
        if self.sort_column is None:
            self.sort_column, self.sort_reverse = 0, False
        elif not self.sort_reverse:
            self.sort_reverse = True
        else:
            self.sort_column = (self.sort_column + 1) % len(self.column_names)
            self.sort_reverse = False
        return f"sorted by {self.column_names[self.sort_column]}{' (descending)' if self.sort_reverse else ''}"

    def sync(self, rows: list[Row]) -> None:
        if self.sort_column is not None:
            column = self.sort_column
            rows = sorted(rows, key=lambda r: sort_value(r[1][column]), reverse=self.sort_reverse)
        keys = [k for k, _ in rows]
        selected = self.selected_key
        given, self._given = self._given, {key: cells for key, cells in rows}
        if keys != self._order:
            # Rows came, went or moved: rebuild, keeping the cursor on the same key.
            self.clear()
            for key, cells in rows:
                self.add_row(*[literal(cell) for cell in cells], key=key)
            self._order = keys
            if selected in keys:
                self.move_cursor(row=keys.index(selected), animate=False)
            return
        for key, cells in rows:
            before = given.get(key)
            if before == cells:
                continue  # as given last time: nothing of the row to compare or redraw
            for i, (name, cell) in enumerate(zip(self.column_names, cells, strict=True)):
                if before is not None and before[i] == cell:
                    continue
                shown = literal(cell)
                if self.get_cell(key, name) != shown:
                    # A figure that grew (1,204 to 12,040) widens its column rather than being cut.
                    self.update_cell(key, name, shown, update_width=True)
