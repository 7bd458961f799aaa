"""The panes' rows and the header's vitals from fixed values: thresholds and colours, countdowns, keys,
filters, sparklines."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import replace
from typing import Any

import pytest
from rich.text import Text

from jobtui.reads.backlog import ReadyEstimate
from jobtui.reads.joblists import DeadJob, ReadyJob, RunningJob
from jobtui.reads.metrics import DeadGroup, ScheduleHealth, Snapshot, TypeCounts
from jobtui.tui import header, render, screens
from jobtui.tui.panes import dead as dead_pane
from jobtui.tui.panes import expiries as expiries_pane
from jobtui.tui.panes import ready as ready_pane
from jobtui.tui.panes import running as running_pane
from jobtui.tui.panes import schedules as schedules_pane
from jobtui.tui.panes import worker as worker_pane
from jobtui.tui.render import STYLE, Thresholds
from jobtui.tui.widgets import literal, sort_value

from . import fixtures as fx

T = Thresholds()
WARN, CRIT = STYLE["warn"], STYLE["crit"]


def plain(cell: Text | str) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def col(pane: str, name: str) -> int:
    return fx.COLUMNS[pane].index(name)


def named(pane: str, cells: list[Text | str]) -> dict[str, str]:
    """A row's cells by column name, as plain text."""
    return dict(zip(fx.COLUMNS[pane], (plain(c) for c in cells), strict=True))


def style_of(cell: Text | str) -> str:
    """The style of a cell made by `render.styled` ('' for a plain string)."""
    return str(cell.style) if isinstance(cell, Text) else ""


def figure_style(line: Text, label: str) -> str:
    """The style of the value printed after `label ` in the vitals line."""
    start = line.plain.index(label + " ") + len(label) + 1
    styles = [str(s.style) for s in line.spans if s.start == start]
    assert styles, f"no styled value after {label!r} in {line.plain!r}"
    return styles[0]


# -- thresholds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "level"),
    [(None, "ok"), (0, "ok"), (59.9, "ok"), (60, "warn"), (299.9, "warn"), (300, "crit"), (10_000, "crit")],
)
def test_level_boundaries(value: float | None, level: str) -> None:
    assert T.level(value, 60, 300) == level


def test_styles_are_distinct_and_ok_is_unstyled() -> None:
    assert STYLE["ok"] == ""
    assert len({STYLE["warn"], STYLE["crit"], STYLE["dim"]}) == 3


# -- vitals -------------------------------------------------------------------------------


def snap_with(**changes: object) -> Snapshot:
    return dataclasses.replace(fx.snapshot(), **changes)  # type: ignore[arg-type]


def test_vitals_shows_every_figure() -> None:
    line = header.vitals(fx.snapshot(), [], T)
    text = line.plain
    # oldest due job 412 s; 1,196 due of 1,248 ready; 10 running; 24 dead; 9 failed
    for figure in ("oldest ready 6m52s", "ready 1,196+52", "running 10", "dead 24", "failed 9",
                   "done/min 174", "expiries 1h 7", "missed slots 14"):  # fmt: skip
        assert figure in text, (figure, text)
    assert "UNREACHABLE" not in text
    assert "\n" not in text  # no width: one line


def test_vitals_colours_follow_thresholds() -> None:
    line = header.vitals(fx.snapshot(), [], T)
    assert figure_style(line, "oldest ready") == CRIT  # 412 s >= 300 s
    assert figure_style(line, "running") == WARN  # one lease expired
    assert figure_style(line, "dead") == WARN  # 24: >= 1, < 100
    assert figure_style(line, "expiries 1h") == WARN
    assert figure_style(line, "missed slots") == CRIT  # 14 >= 10
    assert figure_style(line, "failed") == "bold"  # never coloured


