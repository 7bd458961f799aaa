"""4 Lease expiries: the leases the reaper found run out, and what became of their jobs."""

from __future__ import annotations

from collections.abc import Sequence

from jobtui.reads.metrics import LeaseExpiry
from jobtui.tui import render
from jobtui.tui.console import View
from jobtui.tui.panes.base import TablePane
from jobtui.tui.screens import JobDetailScreen

COLUMNS = ["reaped", "job", "type", "worker", "attempt", "outcome"]


def expiry_rows(expiries: Sequence[LeaseExpiry], needle: str) -> list[render.Row]:
    rows: list[render.Row] = []
    for e in expiries:
        if not render.matches(needle, e.type, e.worker, str(e.job_id)):
            continue
        rows.append(
            render.row(
                f"{e.job_id}\x1f{e.attempt}\x1f{e.reaped_at.isoformat()}",
                [
                    render.when(e.reaped_at),
                    str(e.job_id),
                    e.type,
                    e.worker or "-",
                    str(e.attempt),
                    render.styled(e.outcome, "crit" if e.outcome == "dead" else "ok"),
                ],
            )
        )
    return rows


class ExpiriesPane(TablePane):
    """Recent lease expiries, newest first; enter explains the job."""

    ID = "expiries"
    KEY = "4"
    TITLE = "Lease expiries"
    COLUMNS = COLUMNS

    def rows(self, view: View) -> list[render.Row]:
        return expiry_rows(view.snapshot.recent_expiries, view.needle)

    def action_open(self) -> None:
        key = self.selected_key
        if key is not None:
            self.app.push_screen(JobDetailScreen(int(key.split("\x1f")[0])))  # the key starts with the job id
