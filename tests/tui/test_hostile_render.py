"""Every console render function over hostile text (issue 16): what reaches the screen holds
no escape, no C1 control, no bidi control, nothing read as markup, and names what was there.

A cell reaches the screen as `widgets.literal(cell)`: its plain text must be the data's
visible form exactly (markup-like brackets included, so none was read as markup), and its
only style one of the console's own.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text

from jobtui.kernel.domain import ErrorEntry, JobRow, JobStatus
from jobtui.kernel.explain import explain, first_line
from jobtui.kernel.safetext import SafeFormatter, shorten
from jobtui.reads.joblists import DeadJob, ReadyJob, RunningJob
from jobtui.reads.metrics import DeadGroup, LeaseExpiry, ScheduleHealth, TypeCounts
from jobtui.tui import render, screens
from jobtui.tui.panes import dead as dead_pane
from jobtui.tui.panes import expiries as expiries_pane
from jobtui.tui.panes import ready as ready_pane
from jobtui.tui.panes import running as running_pane
from jobtui.tui.panes import schedules as schedules_pane
from jobtui.tui.panes import worker as worker_pane
from jobtui.tui.render import STYLE, Thresholds
from jobtui.tui.screens import ConfirmScreen, JobListScreen
from jobtui.tui.widgets import literal
from tests.hostile import assert_safe, hostile, visible

from . import fixtures as fx

NOW = datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)
OUR_STYLES = {str(s) for s in STYLE.values()}
texts = st.lists(hostile(), min_size=5, max_size=5)


def shown_row(pane: str, rows: list[render.Row]) -> dict[str, Text]:
    """The one row of `rows`, as the table shows it, by column name."""
    [(_key, cells)] = rows
    shown = {name: literal(cell) for name, cell in zip(fx.COLUMNS[pane], cells, strict=True)}
    for cell in shown.values():
        assert_safe(cell.plain)
        assert str(cell.style) in OUR_STYLES and all(str(s.style) in OUR_STYLES for s in cell.spans), cell
    return shown


def panes(a: str, b: str, c: str, d: str, needle: str = "") -> list[tuple[str, list[render.Row], dict[str, str]]]:
    """Each pane's rows of one record whose text fields hold a, b, c, d; and what they must show."""
    return [
        ("ready",
         ready_pane.ready_rows([TypeCounts(a, ready=2, ready_due=1, oldest_ready_age=9.0)], needle, Thresholds()),
         {"type": a}),
        ("running", running_pane.running_rows([RunningJob(1, a, b, 1, 3, 0.5, 10.0, 1.0)], needle),
         {"type": a, "worker": b}),
        ("dead", dead_pane.dead_rows([DeadGroup(c, a, b, 3, NOW, NOW, 7, 2)], needle),
         {"status": c, "type": a, "error fingerprint": b}),
        ("expiries", expiries_pane.expiry_rows([LeaseExpiry(7, a, b, 1, NOW, NOW, c)], needle),
         {"type": a, "worker": b, "outcome": c}),
        ("schedules", schedules_pane.schedule_rows([ScheduleHealth(a, b, c, False, NOW, NOW, 0, 0, [], 5.0)], needle),
         {"name": a, "type": b, "cron": c}),
        ("ready_jobs", screens.ready_job_rows([ReadyJob(1, a, 0, 3, 1.0, 2.0, b)]), {"type": a, "last error": b}),
        ("dead_jobs", screens.dead_job_rows([DeadJob(1, a, c, 3, 3, NOW, b, d)]),
         {"type": a, "status": c, "worker": b, "last error": d}),
    ]  # fmt: skip


@given(texts)
def test_every_pane_shows_its_data_escaped_and_literally(values: list[str]) -> None:
    for pane, rows, fields in panes(*values[:4]):
        shown = shown_row(pane, rows)
        for column, value in fields.items():
            # A dead group's fingerprint is cut, with an ellipsis, after its escaping.
            expected = (
                render.clip(visible(value), dead_pane.FINGERPRINT_CELL) if column == "error fingerprint" else None
            )
            assert shown[column].plain == (expected or visible(value)), (pane, column)


