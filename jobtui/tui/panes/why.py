"""0 Why: why the backlog grows. For every queue and type with jobs waiting, the causes that
hold now, most likely first (reads/diagnosis.py); below the table, the selected cause's
evidence and its fix, with the key that does it. Enter goes where the fix is (the queue's
line in Queues, the Workers pane, a type's dead letters); opened from the Queues pane it shows
the selected queue or type alone, until `a`.

The pane's refreshes read the diagnosis (reads/why.py) while it is open; so does every refresh
once the oldest wait passes the warning age, for the header's first cause.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Label, Static

from jobtui.kernel.safetext import line
from jobtui.reads.causes import Cause
from jobtui.reads.diagnosis import Diagnosis, Subject
from jobtui.reads.scene import secs
from jobtui.tui import render
from jobtui.tui.console import View
from jobtui.tui.panes.base import TablePane
from jobtui.tui.widgets import KeyedTable

COLUMNS = ["queue or type", "due", "oldest", "forecast", "fix", "cause"]
LEVEL = {"crit": "crit", "warn": "warn", "info": "dim"}


def cause_key(subject: Subject | None, index: int) -> str:
    """A row's key: `queue:emails#0` (a subject's first cause), `queue:emails#ok`, `database#0`."""
    return f"database#{index}" if subject is None else f"{subject.kind}:{subject.name}#{index}"


def shown(d: Diagnosis, only: tuple[str, str] | None, needle: str) -> list[Subject]:
    subjects = d.subjects if only is None else [s for s in d.subjects if (s.kind, s.name) == only]
    return [s for s in subjects if not needle or needle.lower() in line(s.name).lower()]


def why_rows(
    d: Diagnosis, only: tuple[str, str] | None, needle: str, thresholds: render.Thresholds
) -> list[render.Row]:
    """A row per cause (the database's first, then each subject's, most likely first); a
    subject that nothing holds has one row saying so, with its forecast."""
    rows = [
        render.row(cause_key(None, i), ["database", "-", "-", "-", fix(c), render.styled(c.text, c.level)])
        for i, c in enumerate(d.general)
    ]
    for s in shown(d, only, needle):
        due = f"~{s.due:,}" if s.estimated else f"{s.due:,}"
        if s.due <= 0:
            due = f"0 ({s.ready:,} later)"
        oldest = render.styled(render.age(s.oldest_age), thresholds.wait_level(s.oldest_age))
        ahead = render.styled(s.forecast.short, s.forecast.level) if s.forecast.short else "-"
        head: list[Text | str] = [f"{s.kind} {s.name}", due, oldest, ahead]
        if not s.causes:
            rows.append(render.row(f"{s.kind}:{s.name}#ok", [*head, "-", render.styled(s.summary, "ok")]))
            continue
        for i, c in enumerate(s.causes):
            share = "" if c.jobs is None or c.jobs >= s.due else f" ({c.jobs:,} seen)"
            cells = head if i == 0 else ["", "", "", ""]
            rows.append(render.row(cause_key(s, i), [*cells, fix(c), render.styled(c.text + share, LEVEL[c.level])]))
    return rows


def fix(c: Cause) -> str:
    """Where the console fixes it: `7 p` (pane 7, then p on the line), `enter` to go there,
    or `-` (outside the console: the text below says how)."""
    if c.key:
        return c.key
    return "enter" if c.goto else "-"


def chosen(d: Diagnosis, key: str | None) -> tuple[Subject | None, Cause | None]:
    """The subject and cause of row `key`."""
    if key is None:
        return None, None
    head, _, index = key.rpartition("#")
    if head == "database":
        return None, d.general[int(index)] if index.isdigit() and int(index) < len(d.general) else None
    subject = next((s for s in d.subjects if f"{s.kind}:{s.name}" == head), None)
    if subject is None or not index.isdigit() or int(index) >= len(subject.causes):
        return subject, None
    return subject, subject.causes[int(index)]


def detail(d: Diagnosis, key: str | None, read_only: bool = False) -> Text:
    """The selected row told in full: what it is, the evidence, the fix (a read-only console
    says it does not offer the key); then what the diagnosis cannot see. Every name from the
    database escaped."""
    subject, cause = chosen(d, key)
    out = Text()
    if cause is not None:
        out.append(line(cause.text), style=render.STYLE[LEVEL[cause.level]] or "bold")
        if subject is not None and cause.jobs is not None and cause.jobs < subject.due:
            of = f"{line(subject.kind)} {line(subject.name)}"
            out.append(f"  ({cause.jobs:,} of the due jobs of {of} seen)", style="dim")
        for e in cause.evidence:
            out.append(f"\n  · {line(e)}")
        out.append("\n  fix: ", style="bold")
        out.append(line(cause.action))
        keys = []
        if cause.key and read_only:
            keys.append(f"an operator's console: {cause.key} (this one is read-only)")
        elif cause.key:
            pane, _, then = cause.key.partition(" ")
            keys.append(f"press {pane}, then {then} on its line" if then else f"press {pane}")
        if cause.goto:
            keys.append("enter goes there")
        if cause.command:
            keys.append(f"$ {line(cause.command)}")
        if keys:
            out.append("\n  " + " · ".join(keys), style=render.STYLE["dim"])
    elif subject is not None:
        out.append(f"{line(subject.kind)} {line(subject.name)}: {line(subject.summary)}")
    if d.cannot_see:
        out.append("\n" if out.plain else "")
        out.append("not seen: ", style="bold")
        out.append(line(" · ".join(d.cannot_see)), style=render.STYLE["dim"])
    return out


def caption(d: Diagnosis | None, only: tuple[str, str] | None) -> str:
    if d is None:
        return "reading what holds the backlog..."
    held = [s for s in d.subjects if s.held]
    if not d.subjects and not d.general:
        return "nothing waits: no queue or type has ready jobs"
    said = f"{len(d.subjects)} queue(s) and type(s) with jobs waiting; {len(held)} held by a cause"
    if only is not None:
        said = f"{only[0]} {only[1]} alone (a: every queue and type)"
    return said + " · enter: where the fix is"


class WhyPane(TablePane):
    """What holds each queue and type; enter goes where the fix is."""

    ID = "why"
    KEY = "0"
    TITLE = "Why"
    COLUMNS = COLUMNS
    BINDINGS = [Binding("a", "every", "Every queue")]
    DEFAULT_CSS = """
    #why-caption { padding: 0 1; color: $text-muted; }
    #why-detail { height: auto; max-height: 12; padding: 0 1; border-top: solid $primary-darken-2; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.only: tuple[str, str] | None = None  # one queue or type (from the Queues pane)
        self._diagnosis: Diagnosis | None = None

    def compose(self) -> ComposeResult:
        yield Label("", id="why-caption")
        yield self.new_table()
        yield Static("", id="why-detail")

    def rows(self, view: View) -> list[render.Row]:
        d = view.fetched.diagnosis
        return [] if d is None else why_rows(d, self.only, view.needle, view.thresholds)

    def show(self, view: View) -> None:
        super().show(view)
        self._diagnosis = view.fetched.diagnosis
        self.query_one("#why-caption", Label).update(Text(line(caption(self._diagnosis, self.only))))
        self._show_detail()

    def tick(self, view: View | None) -> None:
        # While the database does not answer, that is the first thing to say (the table keeps
        # the last diagnosis read, as old as the header says).
        if not self.console.connected:
            stale = None if view is None else view.elapsed
            told = Text(f"the database is not answering: {line(self.console.last_error)}", style=render.STYLE["crit"])
            told.append(f" · what follows was read {secs(stale)} ago" if stale is not None else "")
            self.query_one("#why-caption", Label).update(told)

    def _show_detail(self) -> None:
        d = self._diagnosis
        box = self.query_one("#why-detail", Static)
        box.update(Text("") if d is None else detail(d, self.selected_key, self.console.read_only))

    def on_data_table_row_highlighted(self, event: KeyedTable.RowHighlighted) -> None:
        event.stop()
        self._show_detail()

    def aim(self, kind: str, name: str) -> None:
        """Show `kind` `name` alone (the Queues pane's key)."""
        self.only = (kind, name)
        view = self.console.view()
        if view is not None and self.is_mounted:
            self.show(view)

    def action_every(self) -> None:
        self.only = None
        view = self.console.view()
        if view is not None:
            self.show(view)

    def action_open(self) -> None:
        """Where the selected cause's fix is: the queue's or type's line in Queues, the Workers
        pane, or a type's dead letters."""
        d = self._diagnosis
        cause = None if d is None else chosen(d, self.selected_key)[1]
        if cause is None or cause.goto is None:
            self.app.notify("the fix of this one is outside the console: see below", severity="warning")
            return
        where, _, name = cause.goto.partition(":")
        if where in ("queue", "type"):
            self.goto("queues", where, name)
        elif where == "dead":
            self.goto("dead", "type", name)
        else:
            self.goto(where)
