"""3 Dead: dead and failed jobs grouped by error fingerprint; requeue a group."""

from __future__ import annotations

from jobtui.reads.metrics import DeadGroup
from jobtui.tui import render
from jobtui.tui.console import Change, View
from jobtui.tui.panes.base import TablePane
from jobtui.tui.screens import JobListScreen


class DeadPane(TablePane):
    """Dead and failed groups, oldest first; enter lists a group's jobs.

    With a filter, a group shown for its jobs whose error matches it counts those jobs, and
    r asks to requeue only those (the matcher of `jobtui dead --error`).
    """

    ID = "dead"
    KEY = "3"
    TITLE = "Dead"
    BINDINGS = [Change("r", "requeue", "Requeue")]

    def rows(self, view: View) -> list[render.Row]:
        return render.dead_rows(view.snapshot.dead, view.needle, view.dead_matched)

    def group(self, key: str) -> DeadGroup | None:
        """The dead group of row `key`, as the pane shows it (with the filter's counts)."""
        view = self.console.view()
        if view is None:
            return None
        shown = render.shown_dead_groups(view.snapshot.dead, view.needle, view.dead_matched)
        return next((g for g in shown if render.dead_key(g) == key), None)

    @staticmethod
    def _filtered(group: DeadGroup, view: View) -> bool:
        """Whether `group` is shown for its jobs whose error matches the filter (not whole)."""
        if not view.needle or view.dead_matched is None:
            return False
        whole = render.shown_dead_groups(view.snapshot.dead, view.needle, [])
        return all(render.dead_key(g) != render.dead_key(group) for g in whole)

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