def test_vitals_thresholds_are_configurable_and_a_quiet_queue_is_all_ok() -> None:
    line = header.vitals(fx.snapshot(), [], Thresholds(missed_crit=20, oldest_ready_crit=600))
    assert figure_style(line, "missed slots") == WARN
    assert figure_style(line, "oldest ready") == WARN
    quiet = snap_with(
        by_type=[TypeCounts("email.send", ready=2, ready_due=2, oldest_ready_age=1.0)],
        running=[],
        lease_expiries_per_hour=[0] * 24,
        schedules=[],
    )
    line = header.vitals(quiet, [], T)
    for label in ("oldest ready", "running", "dead", "expiries 1h", "missed slots"):
        assert figure_style(line, label) == "bold", label
    assert "ready 2 " in line.plain + " "  # nothing delayed: no "+0"


def test_vitals_show_lock_waits_by_kind_only_while_sessions_wait() -> None:
    assert "lock waits" not in header.vitals(fx.snapshot(), [], T).plain
    kinds = dict.fromkeys(("relation", "transactionid", "tuple", "advisory", "queue_limit", "other"), 0)
    waiting = snap_with(
        lock_waits=3,
        longest_lock_wait=75.0,
        lock_waits_by_kind={**kinds, "transactionid": 1, "tuple": 2},
    )
    line = header.vitals(waiting, [], T)
    assert "lock waits 3 (transactionid 1 tuple 2, longest 1m15s)" in line.plain
    assert figure_style(line, "lock waits") == WARN


def test_vitals_dead_turns_red_at_crit() -> None:
    many = snap_with(by_type=[TypeCounts("x", dead=150)])
    assert figure_style(header.vitals(many, [], T), "dead") == CRIT
    assert figure_style(header.vitals(many, [], Thresholds(dead_crit=1000)), "dead") == WARN


def test_vitals_sparkline_follows_oldest_ready() -> None:
    line = header.vitals(fx.snapshot(), [0, 5, 10], T)
    assert "oldest ready 6m52s ▁▅█" in line.plain


def head(**kwargs: Any) -> Text:
    args: dict[str, Any] = {"where": fx.WHERE, "schema": "jobtui", "read_only": False, **kwargs}
    return header.header(fx.snapshot(), [], T, **args)


def test_vitals_unreachable_banner_says_how_old_the_data_is() -> None:
    line = head(connected=False, last_error="connection refused", stale_for=75)
    assert line.plain.startswith(" DATABASE UNREACHABLE · data 1m15s old · connection refused ")
    assert "dead 24" in line.plain  # the last figures stay
    assert any("red3" in str(s.style) for s in line.spans)


def test_a_read_waiting_past_two_seconds_turns_the_header_red() -> None:
    assert header.banner(connected=True, last_error="", hung_for=1.4, stale_for=2.5) is None
    assert header.banner(connected=True, last_error="", hung_for=1.5, stale_for=2.5) is not None
    line = head(hung_for=4.2, stale_for=5.0)
    assert line.plain.startswith(" DATABASE NOT ANSWERING for 4s · data 5s old ")
    assert any("red3" in str(s.style) for s in line.spans)
    assert head(hung_for=2.0, stale_for=None).plain.startswith(" DATABASE NOT ANSWERING for 2s · no data yet ")


def test_the_header_names_role_host_port_database_schema_and_read_only() -> None:
    plain = head(read_only=True).plain.split("\n")[0]
    assert plain == "ops@db.example.com:5432/app schema jobtui  read-only console"
    read_only_server = header.where_line(replace(fx.WHERE, server_read_only=True), False, "jobtui").plain
    assert read_only_server.endswith("read-only server")
    on_standby = replace(fx.WHERE, server_read_only=True, standby=True)
    by_itself = header.where_line(on_standby, False, "jobtui", refuses="standby").plain
    assert by_itself.endswith("  read-only console (the server is a standby)")
    assert header.where_line(on_standby, True, "jobtui", refuses="standby").plain.endswith(
        "  read-only console  standby"
    )
    assert header.where_line(None, False, "jobs").plain == "schema jobs"  # before the first connection


