"""4 Lease expiries: the leases the reaper found run out, and what became of their jobs."""

from __future__ import annotations

from jobtui.tui import render
from jobtui.tui.console import View
from jobtui.tui.panes.base import TablePane
from jobtui.tui.screens import JobDetailScreen


class ExpiriesPane(TablePane):
    """Recent lease expiries, newest first; enter explains the job."""

    ID = "expiries"
    KEY = "4"
    TITLE = "Lease expiries"

    def rows(self, view: View) -> list[render.Row]:
        return render.expiry_rows(view.snapshot.recent_expiries, view.needle)

    def action_open(self) -> None:
        key = self.selected_key
        if key is not None:
            self.app.push_screen(JobDetailScreen(int(key.split("\x1f")[0])))  # the key starts with the job id
