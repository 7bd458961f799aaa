"""5 Schedules: each schedule's next slot and health; pause, resume or run one now."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from jobtui.reads.metrics import ScheduleHealth
from jobtui.tui import changes, render
from jobtui.tui.console import Change, View
from jobtui.tui.panes.base import TablePane

# Its health first (the next slot, the missed ones), so 80 columns show it; then what it is.
COLUMNS = ["name", "next", "missed", "last missed", "backfilled", "skipped", "type", "queue", "cron", "last slot",
           "state"]  # fmt: skip


def schedule_rows(schedules: Sequence[ScheduleHealth], needle: str, elapsed: float = 0.0) -> list[render.Row]:
    rows: list[render.Row] = []
    for s in schedules:
        if not render.matches(needle, s.name, s.job_type):
            continue
        left = s.next_in - elapsed
        if s.paused:
            nxt: Text | str = render.styled("paused", "warn")
        elif left < -5:
            nxt = render.styled(f"overdue {render.age(-left)}", "crit")  # no scheduler is running
        else:
            nxt = render.age(max(0.0, left))
        missed = render.styled(str(s.missed), "warn" if s.missed else "ok")
        last_missed = s.missed_slots[-1][5:19].replace("T", " ") if s.missed_slots else "-"
        # Of the missed slots, those the policy still ran late.
        backfilled = str(s.backfilled) if s.missed else "-"
        rows.append(
            render.row(
                s.name,
                [
                    s.name,
                    nxt,
                    missed,
                    last_missed,
                    backfilled,
                    str(s.skipped),
                    s.job_type,
                    s.queue,
                    s.cron,
                    render.when(s.last_slot),
                    "paused" if s.paused else "active",
                ],
            )
        )
    return rows


class SchedulesPane(TablePane):
    """The schedules with live countdowns to their next slot and their missed slots."""

    ID = "schedules"
    KEY = "5"
    TITLE = "Schedules"
    COLUMNS = COLUMNS
    BINDINGS = [
        Change("p", "pause_schedule", "Pause/resume"),
        Change("n", "run_now", "Run now"),
    ]

    def rows(self, view: View) -> list[render.Row]:
        return schedule_rows(view.snapshot.schedules, view.needle, view.elapsed)

    def _schedule(self) -> ScheduleHealth | None:
        key = self.selected_key
        view = self.console.view()
        if key is None or view is None:
            return None
        return next((s for s in view.snapshot.schedules if s.name == key), None)

    def action_pause_schedule(self) -> None:
        schedule = self._schedule()
        if schedule is None:
            return
        name = schedule.name
        if schedule.paused:
            self.console.confirm_then(
                [
                    f"Resume schedule {name}?",
                    "It fires again from its next slot; the slots that passed while it was paused stay skipped.",
                    "1 row will change.",
                ],
                changes.resume_schedule,
                self.console.actions_,
                name,
            )
        else:
            self.console.confirm_then(
                [
                    f"Pause schedule {name}?",
                    f"No {schedule.job_type} job is enqueued for its slots until it is resumed;"
                    " they count as skipped, not missed.",
                    "1 row will change.",
                ],
                changes.pause_schedule,
                self.console.actions_,
                name,
            )

    def action_run_now(self) -> None:
        schedule = self._schedule()
        if schedule is not None:
            self.console.confirm_then(
                [f"Run schedule {schedule.name} now?", f"One {schedule.job_type} job will be enqueued."],
                changes.run_schedule_now,
                self.console.actions_,
                schedule.name,
            )
