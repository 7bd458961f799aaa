"""2 Running: the running jobs with live lease countdowns, a page at a time, of every worker or
of one (the Workers pane's enter); kill a lease, cancel a job."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Label, TabbedContent

from jobtui.kernel.safetext import line
from jobtui.reads.joblists import RUNNING_PAGE, RunningCursor, RunningJob
from jobtui.tui import changes, render
from jobtui.tui.console import Change, View
from jobtui.tui.panes.base import TablePane
from jobtui.tui.screens import JobDetailScreen

COLUMNS = ["id", "type", "worker", "attempt", "heartbeat", "lease left", "running for", "runs in"]


def running_rows(jobs: Sequence[RunningJob], needle: str, elapsed: float = 0.0) -> list[render.Row]:
    """Running jobs; `elapsed` seconds since the data was read make the countdowns live."""
    rows: list[render.Row] = []
    for j in jobs:
        if not render.matches(needle, j.type, j.worker, str(j.id)):
            continue
        left = j.lease_left - elapsed
        if left < 0:
            lease = render.styled(f"EXPIRED {render.age(-left)} ago", "crit")
        else:
            lease = render.styled(render.age(left), "warn" if left < 5 else "ok")
        hb = None if j.heartbeat_age is None else j.heartbeat_age + elapsed
        rows.append(
            render.row(
                str(j.id),
                [
                    str(j.id),
                    j.type,
                    j.worker or "-",
                    f"{j.attempt}/{j.max_attempts}",
                    render.age(hb),
                    lease,
                    render.age(None if j.running_for is None else j.running_for + elapsed),
                    str(j.runner) if j.runner is not None else "-",
                ],
            )
        )
    return rows


def page_caption(first: int, shown: int, total: int, more: bool, worker: str | None = None) -> str:
    """Which running jobs the page shows of how many, and how to page; with `worker`, those it
    holds.

    >>> page_caption(1, 100, 2000, True)
    'jobs 1-100 of 2,000 running, leases closest to expiry first · ] next page'
    >>> page_caption(1, 3, 3, False, "worker-a")
    'jobs 1-3 of 3 held by worker-a, leases closest to expiry first · a every worker'
    """
    where = "running" if worker is None else f"held by {worker}"
    every = ["a every worker"] if worker is not None else []
    if shown == 0:
        text = f"no running jobs on this page of {total:,} · [ first page" if first > 1 else f"no jobs {where}"
        return " · ".join([text, *every])
    text = f"jobs {first:,}-{first + shown - 1:,} of {total:,} {where}, leases closest to expiry first"
    keys = [k for k, on in (("] next page", more), ("[ first page", first > 1)) if on]
    return " · ".join([text, *keys, *every])


class RunningPane(TablePane):
    """Running jobs, expired leases first; enter explains the job."""

    ID = "running"
    KEY = "2"
    TITLE = "Running"
    COLUMNS = COLUMNS
    BINDINGS = [
        Change("k", "kill_lease", "Kill lease"),
        Change("c", "cancel", "Cancel"),
        Binding("right_square_bracket", "next_page", "Next page", show=False),
        Binding("left_square_bracket", "first_page", "First page", show=False),
        Binding("a", "every_worker", "Every worker"),
    ]
    DEFAULT_CSS = "#running-page { padding: 0 1; color: $text-muted; }"

    def __init__(self) -> None:
        super().__init__()
        self.pages: list[RunningCursor] = []  # the cursor each page after the first starts after

    def compose(self) -> ComposeResult:
        yield Label("", id="running-page")
        yield self.new_table()

    def rows(self, view: View) -> list[render.Row]:
        return running_rows(view.fetched.running, view.needle, view.elapsed)

    def show(self, view: View) -> None:
        super().show(view)
        fetched = view.fetched
        first = 1 + RUNNING_PAGE * len(self.pages) if fetched.running_after is not None else 1
        worker = fetched.running_worker
        total = view.snapshot.running_count
        if worker is not None:
            total = sum(g.jobs for g in view.snapshot.running if g.worker == worker)
        more = len(fetched.running) == RUNNING_PAGE and first - 1 + len(fetched.running) < total
        caption = page_caption(first, len(fetched.running), total, more, worker)
        self.query_one("#running-page", Label).update(Text(line(caption)))

    def tick(self, view: View | None) -> None:
        # The heartbeats, lease countdowns and run times move on; only on screen: redrawing a
        # page of 500 rows four times a second behind another pane costs CPU for nothing.
        if view is not None and self.display:
            self.show(view)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "every_worker" and self.console.source.running_worker is None:
            return False  # shown only while the page holds one worker's jobs
        return super().check_action(action, parameters)

    def _turn(self) -> None:
        self.console.source.running_after = self.pages[-1] if self.pages else None
        self.console.refresh_data()

    def hold(self, worker: str | None) -> None:
        """Show the jobs `worker` holds (None: every worker's), from the first page, now."""
        self.console.source.running_worker = worker
        self.pages.clear()
        self.app.query_one("#panes", TabbedContent).active = self.ID
        self.app.refresh_bindings()
        self._turn()

    def action_every_worker(self) -> None:
        self.hold(None)

    def action_next_page(self) -> None:
        view = self.console.view()
        if view is None or len(view.fetched.running) < RUNNING_PAGE:
            return
        self.pages.append(view.fetched.running[-1].cursor)
        self._turn()

    def action_first_page(self) -> None:
        self.pages.clear()
        self._turn()

    def action_open(self) -> None:
        key = self.selected_key
        if key is not None:
            self.app.push_screen(JobDetailScreen(int(key)))

    def _job(self) -> tuple[RunningJob, str] | None:
        """The selected job and how the questions name it."""
        key = self.selected_key
        view = self.console.view()
        if key is None or view is None:
            return None
        job = next((j for j in view.fetched.running if str(j.id) == key), None)
        return None if job is None else (job, f"job {job.id} ({job.type}) on {job.worker}")

    def action_kill_lease(self) -> None:
        found = self._job()
        if found:
            job, what = found
            self.console.confirm_then(
                changes.kill_lease_question(what, job.attempt, job.max_attempts),
                changes.kill_lease,
                self.console.actions_,
                job.id,
                job.lease_token,
            )

    def action_cancel(self) -> None:
        found = self._job()
        if found:
            job, what = found
            job_id = job.id
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
