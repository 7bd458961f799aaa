"""2 Running: the running jobs with live lease countdowns; kill a lease, cancel a job."""

from __future__ import annotations

from .. import changes, render
from ..console import Change, View
from ..screens import JobDetailScreen
from .base import TablePane


class RunningPane(TablePane):
    """Running jobs, expired leases first; enter explains the job."""

    ID = "running"
    KEY = "2"
    TITLE = "Running"
    BINDINGS = [
        Change("k", "kill_lease", "Kill lease"),
        Change("c", "cancel", "Cancel"),
    ]

    def rows(self, view: View) -> list[render.Row]:
        return render.running_rows(view.fetched.running, view.needle, view.elapsed)

    def tick(self, view: View | None) -> None:
        if view is not None:
            self.show(view)  # the heartbeats, lease countdowns and run times move on

    def action_open(self) -> None:
        key = self.selected_key
        if key is not None:
            self.app.push_screen(JobDetailScreen(int(key)))

    def _job(self) -> tuple[int, str] | None:
        """The selected job's id and how the questions name it."""
        key = self.selected_key
        view = self.console.view()
        if key is None or view is None:
            return None
        job = next((j for j in view.fetched.running if str(j.id) == key), None)
        return None if job is None else (job.id, f"job {job.id} ({job.type}) on {job.worker}")

    def action_kill_lease(self) -> None:
        found = self._job()
        if found:
            job_id, what = found
            self.console.confirm_then(
                [f"Kill the lease of {what}?", "It returns to ready now; 1 row will change."],
                changes.kill_lease,
                self.console.actions_,
                job_id,
            )

    def action_cancel(self) -> None:
        found = self._job()
        if found:
            job_id, what = found
            self.console.confirm_then(
                [
                    f"Cancel {what}? It becomes failed.",
                    "Its worker is told at once and stops the handler; no later outcome is written.",
                    "1 row will change.",
                ],
                changes.cancel,
                self.console.actions_,
                job_id,
            )