def test_an_estimated_backlog_is_labelled_and_rounded() -> None:
    estimated = replace(fx.snapshot(), ready_estimate=ReadyEstimate(5_000_000, 4_518_286, 3742.0, "planner", {}))
    line = header.vitals(estimated, [], T).plain
    assert "ready ~4.5M+482k" in line and "oldest ready 1h02m" in line
    assert "ready 1,196+52" in header.vitals(fx.snapshot(), [], T).plain  # counted: exact


@pytest.mark.parametrize("width", [40, 60, 80, 118, 200])
def test_vitals_wraps_between_figures_never_inside(width: int) -> None:
    line = header.vitals(fx.snapshot(), fx.HISTORY, T, width=width)
    lines = line.plain.split("\n")
    assert all(len(text) <= width for text in lines), lines
    joined = " ".join(lines)
    for figure in ("ready 1,196+52", "done/min 174", "expiries 1h 7", "missed slots 14"):
        assert figure in joined, (figure, lines)
    if width >= 200:
        assert len(lines) == 1


# -- sparkline ----------------------------------------------------------------------------


def test_sparkline() -> None:
    assert header.sparkline([]) == ""
    assert header.sparkline([0, 0, 0]) == "▁▁▁"
    assert header.sparkline([0, 1, 2, 4], width=4) == "▁▃▅█"  # linear, rounded to 8 levels
    assert header.sparkline([5, 5]) == "██"
    assert header.sparkline(list(range(100)), width=16) == header.sparkline(list(range(84, 100)), width=16)
    assert len(header.sparkline(list(range(100)), width=16)) == 16
    assert header.sparkline([-3, 0]) == "▁▁"


def test_age() -> None:
    assert render.age(None) == "-"
    assert render.age(0) == "0s"
    assert render.age(59.9) == "59s"
    assert render.age(192.4) == "3m12s"
    assert render.age(7300) == "2h01m"


# -- ready --------------------------------------------------------------------------------


def test_ready_rows_skip_empty_types_and_colour_the_wait() -> None:
    rows = dict(ready_pane.ready_rows(fx.by_type(), "", T))
    assert "invoice.render" in rows  # 4 delayed, none due
    assert list(rows) == ["email.send", "image.resize", "invoice.render", "report.build", "webhook.deliver"]
    assert [plain(c) for c in rows["email.send"]] == ["email.send", "1,180", "24", "42s", "6", "-"]
    assert style_of(rows["email.send"][3]) == ""
    assert style_of(rows["webhook.deliver"][3]) == WARN  # 95 s
    assert style_of(rows["report.build"][3]) == CRIT  # 412 s
    assert plain(rows["invoice.render"][3]) == "-"
    empty = ready_pane.ready_rows([TypeCounts("quiet", ready=0, running=3)], "", T)
    assert empty == []


def test_ready_rows_show_the_attempts_of_each_types_done_jobs() -> None:
    done = fx.snapshot().attempts_by_type["done"]
    rows = {key: named("ready", cells) for key, cells in ready_pane.ready_rows(fx.by_type(), "", T, done)}
    assert rows["email.send"]["attempts (done 1h)"] == "1:8,950 2:200"
    assert rows["webhook.deliver"]["attempts (done 1h)"] == "1:500 2:100 3:40"
    assert rows["image.resize"]["attempts (done 1h)"] == "-"  # none done in the last hour
    # A type with nothing waiting but jobs done in the hour has a row for its attempts.
    assert rows["sms.send"] == {
        "type": "sms.send",
        "due": "0",
        "delayed": "0",
        "oldest wait": "-",
        "running": "0",
        "attempts (done 1h)": "1:50",
    }
    assert list(rows) == sorted(rows)
    # Every bucket of the snapshot is shown: per type they add up to the header's hour.
    total: dict[int, int] = {}
    for buckets in done.values():
        for used, jobs in buckets.items():
            total[used] = total.get(used, 0) + jobs
    assert total == fx.snapshot().attempts_last_hour["done"]


