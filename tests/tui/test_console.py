"""The console driven by Textual's pilot against a real database with known jobs.

Every action is checked where it matters: the row in jobtui.job changed (or did not) and
the audit row exists. Timing is never assumed: `wait_for` polls between pilot pauses.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from jobtui.clients.client import Client
from jobtui.core.registry import Job, Jobs
from jobtui.kernel.domain import NewJob
from jobtui.reads.metrics import DeadGroup
from jobtui.tui.app import JobtuiApp
from jobtui.tui.panes import DeadPane, LogToWidget
from jobtui.tui.panes import dead as dead_pane
from jobtui.tui.screens import ConfirmScreen, HelpScreen, JobDetailScreen, JobListScreen
from jobtui.tui.widgets import KeyedTable
from jobtui.worker import Worker

from .helpers import BILLING, audit, query, seed, statuses, stays, wait_for

SIZE = (120, 36)
CHANGES = ("requeue", "kill_lease", "cancel", "pause_schedule", "run_now")


@asynccontextmanager
async def console(dsn: str, size: tuple[int, int] = SIZE, **kwargs: Any) -> AsyncIterator[tuple[JobtuiApp, Any]]:
    """The console on `dsn`, after its first read has reached the tables."""
    app = JobtuiApp(dsn, refresh_interval=0.25, **kwargs)
    app.animation_level = "none"  # no sliding tab underlines to wait for
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        await pilot.pause(0.05)
        yield app, pilot


def table(app: JobtuiApp, pane: str) -> KeyedTable:
    return app.query_one(f"#table-{pane}", KeyedTable)  # the main screen, whatever is on top


def keys(t: KeyedTable) -> list[str]:
    return [str(row.key.value) for row in t.ordered_rows]


def text(widget: Any) -> str:
    """What a Static or Label shows, as plain text."""
    content = widget.content
    return content.plain if hasattr(content, "plain") else str(content)


async def open_pane(pilot: Any, app: JobtuiApp, pane: str, key: str | None = None) -> KeyedTable:
    """Switch with the pane's number key; put the cursor on the row `key` once it is shown."""
    await pilot.press(str(["ready", "running", "dead", "expiries", "schedules"].index(pane) + 1))
    await wait_for(pilot, lambda: app.pane == pane, what=f"pane {pane}")
    t = table(app, pane)
    if key is not None:
        await wait_for(pilot, lambda: key in keys(t), what=f"row {key!r} in {pane}")
        t.move_cursor(row=keys(t).index(key))
        await pilot.pause(0.05)
        assert t.selected_key == key
    return t


async def confirm_question(pilot: Any, app: JobtuiApp) -> str:
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
    return text(app.screen.query_one("#question"))


