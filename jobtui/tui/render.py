"""The cells every pane shares: colours, thresholds, durations, counts, escaped rows.

No database, no clock: everything comes in as arguments. Each pane's columns and rows are
in its module under `panes/`, built from these, so a pane is testable from plain data. Each
row has a key so the tables update rows in place instead of being rebuilt. Every cell is
text shown as is: escaped (`safetext.line`), never markup (cells are `Text` or plain
strings, which the table shows as `Text`); keys keep the data exact, for queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from rich.text import Text

from jobtui.kernel.durations import age_text
from jobtui.kernel.safetext import line

# Colours readable on both light and dark backgrounds.
STYLE = {"ok": "", "warn": "bold dark_orange", "crit": "bold red3", "dim": "grey50"}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a vital sign turns amber (warn) and red (crit)."""

    oldest_ready_warn: float = 60.0
    oldest_ready_crit: float = 300.0
    dead_warn: int = 1
    dead_crit: int = 100
    expiries_warn: int = 1
    expiries_crit: int = 20
    missed_warn: int = 1
    missed_crit: int = 10

    def level(self, value: float | None, warn: float, crit: float) -> str:
        if value is None or value < warn:
            return "ok"
        return "crit" if value >= crit else "warn"

    def wait_level(self, seconds: float | None) -> str:
        """The level of an oldest wait, the figure every pane colours alike."""
        return self.level(seconds, self.oldest_ready_warn, self.oldest_ready_crit)


Row = tuple[str, list[Text | str]]


def age(seconds: float | None) -> str:
    """Seconds as a short duration (`3m12s`), `-` for none.

    >>> age(192.4)
    '3m12s'
    """
    return age_text(seconds)


def compact(n: int) -> str:
    """A count in at most four significant characters, for estimates.

    >>> compact(1_234_567), compact(48_200), compact(950)
    ('1.2M', '48k', '950')
    """
    for size, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, ending in an ellipsis when cut (the whole text is in
    the drill-down's title).

    >>> clip("TimeoutError: upstream <n>", 12)
    'TimeoutErro…'
    """
    return text if len(text) <= limit else text[: limit - 1] + "…"


def when(at: datetime | None) -> str:
    """A moment as the tables show it, `-` for none.

    >>> when(datetime(2026, 3, 4, 5, 6, 7))
    '03-04 05:06:07'
    """
    return at.strftime("%m-%d %H:%M:%S") if at else "-"


def styled(text: str, level: str) -> Text:
    return Text(line(text), style=STYLE[level])


def row(key: str, cells: Sequence[Text | str]) -> Row:
    """A table row whose plain-string cells are escaped (`Text` cells are built by `styled`)."""
    return (key, [cell if isinstance(cell, Text) else line(cell) for cell in cells])


def matches(needle: str, *fields: str | None) -> bool:
    """Whether a field holds `needle`, as shown (escaped): what the operator sees is what the
    filter finds, `\\x1b` included."""
    if not needle:
        return True
    lowered = needle.lower()
    return any(f is not None and lowered in line(f).lower() for f in fields)