def test_ready_rows_filter_is_case_insensitive() -> None:
    assert [k for k, _ in ready_pane.ready_rows(fx.by_type(), "REPORT", T)] == ["report.build"]
    assert ready_pane.ready_rows(fx.by_type(), "nothing-like-it", T) == []


# -- running ------------------------------------------------------------------------------


def test_running_rows_mark_expired_leases() -> None:
    rows = dict(running_pane.running_rows(fx.running_jobs(), ""))
    expired = rows[str(fx.EXPIRED_JOB)]
    assert plain(expired[5]) == "EXPIRED 12s ago"
    assert style_of(expired[5]) == CRIT
    assert [plain(c) for c in expired] == [str(fx.EXPIRED_JOB), "image.resize", "render-2", "1/2", "27s",
                                           "EXPIRED 12s ago", "27s", "-"]  # fmt: skip
    # What runs each job, as its worker's heartbeat said: a child process with its memory, or not.
    assert plain(rows["4101"][7]) == "process 31337, 85 MiB" and plain(rows["4134"][7]) == "thread"
    healthy = rows["4133"]
    assert plain(healthy[5]) == "29s" and style_of(healthy[5]) == ""
    assert style_of(rows["4101"][5]) == ""  # 8 s left
    assert list(rows) == [str(j.id) for j in fx.running_jobs()]  # the query's order is kept


def test_running_rows_count_down_with_elapsed_time() -> None:
    job = RunningJob(1, "t", None, 1, 3, heartbeat_age=1.0, lease_left=10.0, running_for=5.0)
    ((_, cells),) = running_pane.running_rows([job], "", elapsed=0.0)
    assert (plain(cells[4]), plain(cells[5]), plain(cells[6])) == ("1s", "10s", "5s")
    assert plain(cells[2]) == "-"  # no worker recorded
    ((_, cells),) = running_pane.running_rows([job], "", elapsed=6.0)
    assert (plain(cells[4]), plain(cells[5]), plain(cells[6])) == ("7s", "4s", "11s")
    assert style_of(cells[5]) == WARN  # under 5 s left
    ((_, cells),) = running_pane.running_rows([job], "", elapsed=13.0)
    assert plain(cells[5]) == "EXPIRED 3s ago" and style_of(cells[5]) == CRIT
    no_heartbeat = dataclasses.replace(job, heartbeat_age=None, running_for=None)
    ((_, cells),) = running_pane.running_rows([no_heartbeat], "", elapsed=3.0)
    assert (plain(cells[4]), plain(cells[6])) == ("-", "-")


def test_running_rows_filter_by_type_worker_or_id() -> None:
    jobs = fx.running_jobs()
    assert [k for k, _ in running_pane.running_rows(jobs, "worker-a")] == ["4101", "4102"]
    assert [k for k, _ in running_pane.running_rows(jobs, "4133")] == ["4133"]
    assert [k for k, _ in running_pane.running_rows(jobs, "image")] == [str(fx.EXPIRED_JOB)]


# -- dead ---------------------------------------------------------------------------------


def test_dead_rows_keys_identify_the_group() -> None:
    groups = fx.dead_groups()
    rows = dead_pane.dead_rows(groups, "")
    assert [k for k, _ in rows] == [dead_pane.dead_key(g) for g in groups]
    assert len({k for k, _ in rows}) == len(groups)
    key, cells = rows[0]
    assert key == "dead\x1finvoice.render\x1fKeyError: 'customer <n> has no billing address'"
    assert key.split("\x1f") == ["dead", "invoice.render", groups[0].fingerprint]
    assert named("dead", cells) == {
        "status": "dead",
        "type": "invoice.render",
        "jobs": "19",
        "last seen": "03-14 09:26:13",
        "error fingerprint": "KeyError: 'customer <n> has no billing address'",
        "first seen": "03-14 08:31:53",
        "latest": "4127",
    }
    assert style_of(cells[0]) == CRIT
    assert style_of(rows[1][1][0]) == WARN  # failed: amber
    # What matters first is on screen at 80 columns: which error, how many, still happening.
    assert fx.COLUMNS["dead"][:5] == ["status", "type", "jobs", "last seen", "error fingerprint"]


