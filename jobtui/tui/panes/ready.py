"""1 Ready: the ready jobs by type, and the attempts the last hour's done jobs used."""

from __future__ import annotations

from jobtui.tui import render
from jobtui.tui.console import View
from jobtui.tui.panes.base import TablePane
from jobtui.tui.screens import JobListScreen


class ReadyPane(TablePane):
    """One row per type with jobs waiting or done in the last hour; enter lists its ready jobs."""

    ID = "ready"
    KEY = "1"
    TITLE = "Ready"

    def rows(self, view: View) -> list[render.Row]:
        snap = view.snapshot
        done_attempts = snap.attempts_by_type.get("done", {})
        return render.ready_rows(
            snap.by_type, view.needle, view.thresholds, done_attempts, estimated=snap.ready_estimate is not None
        )

    def action_open(self) -> None:
        key = self.selected_key
        if key is not None:
            self.app.push_screen(JobListScreen("ready", f"Ready jobs of {key} (claim order)", job_type=key))