@given(texts, st.data())
def test_the_filter_finds_rows_by_the_text_as_shown(values: list[str], data: st.DataObject) -> None:
    a = values[0]
    start = data.draw(st.integers(0, len(visible(a)) - 1))
    needle = visible(a)[start : start + 6]  # a piece of the type as the operator reads it
    for pane, rows, _fields in panes(*values[:4], needle=needle):
        if pane not in ("ready_jobs", "dead_jobs"):  # drill-downs are not filtered
            assert len(rows) == 1, (pane, needle)


@given(hostile(max_pieces=10), st.sampled_from([logging.INFO, logging.WARNING, logging.ERROR]))
def test_worker_log_lines_are_escaped_with_a_traceback_kept_on_its_lines(entry: str, level: int) -> None:
    shown = worker_pane.log_line(level, f"12:00:00 {logging.getLevelName(level)} {entry}")
    assert_safe(shown.plain, keep="\n\t")
    assert shown.plain.split("\n")[0].startswith("12:00:00 ")
    assert all(str(s.style) in OUR_STYLES for s in shown.spans)
    formatter = SafeFormatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")  # the Worker pane's
    record = logging.LogRecord("jobtui.worker", level, __file__, 1, "job 7 (%s) failed: %s", (entry, entry), None)
    line = worker_pane.log_line(level, formatter.format(record)).plain
    assert "\n" not in line and line.endswith(f"job 7 ({visible(entry)}) failed: {visible(entry)}")


@given(texts, st.dictionaries(hostile(max_pieces=2), hostile(max_pieces=3), max_size=3))
def test_a_job_explained_shows_every_field_escaped(values: list[str], payload: dict[str, str]) -> None:
    a, b, c, d, e = values
    job = JobRow(
        id=7, type=a, payload=payload, idempotency_key=b, status=JobStatus.RUNNING, run_at=NOW, attempts=1,
        max_attempts=3, locked_by=c, locked_until=NOW, lease_token=1, heartbeat_at=NOW, last_error=d,
        errors=[ErrorEntry(e, 1, c, "error", d)], created_at=NOW, db_now=NOW,
    )  # fmt: skip
    lines = explain(job)
    for text in lines[:-1]:
        assert_safe(text)
    assert lines[0] == f"Job 7 ({visible(a)}): running"
    assert f"  key           {visible(b)}" in lines
    assert f"  worker        {visible(c)}" in lines
    assert f"  last error    {visible(first_line(d))}" in lines
    assert f"  {visible(e)}  attempt 1  error         {visible(c)}" in lines
    assert f"      {visible(first_line(d))}" in lines
    # The payload: JSON on several lines, which escapes C0 controls itself; the rest is escaped.
    assert_safe(lines[-1], keep="\n")
    as_json = json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True)
    assert lines[-1] == "".join(ch if ch == "\n" else visible(ch) for ch in as_json)


@given(texts)
def test_confirmations_and_drill_down_titles_keep_each_line_of_their_own(values: list[str]) -> None:
    a, b, c, _d, _e = values
    question = ConfirmScreen([f"Requeue every dead job of type {a} with error", f"  {b}", "3 row(s) will change"])
    # Each line escaped, then cut to the dialog's length (its start and end kept).
    assert question.question.split("\n") == [
        shorten(f"Requeue every dead job of type {visible(a)} with error", ConfirmScreen.LINE),
        shorten(f"  {visible(b)}", ConfirmScreen.LINE),
        "3 row(s) will change",
    ]
    title = JobListScreen("dead", f"dead jobs of {a}: {c}", job_type=a).title_text
    assert title == f"dead jobs of {visible(a)}: {visible(c)}"
    assert literal(Text(title)).plain == title