def test_dead_rows_same_fingerprint_different_status_are_different_rows() -> None:
    a = DeadGroup("dead", "t", "E", 1, None, None, 1, 1)
    b = dataclasses.replace(a, status="failed")
    rows = dead_pane.dead_rows([a, b], "")
    assert len({k for k, _ in rows}) == 2
    row = named("dead", rows[0][1])
    assert (row["first seen"], row["last seen"]) == ("-", "-")  # no finish times recorded


def test_dead_rows_empty_fingerprint_and_filter() -> None:
    nofp = DeadGroup("dead", "t", "", 2, None, None, 9, 3)
    ((key, cells),) = dead_pane.dead_rows([nofp], "")
    assert key == "dead\x1ft\x1f" and named("dead", cells)["error fingerprint"] == "-"
    assert [k.split("\x1f")[1] for k, _ in dead_pane.dead_rows(fx.dead_groups(), "billing")] == ["invoice.render"]
    assert len(dead_pane.dead_rows(fx.dead_groups(), "FAILED")) == 1  # by status too


# -- expiries, schedules, drill-downs --------------------------------------------------------


def test_expiry_rows() -> None:
    rows = expiries_pane.expiry_rows(fx.expiries(), "")
    keys = [k for k, _ in rows]
    assert len(set(keys)) == 3  # the same job twice (two attempts) is two rows
    assert [plain(c) for c in rows[0][1]] == ["03-14 09:21:53", "3990", "image.resize", "render-2", "2", "dead"]
    assert style_of(rows[0][1][5]) == CRIT and style_of(rows[1][1][5]) == ""
    assert len(expiries_pane.expiry_rows(fx.expiries(), "worker-c")) == 1
    anonymous = dataclasses.replace(fx.expiries()[0], worker=None)
    assert plain(expiries_pane.expiry_rows([anonymous], "")[0][1][3]) == "-"


def test_schedule_rows_overdue_paused_and_missed() -> None:
    rows = dict(schedules_pane.schedule_rows(fx.schedules(), ""))
    assert list(rows) == [s.name for s in fx.schedules()]
    nxt, missed = col("schedules", "next"), col("schedules", "missed")
    paused = rows["digest.weekly"]
    assert plain(paused[nxt]) == "paused" and style_of(paused[nxt]) == WARN
    assert named("schedules", paused)["state"] == "paused"
    assert named("schedules", paused)["skipped"] == "3"
    overdue = rows["reports.hourly"]
    assert plain(overdue[nxt]) == "overdue 2m00s" and style_of(overdue[nxt]) == CRIT
    assert named("schedules", overdue)["state"] == "active"
    assert named("schedules", overdue)["queue"] == "reports"  # its jobs' queue
    catch_up = rows["catch-up"]
    assert plain(catch_up[missed]) == "14" and style_of(catch_up[missed]) == WARN
    assert named("schedules", catch_up)["last missed"] == "03-14 09:24:00"  # the newest missed slot
    assert named("schedules", catch_up)["backfilled"] == "1"  # of the 14, one ran late (policy once)
    assert named("schedules", rows["heartbeat"]) == {
        "name": "heartbeat",
        "next": "2s",
        "missed": "0",
        "last missed": "-",
        "backfilled": "-",
        "skipped": "0",
        "type": "email.send",
        "queue": "default",
        "cron": "*/5 * * * * *",
        "last slot": "03-14 09:26:50",
        "state": "active",
    }
    assert style_of(rows["heartbeat"][missed]) == ""
    assert plain(rows["billing.nightly"][nxt]) == "16h33m"
    # The schedules' health first: on screen at 80 columns.
    assert fx.COLUMNS["schedules"][:6] == ["name", "next", "missed", "last missed", "backfilled", "skipped"]