def on_screen(app: JobtuiApp) -> list[str]:
    """The rows of characters the terminal shows now, top to bottom."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


async def answer(pilot: Any, app: JobtuiApp, key: str) -> None:
    await pilot.press(key)
    await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="the dialog to close")


BILLING_KEY = dead_pane.dead_key(DeadGroup("dead", "invoice.render", BILLING, 0, None, None, 0, 0))


# -- dead groups ------------------------------------------------------------------------------


async def test_requeue_dead_group_says_the_exact_count_then_changes_those_rows(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        dead = await open_pane(pilot, app, "dead", BILLING_KEY)
        assert dead.row_count == 3  # billing (3), reset (2), failed (1)
        await pilot.press("r")
        question = await confirm_question(pilot, app)
        assert "3 row(s) will change" in question
        assert "dead job of type invoice.render" in question and BILLING in question
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: set(statuses(dsn, s.dead_billing).values()) == {"ready"}, what="requeue")
        await wait_for(pilot, lambda: BILLING_KEY not in keys(dead), what="the group to leave the pane")
    assert set(statuses(dsn, s.dead_reset).values()) == {"dead"}  # another group: untouched
    assert statuses(dsn, [s.failed]) == {s.failed: "failed"}
    assert query(dsn, "SELECT DISTINCT attempts FROM jobtui.job WHERE id = ANY(%s)", s.dead_billing) == [(0,)]
    assert audit(dsn) == [
        ("console", "requeue", f"dead group type=invoice.render error={BILLING}", sorted(s.dead_billing), 3)
    ]


async def test_a_group_that_grows_before_the_answer_requeues_only_the_jobs_counted(dsn: str) -> None:
    """The question names a number of rows; exactly those rows change. A job that fails the
    same way while the operator reads the question stays dead, and the toast says so."""
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "dead", BILLING_KEY)
        await pilot.press("r")
        question = await confirm_question(pilot, app)
        assert "3 row(s) will change" in question and "Only these 3: jobs that join the group" in question
        assert "before you answer\nstay dead (press r again for them)" in question
        newcomer = _dead_like(dsn, s.dead_billing[0])  # one more job fails the same way meanwhile
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: set(statuses(dsn, s.dead_billing).values()) == {"ready"}, what="the requeue")
        expected = "requeued 3 job(s); 1 job(s) joined the group after the count and are still dead"
        await wait_for(
            pilot,
            lambda: any(expected in str(n.message) for n in app._notifications),
            what=f"the notification, got {[str(n.message) for n in app._notifications]}",
        )
        assert statuses(dsn, [newcomer]) == {newcomer: "dead"}
        # Asked again, the newcomer is what is counted.
        await wait_for(
            pilot, lambda: app.query_one(DeadPane).group(BILLING_KEY) is not None, what="the group, still there"
        )
        await pilot.press("r")
        assert "1 row(s) will change" in await confirm_question(pilot, app)
        await answer(pilot, app, "n")
    assert [(a[3], a[4]) for a in audit(dsn)] == [(sorted(s.dead_billing), 3)]


async def test_a_job_that_leaves_the_group_before_the_answer_is_not_counted_as_requeued(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "dead", BILLING_KEY)
        await pilot.press("r")
        assert "3 row(s) will change" in await confirm_question(pilot, app)
        with Client(dsn, max_connections=1) as queue:  # another operator requeues one of them
            assert queue.requeue([s.dead_billing[0]], actor="someone-else") == [s.dead_billing[0]]
        await answer(pilot, app, "y")
        expected = "requeued 2 of the 3 job(s) counted: 1 left the group before you confirmed"
        await wait_for(
            pilot,
            lambda: any(expected in str(n.message) for n in app._notifications),
            what=f"the notification, got {[str(n.message) for n in app._notifications]}",
        )
    assert set(statuses(dsn, s.dead_billing).values()) == {"ready"}
    assert [(a[0], a[4]) for a in audit(dsn)] == [("someone-else", 1), ("console", 2)]


async def test_the_dead_filter_matches_errors_as_dead_error_does_and_requeue_takes_those_jobs(dsn: str) -> None:
    """`/` in the dead pane matches errors with the matcher of `jobtui dead --error`: the
    first line or the fingerprint, a regular expression. A group shown for some of its jobs
    counts those, and requeueing it asks for and changes only those."""
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        dead = await open_pane(pilot, app, "dead", BILLING_KEY)
        await pilot.press("slash", *"customer 1[23]", "enter")  # billing jobs 12 and 13, not 11
        await wait_for(pilot, lambda: keys(dead) == [BILLING_KEY], what="the filtered group")
        await wait_for(pilot, lambda: str(dead.get_cell(BILLING_KEY, "jobs")) == "2", what="its 2 matching jobs")
        await pilot.press("r")
        question = await confirm_question(pilot, app)
        assert "dead jobs of type invoice.render whose error matches 'customer 1[23]'," in question
        assert "2 row(s) will change" in question
        await answer(pilot, app, "y")
        wanted = {s.dead_billing[0]: "dead", s.dead_billing[1]: "ready", s.dead_billing[2]: "ready"}
        await wait_for(pilot, lambda: statuses(dsn, s.dead_billing) == wanted, what="the two requeued")
        # A type's name selects its groups whole.
        await pilot.press("slash", "escape", "slash", *"webhook", "enter")
        assert app.needle == "webhook"
        await wait_for(pilot, lambda: len(keys(dead)) == 1, what="the webhook group")
        assert str(dead.get_cell(keys(dead)[0], "jobs")) == "2"
        await pilot.press("slash", "escape", "slash", *"[unclosed", "enter")
        assert app.needle == "[unclosed"
        await wait_for(
            pilot, lambda: "bad --error pattern" in text(app.query_one("#status")), what="the bad pattern said"
        )
        assert keys(dead) == []
    assert [(a[2], a[4]) for a in audit(dsn)] == [(f"dead group type=invoice.render error={BILLING}", 2)]


def _dead_like(dsn: str, job_id: int) -> int:
    rows = query(dsn, "INSERT INTO jobtui.job (type, status, attempts, max_attempts, last_error, finished_at) "
                 "SELECT type, status, attempts, max_attempts, last_error, now() FROM jobtui.job WHERE id = %s "
                 "RETURNING id", job_id)  # fmt: skip
    return int(rows[0][0])


async def test_answering_no_changes_nothing(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "dead", BILLING_KEY)
        await pilot.press("r")
        await confirm_question(pilot, app)
        await answer(pilot, app, "n")
        await pilot.press("r")
        await confirm_question(pilot, app)
        await answer(pilot, app, "escape")
        await open_pane(pilot, app, "running", str(s.running[0]))
        await pilot.press("k")
        assert "1 row will change" in await confirm_question(pilot, app)
        await answer(pilot, app, "n")
        await pilot.press("c")
        await confirm_question(pilot, app)
        await answer(pilot, app, "n")
        await open_pane(pilot, app, "schedules", "nightly.report")
        await pilot.press("n")  # run now? ...
        await confirm_question(pilot, app)
        await answer(pilot, app, "n")  # ... no
        await stays(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 0.5)
    assert set(statuses(dsn, s.dead_billing).values()) == {"dead"}
    assert set(statuses(dsn, s.running).values()) == {"running"}
    assert query(dsn, "SELECT count(*) FROM jobtui.job WHERE type = 'report.build'") == [(2,)]
    assert audit(dsn) == []


async def test_a_question_quoting_a_huge_type_still_shows_its_count_and_buttons(dsn: str) -> None:
    """A 5,000-character type (a hand insert) is cut in the question: on 80x24 the count and
    the buttons stay on the screen, and yes requeues the job."""
    huge = "inv." + "x" * 4990 + ".render"
    [(job_id, fingerprint)] = query(
        dsn,
        "INSERT INTO jobtui.job (type, payload, status, attempts, max_attempts, last_error, finished_at)"
        " VALUES (%s, '{}', 'dead', 3, 3, 'KeyError: customer 7 has no billing address', now())"
        " RETURNING id, error_fingerprint",
        huge,
    )
    key = dead_pane.dead_key(DeadGroup("dead", huge, fingerprint, 0, None, None, 0, 0))
    async with console(dsn, size=(80, 24)) as (app, pilot):
        await open_pane(pilot, app, "dead", key)
        await pilot.press("r")
        question = await confirm_question(pilot, app)
        dialog = app.screen.query_one("#question")
        await wait_for(pilot, lambda: dialog.region.height > 0, what="the dialog laid out")
        shown = "\n".join(on_screen(app))
        assert "1 row(s) will change" in shown and "Yes (y)" in shown and "No (n)" in shown, shown
        assert "characters cut" in question and question.count("x") < 500
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: statuses(dsn, [job_id]) == {job_id: "ready"}, what="the requeue")


async def test_requeue_one_job_then_the_rest_from_the_group_list(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "dead", BILLING_KEY)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobListScreen), what="the group's jobs")
        screen = app.screen
        jobs = screen.query_one(KeyedTable)
        await wait_for(pilot, lambda: jobs.row_count == 3, what="3 jobs in the list")
        assert {int(k) for k in keys(jobs)} == set(s.dead_billing)
        chosen = int(keys(jobs)[1])
        jobs.move_cursor(row=1)
        await pilot.pause(0.05)
        await pilot.press("r")
        question = await confirm_question(pilot, app)
        assert f"Requeue job {chosen} (invoice.render)?" in question and "1 row will change" in question
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: statuses(dsn, [chosen]) == {chosen: "ready"}, what="the job requeued")
        await wait_for(pilot, lambda: jobs.row_count == 2, what="the list to lose it")
        rest = sorted(set(s.dead_billing) - {chosen})
        assert set(statuses(dsn, rest).values()) == {"dead"}
        await pilot.press("R")  # the whole group, from its list
        assert "2 row(s) will change" in await confirm_question(pilot, app)
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: set(statuses(dsn, rest).values()) == {"ready"}, what="the group requeued")
        assert app.screen is screen
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.on_main_screen(), what="back to the panes")
    assert audit(dsn) == [
        ("console", "requeue", f"jobs {chosen}", [chosen], 1),
        ("console", "requeue", f"dead group type=invoice.render error={BILLING}", rest, 2),
    ]


async def test_cancel_a_ready_job_from_the_type_list(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "ready", "email.send")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobListScreen), what="the type's jobs")
        jobs = app.screen.query_one(KeyedTable)
        await wait_for(pilot, lambda: jobs.row_count == 6, what="6 ready email.send jobs")
        assert [int(k) for k in keys(jobs)][:4] == s.ready  # claim order: due ones first
        assert not app.screen.check_action("requeue", ())  # nothing to requeue in a ready list
        await pilot.press("c")
        question = await confirm_question(pilot, app)
        assert f"Cancel job {s.ready[0]} (email.send)? It becomes failed." in question
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: statuses(dsn, [s.ready[0]]) == {s.ready[0]: "failed"}, what="cancelled")
        await wait_for(pilot, lambda: jobs.row_count == 5, what="the list to lose it")
    assert set(statuses(dsn, s.ready[1:]).values()) == {"ready"}
    assert audit(dsn) == [("console", "cancel", f"jobs {s.ready[0]}", [s.ready[0]], 1)]


# -- attempts ---------------------------------------------------------------------------------


async def test_the_ready_pane_shows_the_attempts_each_types_done_jobs_used(dsn: str) -> None:
    seed(dsn)
    with Client(dsn, max_connections=1) as queue:
        done = queue.enqueue_many([NewJob("email.send")] * 4 + [NewJob("pdf.render")] * 2)
    # Done in the last minutes with 1, 1, 1 and 3 attempts (email.send), 2 and 2 (pdf.render).
    for job_id, attempts in zip(done, [1, 1, 1, 3, 2, 2], strict=True):
        query(dsn, "UPDATE jobtui.job SET status = 'done', attempts = %s, finished_at = now() - interval '2 min' "
              "WHERE id = %s RETURNING id", attempts, job_id)  # fmt: skip
    async with console(dsn) as (app, pilot):
        ready = await open_pane(pilot, app, "ready", "email.send")
        assert str(ready.get_cell("email.send", "attempts (done 1h)")) == "1:3 3:1"
        # pdf.render has nothing waiting: its row is there for its attempts.
        await wait_for(pilot, lambda: "pdf.render" in keys(ready), what="the done-only type")
        assert str(ready.get_cell("pdf.render", "attempts (done 1h)")) == "2:2"
        assert str(ready.get_cell("pdf.render", "due")) == "0"
        assert str(ready.get_cell("sms.send", "attempts (done 1h)")) == "-"


# -- running jobs -----------------------------------------------------------------------------


async def test_kill_lease_returns_the_job_to_ready(dsn: str) -> None:
    s = seed(dsn)
    job = s.running[0]
    async with console(dsn) as (app, pilot):
        running = await open_pane(pilot, app, "running", str(job))
        await pilot.press("k")
        question = await confirm_question(pilot, app)
        assert f"Kill the lease of job {job} (report.build) on worker-a:1?" in question
        assert "1 row will change" in question
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: statuses(dsn, [job]) == {job: "ready"}, what="the lease killed")
        await wait_for(pilot, lambda: str(job) not in keys(running), what="the row to leave the pane")
    assert statuses(dsn, [s.running[1]]) == {s.running[1]: "running"}
    assert query(dsn, "SELECT locked_until FROM jobtui.job WHERE id = %s", job) == [(None,)]
    assert audit(dsn) == [("console", "kill-lease", f"jobs {job}", [job], 1)]


def _toasted(app: JobtuiApp, expected: str) -> bool:
    return any(expected in str(n.message) for n in app._notifications)


async def test_kill_lease_spares_the_attempt_after_the_one_asked_about(dsn: str) -> None:
    """The question names one attempt; if it ends while the question is open and another
    worker claims the job again, yes kills nothing, and the toast says why."""
    s = seed(dsn)
    job = s.running[0]
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "running", str(job))
        await pilot.press("k")
        question = await confirm_question(pilot, app)
        assert "It returns to ready now (attempt 1 of 25 counts)." in question
        with Client(dsn, max_connections=1) as queue:  # worker-a's attempt ends; worker-b takes the job
            ended = "UPDATE jobtui.job SET status = 'ready', locked_until = NULL WHERE id = %s RETURNING id"
            assert query(dsn, ended, job) == [(job,)]
            assert [c.id for c in queue.claim(["report.build"], worker="worker-b:1", lease=600)] == [job]
        await answer(pilot, app, "y")
        expected = f"job {job} was not killed: the attempt you saw ended, and attempt 2 now runs on worker-b:1"
        await wait_for(pilot, lambda: _toasted(app, expected), what="the toast")
    assert query(dsn, "SELECT status, attempts, locked_by FROM jobtui.job WHERE id = %s", job) == [
        ("running", 2, "worker-b:1")
    ]


async def test_kill_lease_of_a_last_attempt_says_the_job_goes_dead(dsn: str) -> None:
    s = seed(dsn)
    job = s.running[0]
    assert query(dsn, "UPDATE jobtui.job SET max_attempts = 1 WHERE id = %s RETURNING id", job) == [(job,)]
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "running", str(job))
        await wait_for(pilot, lambda: _running_attempts(app, job) == "1/1", what="the row's new limit")
        await pilot.press("k")
        assert "It was its last attempt (1 of 1): it becomes dead." in await confirm_question(pilot, app)
        await answer(pilot, app, "y")
        expected = f"lease of job {job} killed; it was its last attempt: it is dead"
        await wait_for(pilot, lambda: _toasted(app, expected), what="the toast")
    assert statuses(dsn, [job]) == {job: "dead"}


async def test_kill_lease_while_an_effect_commits_says_try_again(dsn: str) -> None:
    """A job inside `job.once()`'s transaction is not killed yet: the toast says so, rather
    than that the job stopped running."""
    s = seed(dsn)
    job = s.running[0]
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "running", str(job))
        await pilot.press("k")
        await confirm_question(pilot, app)
        with psycopg.connect(dsn) as held:  # the row lock a handler's once() holds
            held.execute("SELECT 1 FROM jobtui.job WHERE id = %s FOR UPDATE", (job,))
            await answer(pilot, app, "y")
            expected = f"job {job} was not killed: a change holds its row now (an effect committing in job.once()"
            await wait_for(pilot, lambda: _toasted(app, expected), what="the toast")
    assert statuses(dsn, [job]) == {job: "running"}
    assert audit(dsn) == [("console", "kill-lease", f"jobs {job}", [], 0)]


def _running_attempts(app: JobtuiApp, job: int) -> str:
    running = table(app, "running")
    return str(running.get_cell(str(job), "attempt")) if str(job) in keys(running) else ""


async def test_cancel_a_running_job(dsn: str) -> None:
    s = seed(dsn)
    job = s.running[1]
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "running", str(job))
        await pilot.press("c")
        assert f"Cancel job {job} (report.build) on worker-a:1? It becomes failed." in await confirm_question(
            pilot, app
        )
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: statuses(dsn, [job]) == {job: "failed"}, what="cancelled")
    assert statuses(dsn, [s.running[0]]) == {s.running[0]: "running"}
    assert audit(dsn) == [("console", "cancel", f"jobs {job}", [job], 1)]


async def test_enter_on_a_running_job_explains_it(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        running = await open_pane(pilot, app, "running", str(s.expired))
        assert keys(running)[0] == str(s.expired)  # expired leases first
        assert str(running.get_cell(str(s.expired), "lease left")).startswith("EXPIRED ")
        assert str(running.get_cell(str(s.expired), "worker")) == "ghost:9"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), what="the detail screen")
        detail = app.screen.query_one("#detail")
        await wait_for(pilot, lambda: "Loading" not in text(detail), what="the job's row")
        shown = text(detail)
        assert f"Job {s.expired} (image.resize): running" in shown
        assert "on ghost:9, but its lease expired" in shown and "the reaper will return the job" in shown
        assert '"image": 7' in shown  # the payload
        for action in ("sort", "filter", "kill_lease", "cancel", "pane"):  # the panes' keys are not live here
            assert app.check_action(action, ()) is False, action
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.on_main_screen(), what="back to the panes")
        assert app.check_action("kill_lease", ()) is True


# -- schedules --------------------------------------------------------------------------------


def paused(dsn: str, name: str) -> bool:
    return bool(query(dsn, "SELECT paused FROM jobtui.schedule WHERE name = %s", name)[0][0])


async def test_pause_and_resume_a_schedule_ask_first(dsn: str) -> None:
    seed(dsn)
    async with console(dsn) as (app, pilot):
        schedules = await open_pane(pilot, app, "schedules", "hourly.ping")
        await pilot.press("p")
        question = await confirm_question(pilot, app)
        assert "Pause schedule hourly.ping?" in question and "1 row will change" in question
        assert "No email.send job is enqueued for its slots until it is resumed" in question
        # One line each (a question given as one string had its newlines escaped into "\n").
        assert question.split("\n")[0] == "Pause schedule hourly.ping?" and "\\n" not in question
        await answer(pilot, app, "n")  # no: nothing changes, nothing is audited
        await stays(pilot, lambda: not paused(dsn, "hourly.ping"), 0.5)
        assert audit(dsn) == []
        await pilot.press("p")
        await confirm_question(pilot, app)
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: paused(dsn, "hourly.ping"), what="paused")
        await wait_for(pilot, lambda: str(schedules.get_cell("hourly.ping", "state")) == "paused", what="paused shown")
        await pilot.press("p")
        question = await confirm_question(pilot, app)
        assert "Resume schedule hourly.ping?" in question and "stay skipped" in question
        assert question.split("\n")[-1] == "1 row will change." and "\\n" not in question
        await answer(pilot, app, "escape")
        await stays(pilot, lambda: paused(dsn, "hourly.ping"), 0.5)
        await pilot.press("p")
        await confirm_question(pilot, app)
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: not paused(dsn, "hourly.ping"), what="resumed")
        await wait_for(pilot, lambda: str(schedules.get_cell("hourly.ping", "state")) == "active", what="active shown")
        assert any("schedule hourly.ping resumed" in str(n.message) for n in app._notifications)
    assert not paused(dsn, "nightly.report")
    assert audit(dsn) == [
        ("console", "schedule-pause", "schedule hourly.ping", [], 1),
        ("console", "schedule-resume", "schedule hourly.ping", [], 1),
    ]


async def test_run_a_schedule_now(dsn: str) -> None:
    seed(dsn)
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "schedules", "nightly.report")
        await pilot.press("n")
        question = await confirm_question(pilot, app)
        assert "Run schedule nightly.report now?" in question and "One report.build job" in question
        await answer(pilot, app, "y")
        manual = "SELECT id, status FROM jobtui.job WHERE type = 'report.build' AND idempotency_key LIKE 'schedule:%%'"
        await wait_for(pilot, lambda: len(query(dsn, manual)) == 1, what="the job enqueued")
    ((job_id, status),) = query(dsn, manual)
    assert status == "ready"
    assert audit(dsn) == [("console", "schedule-run-now", "schedule nightly.report", [job_id], 1)]


# -- read-only --------------------------------------------------------------------------------


async def test_read_only_hides_every_action_and_the_keys_change_nothing(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn, read_only=True) as (app, pilot):
        assert app.actions_ is None
        for pane, key, presses in (
            ("dead", BILLING_KEY, "r"),
            ("running", str(s.running[0]), "kc"),
            ("schedules", "nightly.report", "pn"),
        ):
            await open_pane(pilot, app, pane, key)
            for action in CHANGES:
                assert app.check_action(action, ()) is False, (pane, action)
            shown = {b.binding.action for b in app.screen.active_bindings.values()}
            assert not shown & set(CHANGES), (pane, shown)
            assert {"filter", "sort", "help", "quit"} <= shown
            for k in presses:
                await pilot.press(k)
            await stays(pilot, lambda: app.on_main_screen(), 0.3)  # no dialog
        await open_pane(pilot, app, "dead", BILLING_KEY)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobListScreen), what="the group's jobs")
        await wait_for(pilot, lambda: app.screen.query_one(KeyedTable).row_count == 3, what="its jobs")
        assert not {b.binding.action for b in app.screen.active_bindings.values()} & {"requeue", "requeue_group"}
        await pilot.press("r", "R", "c")
        await stays(pilot, lambda: isinstance(app.screen, JobListScreen), 0.3)
        assert "read-only" in text(app.query_one("#status"))
    assert set(statuses(dsn, s.dead_billing).values()) == {"dead"}
    assert set(statuses(dsn, s.running).values()) == {"running"}
    assert not any(paused(dsn, n) for n in ("hourly.ping", "nightly.report"))
    assert query(dsn, "SELECT count(*) FROM jobtui.job WHERE type = 'report.build'") == [(2,)]
    assert audit(dsn) == []


# -- navigation -------------------------------------------------------------------------------


async def test_filter_narrows_every_pane_and_escape_clears_it(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        ready = await open_pane(pilot, app, "ready")
        await wait_for(pilot, lambda: ready.row_count == 2, what="email.send and sms.send")
        await pilot.press("slash", "s", "m", "s", "enter")  # typing 's' must not sort
        await wait_for(pilot, lambda: keys(ready) == ["sms.send"], what="the filter")
        assert app.needle == "sms" and ready.sort_column is None
        assert "filter: 'sms'" in text(app.query_one("#status"))
        await pilot.pause(0.5)  # refreshes keep the filter
        assert keys(ready) == ["sms.send"]
        running = await open_pane(pilot, app, "running")
        assert running.row_count == 0  # no running sms.send job
        await pilot.press("slash")
        await pilot.press(*"ghost", "enter")
        await wait_for(pilot, lambda: keys(running) == [str(s.expired)], what="the worker filter")
        await pilot.press("slash", "escape")
        await wait_for(pilot, lambda: running.row_count == 3, what="the filter cleared")
        assert app.needle == ""
        ready = await open_pane(pilot, app, "ready")  # drawn again as it comes on screen
        await wait_for(pilot, lambda: ready.row_count == 2, what="the ready pane unfiltered")


async def test_sort_cycles_columns_and_direction(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        running = await open_pane(pilot, app, "running")
        await wait_for(pilot, lambda: running.row_count == 3, what="3 running jobs")
        assert keys(running)[0] == str(s.expired)  # the query's order: the oldest lease first
        by_id = sorted([*s.running, s.expired])
        await pilot.press("s")
        await wait_for(pilot, lambda: keys(running) == [str(i) for i in by_id], what="sorted by id")
        await pilot.press("s")
        await wait_for(pilot, lambda: keys(running) == [str(i) for i in reversed(by_id)], what="descending")
        await pilot.press("s")  # next column: type
        await wait_for(pilot, lambda: keys(running)[0] == str(s.expired), what="sorted by type")
        assert [str(c) for c in running.get_column("type")] == ["image.resize", "report.build", "report.build"]
        await pilot.pause(0.5)  # refreshes keep the order
        assert keys(running)[0] == str(s.expired)


async def test_number_keys_switch_panes_each_offering_only_its_actions(dsn: str) -> None:
    seed(dsn)
    async with console(dsn) as (app, pilot):
        offered = {
            "2": ("running", {"kill_lease", "cancel"}),
            "3": ("dead", {"requeue"}),
            "4": ("expiries", set()),
            "5": ("schedules", {"pause_schedule", "run_now"}),
            "1": ("ready", set()),
        }
        for key, (pane, allowed) in offered.items():
            await pilot.press(key)
            await wait_for(pilot, lambda p=pane: app.pane == p, what=pane)
            assert app.focused is table(app, pane)
            shown = {b.binding.action for b in app.screen.active_bindings.values()}
            assert shown & set(CHANGES) == allowed, pane
            assert {"filter", "sort", "help", "quit"} <= shown
            assert "toggle_worker" not in shown  # no embedded worker
        await pilot.press("r", "k", "c", "p", "n")  # not the ready pane's keys
        await pilot.press("6")  # no embedded worker: stays, and says why
        await stays(pilot, lambda: app.on_main_screen() and app.pane == "ready", 0.3)
        assert any("no embedded worker" in str(n.message) for n in app._notifications)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        assert "kill the selected job's lease" in text(app.screen.query_one("#help"))
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.on_main_screen(), what="help closed")
    assert audit(dsn) == []


async def test_free_text_is_shown_as_is_not_as_markup(dsn: str) -> None:
    error = "ValueError: expected list[int], got [/oops] [bold]x"
    with Client(dsn, max_connections=1) as queue:
        job = queue.enqueue("odd[type]", {"tags": ["[b]"]}, max_attempts=1)
    query(dsn, "UPDATE jobtui.job SET status = 'dead', attempts = 1, last_error = %s, finished_at = now() "
          "WHERE id = %s RETURNING id", error, job)  # fmt: skip
    async with console(dsn) as (app, pilot):
        dead = await open_pane(pilot, app, "dead")
        await wait_for(pilot, lambda: dead.row_count == 1, what="the group")
        key = keys(dead)[0]
        assert dead.get_cell(key, "type").plain == "odd[type]"
        assert dead.get_cell(key, "error fingerprint").plain == error
        await pilot.press("r")
        assert error in await confirm_question(pilot, app)
        await answer(pilot, app, "n")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobListScreen), what="the group's jobs")
        assert error in text(app.screen.query_one("#title"))
        await wait_for(pilot, lambda: app.screen.query_one(KeyedTable).row_count == 1, what="its job")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), what="the job")
        detail = app.screen.query_one("#detail")
        await wait_for(pilot, lambda: "Loading" not in text(detail), what="the job's row")
        assert error in text(detail) and '"[b]"' in text(detail)
        assert len(app.screen_stack) == 3  # enter opened one screen, not two


# -- the database goes away -------------------------------------------------------------------


async def test_database_unreachable_keeps_the_last_data_and_recovers(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        await open_pane(pilot, app, "running")
        await wait_for(pilot, lambda: table(app, "running").row_count == 3, what="running jobs")
        await open_pane(pilot, app, "dead")
        await wait_for(pilot, lambda: table(app, "dead").row_count == 3, what="data")
        vitals = app.query_one("#vitals")
        await wait_for(pilot, lambda: "UNREACHABLE" not in text(vitals), what="a healthy header")
        app.source.dsn = "postgresql://postgres@127.0.0.1:1/nowhere"  # a port nothing answers
        app.source.disconnect()
        await wait_for(pilot, lambda: not app.connected, what="the failed read")
        await wait_for(pilot, lambda: "DATABASE UNREACHABLE" in text(vitals), what="the banner")
        assert "dead 5" in text(vitals)  # the last figures stay
        assert table(app, "dead").row_count == 3 and table(app, "running").row_count == 3
        assert "last error" in text(app.query_one("#status"))
        app.source.dsn = dsn  # the server is back
        await wait_for(pilot, lambda: app.connected, what="the reconnection")
        await wait_for(pilot, lambda: "UNREACHABLE" not in text(vitals), what="the banner to go")
        running = await open_pane(pilot, app, "running")
        assert str(s.expired) in keys(running)


async def test_unreachable_from_the_start(dsn: str) -> None:
    app = JobtuiApp("postgresql://postgres@127.0.0.1:1/nowhere", refresh_interval=0.2, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: not app.connected, what="the failed read")
        await wait_for(pilot, lambda: "DATABASE UNREACHABLE" in text(app.query_one("#vitals")), what="banner")
        assert table(app, "ready").row_count == 0


# -- embedded worker --------------------------------------------------------------------------


def test_worker_log_keeps_its_place_after_old_lines_are_dropped() -> None:
    handler = LogToWidget(keep=3)
    record = logging.LogRecord("jobtui.worker", logging.WARNING, __file__, 1, "line %d", (0,), None)
    lines, seen = handler.since(0)
    assert (lines, seen) == ([], 0)
    for i in range(5):
        record.args = (i,)
        handler.handle(record)
    lines, seen = handler.since(0)  # 5 emitted, the newest 3 kept
    assert seen == 5 and [line.split(" ", 1)[1] for _, line in lines] == ["WARNING line 2", "WARNING line 3",
                                                                            "WARNING line 4"]  # fmt: skip
    record.args = (5,)
    handler.handle(record)
    lines, seen = handler.since(seen)  # the pane asks for what it has not shown: only the new line
    assert seen == 6 and [(level, line.endswith("line 5")) for level, line in lines] == [(logging.WARNING, True)]
    assert handler.since(seen) == ([], 6)


jobs = Jobs()


@jobs.handler("tui.echo")
def echo(job: Job) -> None:
    """Nothing to do: done at once."""


async def test_embedded_worker_runs_jobs_pauses_and_stops_on_quit(dsn: str) -> None:
    worker_logger = logging.getLogger("jobtui.worker")
    before = (worker_logger.level, worker_logger.propagate, list(worker_logger.handlers))
    with Client(dsn, max_connections=1) as queue:
        worker = Worker(jobs, dsn, concurrency=2, poll_interval=0.2, scheduler=False, retention=None,
                        worker_id="console-worker", shutdown_timeout=5)  # fmt: skip
        async with console(dsn, worker=worker) as (app, pilot):
            await wait_for(pilot, lambda: worker.running, what="the worker to start")
            first = queue.enqueue_many([NewJob("tui.echo", i) for i in range(5)])
            await wait_for(pilot, lambda: set(statuses(dsn, first).values()) == {"done"}, what="5 jobs done")
            await pilot.press("6")
            await wait_for(pilot, lambda: app.pane == "worker", what="the worker pane")
            state = app.query_one("#worker-state")
            await wait_for(pilot, lambda: "local worker console-worker: running" in text(state), what="state")
            # The rows are done before the worker counts them (it learns it from the write).
            await wait_for(pilot, lambda: "done 5" in text(state), what="5 counted done")
            assert app.check_action("toggle_worker", ()) is True

            await pilot.press("w")
            assert worker.paused
            await wait_for(pilot, lambda: "console-worker: paused" in text(state), what="paused shown")
            second = queue.enqueue_many([NewJob("tui.echo", i) for i in range(3)])
            await stays(pilot, lambda: set(statuses(dsn, second).values()) == {"ready"}, 1.0)  # not claimed

            await pilot.press("w")
            assert not worker.paused
            await wait_for(pilot, lambda: set(statuses(dsn, second).values()) == {"done"}, what="resumed")
            assert worker.counts["done"] == 8
            log = app.query_one("#worker-log")
            await wait_for(pilot, lambda: len(log.lines) > 0, what="log lines")
            assert "worker console-worker started" in "\n".join(line.text for line in log.lines)

            await pilot.press("q")
            await wait_for(pilot, lambda: not worker.running, timeout=15, what="a graceful stop")
    assert not worker.running
    assert worker.in_flight == {}
    # The console gave the loggers back.
    assert (worker_logger.level, worker_logger.propagate, list(worker_logger.handlers)) == before


async def test_the_worker_pane_shows_the_embedded_workers_process_pool(dsn: str) -> None:
    from tests.apps import stoppable_app

    with Client(dsn, max_connections=1) as queue:
        worker = Worker(stoppable_app.jobs, dsn, concurrency=1, poll_interval=0.2, scheduler=False, retention=None,
                        worker_id="console-pool", shutdown_timeout=5, executor="process",
                        max_jobs_per_child=2)  # fmt: skip
        async with console(dsn, worker=worker) as (app, pilot):
            await wait_for(pilot, lambda: worker.running, timeout=30, what="the worker and its pool to start")
            await pilot.press("6")
            await wait_for(pilot, lambda: app.pane == "worker", what="the worker pane")
            state = app.query_one("#worker-state")
            await wait_for(
                pilot,
                lambda: (
                    "process pool: 1 children (0 busy, 1 idle); started 1, recycled 0, killed 0, died 0" in text(state)
                ),
                what="the pool's first child",
            )
            ids = queue.enqueue_many([NewJob("quick") for _ in range(3)])
            await wait_for(pilot, lambda: set(statuses(dsn, ids).values()) == {"done"}, timeout=30, what="jobs done")
            # Two jobs in the first child, which is then replaced; the third in the second.
            await wait_for(
                pilot,
                lambda: (
                    "process pool: 1 children (0 busy, 1 idle); started 2, recycled 1 (jobs 1), killed 0, died 0"
                    in text(state)
                ),
                timeout=10,
                what="the pool's counts after a child was recycled",
            )
            assert "sync handlers in threads" not in text(state)
            await pilot.press("q")
            await wait_for(pilot, lambda: not worker.running, timeout=15, what="a graceful stop")
    assert worker.children is not None and worker.children.children == set()
