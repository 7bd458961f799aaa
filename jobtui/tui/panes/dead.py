"""3 Dead: dead and failed jobs grouped by error fingerprint, of every type or of one (a
`dead:TYPE` link); requeue a group."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Label

from jobtui.kernel.safetext import line
from jobtui.reads.metrics import DeadGroup
from jobtui.tui import render
from jobtui.tui.console import Change, View
from jobtui.tui.panes.base import TablePane
from jobtui.tui.screens import JobListScreen

# What an operator needs first comes first, so an 80-column terminal shows it without
# scrolling: which error, how many, still happening.
COLUMNS = ["status", "type", "jobs", "last seen", "error fingerprint", "first seen", "latest"]
FINGERPRINT_CELL = 60  # characters of an error fingerprint a dead group's row shows


def dead_key(group: DeadGroup) -> str:
    return f"{group.status}\x1f{group.type}\x1f{group.fingerprint}"


def shown_dead_groups(
    groups: Sequence[DeadGroup], needle: str, matched: Sequence[DeadGroup] | None = None
) -> list[DeadGroup]:
    """The dead groups a filter shows: a group whose type or status holds the text, whole;
    else, when `matched` gives the groups of the jobs whose error matches it (the rows
    `jobtui dead --error` lists, counting only those jobs), those. Without `matched`, the
    text is looked for in the fingerprint too."""
    if not needle:
        return list(groups)
    if matched is None:
        return [g for g in groups if render.matches(needle, g.type, g.fingerprint, g.status)]
    whole = [g for g in groups if render.matches(needle, g.type, g.status)]
    keys = {dead_key(g) for g in whole}
    return whole + [g for g in matched if dead_key(g) not in keys]


def dead_rows(groups: Sequence[DeadGroup], needle: str, matched: Sequence[DeadGroup] | None = None) -> list[render.Row]:
    """Dead and failed groups, oldest first: a stable order, so a growing group never moves
    the row under the operator's cursor (press `s` to sort by count). With a filter, the
    groups `shown_dead_groups` gives."""
    rows: list[render.Row] = []
    shown = shown_dead_groups(groups, needle, matched)
    stable = sorted(shown, key=lambda g: (g.first_seen is None, g.first_seen or 0, dead_key(g)))
    for g in stable:
        rows.append(
            render.row(
                dead_key(g),
                [
                    render.styled(g.status, "crit" if g.status == "dead" else "warn"),
                    g.type,
                    f"{g.jobs:,}",
                    render.when(g.last_seen),
                    render.clip(line(g.fingerprint), FINGERPRINT_CELL) if g.fingerprint else "-",
                    render.when(g.first_seen),
                    str(g.latest_job_id),
                ],
            )
        )
    return rows


class DeadPane(TablePane):
    """Dead and failed groups, oldest first; enter lists a group's jobs.

    With a filter, a group shown for its jobs whose error matches it counts those jobs, and
    r asks to requeue only those (the matcher of `jobtui dead --error`). Opened on one job
    type (`jobtui --open dead:TYPE`), it shows that type's groups until a shows every type.
    """

    ID = "dead"
    KEY = "3"
    TITLE = "Dead"
    COLUMNS = COLUMNS
    BINDINGS = [Change("r", "requeue", "Requeue"), Binding("a", "every_type", "Every type")]
    DEFAULT_CSS = """
    #dead-caption { padding: 0 1; color: $text-muted; display: none; }
    #dead-caption.on { display: block; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.only_type: str | None = None

    def compose(self) -> ComposeResult:
        yield Label("", id="dead-caption")
        yield self.new_table()

    def _groups(self, view: View) -> list[DeadGroup]:
        groups = view.snapshot.dead
        return groups if self.only_type is None else [g for g in groups if g.type == self.only_type]

    def rows(self, view: View) -> list[render.Row]:
        matched = view.dead_matched
        if self.only_type is not None and matched is not None:
            matched = [g for g in matched if g.type == self.only_type]
        return dead_rows(self._groups(view), view.needle, matched)

    def show(self, view: View) -> None:
        super().show(view)
        box = self.query_one("#dead-caption", Label)
        box.set_class(self.only_type is not None, "on")
        if self.only_type is not None:
            jobs = sum(g.jobs for g in self._groups(view))
            box.update(Text(line(f"type {self.only_type} only: {jobs:,} dead or failed job(s) · a every type")))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "every_type" and self.only_type is None:
            return False
        return super().check_action(action, parameters)

    def of_type(self, job_type: str | None) -> None:
        """Show only the groups of `job_type` (None: of every type)."""
        self.only_type = job_type
        self.app.refresh_bindings()
        view = self.console.view()
        if view is not None:
            self.show(view)

    def aim(self, kind: str, name: str) -> None:
        """Open on the groups of type `name` alone (until a)."""
        self.only_type = name

    def action_every_type(self) -> None:
        self.of_type(None)

    def group(self, key: str) -> DeadGroup | None:
        """The dead group of row `key`, as the pane shows it (with the filter's counts)."""
        view = self.console.view()
        if view is None:
            return None
        shown = shown_dead_groups(self._groups(view), view.needle, view.dead_matched)
        return next((g for g in shown if dead_key(g) == key), None)

    @staticmethod
    def _filtered(group: DeadGroup, view: View) -> bool:
        """Whether `group` is shown for its jobs whose error matches the filter (not whole)."""
        if not view.needle or view.dead_matched is None:
            return False
        whole = shown_dead_groups(view.snapshot.dead, view.needle, [])
        return all(dead_key(g) != dead_key(group) for g in whole)

    def action_requeue(self) -> None:
        key = self.selected_key
        group = self.group(key) if key else None
        view = self.console.view()
        if group is not None and view is not None:
            error = view.needle if self._filtered(group, view) else None
            self.console.ask_requeue_group(group.status, group.type, group.fingerprint, error)

    def action_open(self) -> None:
        key = self.selected_key
        group = self.group(key) if key is not None else None
        if group is not None:
            title = f"{group.status} jobs of {group.type}: {group.fingerprint or '-'}"
            self.app.push_screen(
                JobListScreen("dead", title, job_type=group.type, status=group.status, fingerprint=group.fingerprint)
            )