def test_schedule_rows_countdown_and_grace() -> None:
    s = ScheduleHealth("s", "t", "* * * * *", False, fx.NOW, fx.NOW, 0, 0, [], 10.0)
    nxt = col("schedules", "next")
    assert plain(schedules_pane.schedule_rows([s], "", elapsed=4)[0][1][nxt]) == "6s"
    assert plain(schedules_pane.schedule_rows([s], "", elapsed=13)[0][1][nxt]) == "0s"  # due: a scheduler picks it up
    late = schedules_pane.schedule_rows([s], "", elapsed=16)[0][1][nxt]
    assert plain(late) == "overdue 6s" and style_of(late) == CRIT  # > 5 s late: no scheduler runs
    assert [k for k, _ in schedules_pane.schedule_rows(fx.schedules(), "report.build")] == ["reports.hourly"]


def test_ready_and_dead_job_rows() -> None:
    rows = screens.ready_job_rows([ReadyJob(1, "t", 0, 3, 12.0, 20.0, ""), ReadyJob(2, "t", 1, 3, -5.0, 3.0, "boom")])
    assert [plain(c) for c in rows[0][1]] == ["1", "t", "0/3", "12s", "20s", "-"]
    assert [plain(c) for c in rows[1][1]] == ["2", "t", "1/3", "in 5s", "3s", "boom"]
    dead = screens.dead_job_rows([DeadJob(7, "t", "dead", 3, 3, None, None, "E")])
    assert dead == [("7", ["7", "t", "dead", "3/3", "-", "-", "E"])]
    for name, cells in (("ready_jobs", rows[0][1]), ("dead_jobs", dead[0][1])):
        assert len(cells) == len(fx.COLUMNS[name])


def test_every_pane_row_matches_its_columns() -> None:
    built = {
        "ready": ready_pane.ready_rows(fx.by_type(), "", T),
        "running": running_pane.running_rows(fx.running_jobs(), ""),
        "dead": dead_pane.dead_rows(fx.dead_groups(), ""),
        "expiries": expiries_pane.expiry_rows(fx.expiries(), ""),
        "schedules": schedules_pane.schedule_rows(fx.schedules(), ""),
    }
    for pane, rows in built.items():
        assert rows, pane
        assert all(len(cells) == len(fx.COLUMNS[pane]) for _, cells in rows), pane


def test_worker_log_lines_colour_their_level() -> None:
    def level_style(level: int, line: str) -> list[tuple[str, str]]:
        text = worker_pane.log_line(level, line)
        return [(text.plain[span.start : span.end], str(span.style)) for span in text.spans]

    assert level_style(logging.INFO, "12:00:00 INFO worker started") == []
    assert level_style(logging.WARNING, "12:00:00 WARNING job 1 will retry") == [("WARNING", WARN)]
    assert level_style(logging.ERROR, "12:00:00 ERROR job 1 is dead") == [("ERROR", CRIT)]
    assert level_style(logging.CRITICAL, "12:00:00 CRITICAL x") == [("CRITICAL", CRIT)]
    assert worker_pane.log_line(logging.ERROR, "12:00:00 ERROR [b]1[/b]").plain == "12:00:00 ERROR [b]1[/b]"


# -- cells in the table ----------------------------------------------------------------------


def test_literal_cells_are_never_markup() -> None:
    cell = literal("ValueError: expected list[int], got [/oops] [bold]x")
    assert cell.plain == "ValueError: expected list[int], got [/oops] [bold]x"
    assert cell.spans == []
    styled = render.styled("dead", "crit")
    assert literal(styled) is styled


