"""1 Ready: the ready jobs by type, and the attempts the last hour's done jobs used."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobtui.reads.metrics import TypeCounts
from jobtui.tui import render
from jobtui.tui.console import View
from jobtui.tui.panes.base import TablePane
from jobtui.tui.screens import JobListScreen

COLUMNS = ["type", "due", "delayed", "oldest wait", "running", "attempts (done 1h)"]


def attempts_cell(buckets: Mapping[int, int]) -> str:
    """Jobs per number of attempts used, compact: `1:1,180 2:31 3:4`.

    >>> attempts_cell({2: 31, 1: 1180})
    '1:1,180 2:31'
    """
    return " ".join(f"{used}:{jobs:,}" for used, jobs in sorted(buckets.items())) or "-"


def ready_rows(
    by_type: Sequence[TypeCounts],
    needle: str,
    thresholds: render.Thresholds,
    attempts: Mapping[str, Mapping[int, int]] | None = None,
    estimated: bool = False,
) -> list[render.Row]:
    """One row per type with ready jobs or jobs done in the last hour: counts, the oldest
    wait, and the attempts the last hour's done jobs used (`attempts`: type -> attempts ->
    jobs, the snapshot's figures, so this costs no query of its own). With `estimated` (too
    many ready jobs to count), the due and delayed figures are marked `~`."""
    attempts = attempts or {}
    mark = "~" if estimated else ""
    counts = {t.type: t for t in by_type}
    # A type whose jobs all ran (none waiting, none dead) is in the done figures only.
    every = sorted(set(counts) | set(attempts))
    rows: list[render.Row] = []
    for t in (counts.get(name) or TypeCounts(name) for name in every):
        if (t.ready == 0 and not attempts.get(t.type)) or not render.matches(needle, t.type):
            continue
        rows.append(
            render.row(
                t.type,
                [
                    t.type,
                    f"{mark}{t.ready_due:,}",
                    f"{mark}{t.ready - t.ready_due:,}",
                    render.styled(render.age(t.oldest_ready_age), thresholds.wait_level(t.oldest_ready_age)),
                    f"{t.running:,}",
                    attempts_cell(attempts.get(t.type, {})),
                ],
            )
        )
    return rows


class ReadyPane(TablePane):
    """One row per type with jobs waiting or done in the last hour; enter lists its ready jobs."""

    ID = "ready"
    KEY = "1"
    TITLE = "Ready"
    COLUMNS = COLUMNS

    def rows(self, view: View) -> list[render.Row]:
        snap = view.snapshot
        done_attempts = snap.attempts_by_type.get("done", {})
        return ready_rows(
            snap.by_type, view.needle, view.thresholds, done_attempts, estimated=snap.ready_estimate is not None
        )

    def action_open(self) -> None:
        key = self.selected_key
        if key is not None:
            self.app.push_screen(JobListScreen("ready", f"Ready jobs of {key} (claim order)", job_type=key))