def test_sort_value_numbers_then_text() -> None:
    cells: list[Text | str] = ["1,204", "36", Text("9"), "-", "b", "A"]
    assert sorted(cells, key=sort_value) == [Text("9"), "36", "1,204", "-", "A", "b"]


def test_a_long_fingerprint_ends_in_an_ellipsis() -> None:
    long = "ConnectionError: " + "x" * 100
    group = DeadGroup("dead", "t", long, 3, None, None, 1, 1)
    cell = named("dead", dead_pane.dead_rows([group], "")[0][1])["error fingerprint"]
    assert len(cell) == dead_pane.FINGERPRINT_CELL and cell.endswith("…") and long.startswith(cell[:-1])
    short = DeadGroup("dead", "t", "KeyError: <n>", 3, None, None, 1, 1)
    assert named("dead", dead_pane.dead_rows([short], "")[0][1])["error fingerprint"] == "KeyError: <n>"


def test_estimates_sort_as_their_numbers() -> None:
    assert sorted(["~1,204", "36", "~9"], key=sort_value) == ["~9", "36", "~1,204"]


def test_the_ready_pane_marks_estimated_counts() -> None:
    rows = dict(ready_pane.ready_rows(fx.by_type(), "", T, estimated=True))
    cells = named("ready", rows["email.send"])
    assert cells["due"].startswith("~") and cells["delayed"].startswith("~")
    assert not named("ready", dict(ready_pane.ready_rows(fx.by_type(), "", T))["email.send"])["due"].startswith("~")


async def test_a_figure_that_grows_widens_its_column_instead_of_being_cut() -> None:
    from textual.app import App, ComposeResult

    from jobtui.tui.widgets import KeyedTable

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield KeyedTable(["type", "due"])

    app = One()
    async with app.run_test(size=(60, 10)) as pilot:
        table = app.query_one(KeyedTable)
        table.sync([render.row("a", ["a", "0"])])
        await pilot.pause()
        table.sync([render.row("a", ["a", "712,143"])])  # the same row, a bigger figure
        await pilot.pause()
        assert table.columns["due"].content_width >= len("712,143")  # type: ignore[index]


def test_the_queues_pane_marks_estimates_beside_its_rates_and_forecasts() -> None:
    from jobtui.kernel.forecast import Forecast
    from jobtui.reads.overview import QueueLine
    from jobtui.tui.panes import queues as pane

    estimated = ("ready", "due", "oldest_age", "done_last_minute")
    lines = [
        QueueLine("queue", "big", 5_000_000, 4_900_000, 8, 1_800, 61.0, None, None, None, estimated=estimated),
        QueueLine("type", "sms.send", 900, 900, 2, 40, None, None, None, None, 20.0, None, 20.0, ("oldest_age",)),
    ]
    ahead = {
        ("queue", "big"): Forecast("drains", 4_900_000, 840.0, 1_200.0, 1_500.0, 300.0, 300.0),
        ("type", "sms.send"): Forecast("growing", 900, float("nan"), -300.0, 100.0, 400.0, 300.0),
    }
    rows = {key: dict(zip(pane.COLUMNS, (plain(c) for c in cells), strict=True)) for key, cells in
            pane.queue_rows(lines, "", T, ahead)}  # fmt: skip
    big, sms = rows["queue:big"], rows["type:sms.send"]
    assert (big["ready"], big["due"], big["oldest ready"], big["done/min"]) == ("~5,000,000", "~4,900,000", "~1m01s",
                                                                                  "~1,800")  # fmt: skip
    assert big["forecast"] == ahead[("queue", "big")].short and big["rate"] == "-"
    assert (sms["ready"], sms["oldest ready"], sms["rate"]) == ("900", "?", "20/s")
    assert sms["forecast"] == ahead[("type", "sms.send")].short
