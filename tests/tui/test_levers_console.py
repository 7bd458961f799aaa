"""The second round of levers in the console, driven by Textual's pilot against a real
database: a rate typed then confirmed (fenced by the rate shown), a resume with a ramp, the
jobs search from the filter box (progress, older pages and back, a job's detail, escape
cancelling a search that waits), and the bulk requeue, discard and cancel over its filter;
read-only offering none of them."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from jobtui.clients.client import Client
from jobtui.core import queues
from jobtui.kernel.domain import NewJob
from jobtui.tui.screens import ConfirmScreen, JobDetailScreen
from jobtui.tui.search import JobSearchScreen
from jobtui.tui.widgets import KeyedTable

from .helpers import audit, query, seed, statuses, stays, wait_for
from .test_console import answer, confirm_question, console, keys, table, text


async def queue_row(pilot: Any, app: Any, key: str) -> KeyedTable:
    await pilot.press("7")
    await wait_for(pilot, lambda: key in keys(table(app, "queues")), what=key)
    t = table(app, "queues")
    t.move_cursor(row=keys(t).index(key))
    await pilot.pause(0.05)
    return t


def rates(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT kind, name, rate_per_second FROM jobtui.queue_control WHERE rate_per_second IS NOT NULL")


async def test_a_rate_is_typed_then_confirmed_and_fenced_by_the_rate_shown(dsn: str) -> None:
    seed(dsn)
    async with console(dsn, actor="olga") as (app, pilot):
        t = await queue_row(pilot, app, "type:email.send")
        await pilot.press("t")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ValueScreen", what="the rate box")
        await pilot.press("f", "a", "s", "t", "enter")  # not a rate: says so, changes nothing
        await wait_for(pilot, lambda: app.on_main_screen(), what="the box closed")
        assert any("bad rate" in str(n.message) for n in app._notifications)
        await pilot.press("t")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ValueScreen", what="the rate box")
        await pilot.press(*"20/s", "enter")
        question = await confirm_question(pilot, app)
        assert "Set the rate of type email.send to at most 20/s" in question and "It was none" in question
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: rates(dsn) == [("type", "email.send", 20.0)], what="the rate")
        await wait_for(pilot, lambda: "20/s" in str(t.get_row("type:email.send")), what="the rate shown")
        # Someone else changes it while this operator answers: nothing changes, and the toast says so.
        await pilot.press("t")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ValueScreen", what="the rate box")
        await pilot.press("backspace", "backspace", "backspace", "backspace", *"5/s", "enter")
        await confirm_question(pilot, app)
        with psycopg.connect(dsn, autocommit=True) as conn:
            queues.set_rate(conn, "type", "email.send", 30.0, actor="bob")
        await answer(pilot, app, "y")
        await wait_for(
            pilot, lambda: any("changed to 30/s meanwhile" in str(n.message) for n in app._notifications), what="toast"
        )
    assert rates(dsn) == [("type", "email.send", 30.0)]
    assert [(a[1], a[4]) for a in audit(dsn)] == [("type-rate", 1), ("type-rate", 1), ("type-rate", 0)]


async def test_a_paused_queue_is_resumed_with_a_ramp(dsn: str) -> None:
    seed(dsn)
    async with console(dsn, actor="olga") as (app, pilot):
        await queue_row(pilot, app, "queue:default")
        await pilot.press("u")  # not paused: no ramp to start
        await wait_for(pilot, lambda: any("not paused" in str(n.message) for n in app._notifications), what="toast")
        with psycopg.connect(dsn, autocommit=True) as conn:
            queues.pause(conn, "queue", "default", actor="olga")
        await wait_for(pilot, lambda: "by olga" in str(table(app, "queues").get_row("queue:default")), what="paused")
        await pilot.press("u")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ValueScreen", what="the ramp box")
        await pilot.press("enter")  # the default, 60s
        question = await confirm_question(pilot, app)
        assert "Resume queue default with a ramp of 60s?" in question and "rising tenfold" in question
        await answer(pilot, app, "y")
        await wait_for(
            pilot,
            lambda: (
                query(dsn, "SELECT paused_at IS NULL, ramp_until > now() FROM jobtui.queue_control") == [(True, True)]
            ),
            what="the ramp",
        )
        await wait_for(pilot, lambda: "→" in str(table(app, "queues").get_row("queue:default")), what="ramp shown")
    assert [a[1] for a in audit(dsn)] == ["queue-pause", "queue-resume"]


async def test_a_ramp_of_a_type_rated_below_1_per_second_says_its_rate_holds(dsn: str) -> None:
    """control_rate starts a ramp at 1/s or at the rate, when lower: at 0.5/s it does not rise,
    and the question says so instead of "at 1/s, rising tenfold"."""
    seed(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        queues.set_rate(conn, "type", "sms.send", 0.5, actor="olga")
        queues.pause(conn, "type", "sms.send", actor="olga")
    async with console(dsn, actor="olga") as (app, pilot):
        await queue_row(pilot, app, "type:sms.send")
        await wait_for(pilot, lambda: "by olga" in str(table(app, "queues").get_row("type:sms.send")), what="paused")
        await pilot.press("u")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ValueScreen", what="the ramp box")
        await pilot.press("enter")
        question = await confirm_question(pilot, app)
        assert "come back at 30/min from the start" in question and "rising" not in question, question
        await answer(pilot, app, "y")
        resumed = "SELECT paused_at IS NULL, ramp_until > now() FROM jobtui.queue_control WHERE kind = 'type'"
        await wait_for(pilot, lambda: query(dsn, resumed) == [(True, True)], what="the ramp")
    # Half way through the ramp, the rate is still the type's own.
    [(rate,)] = query(
        dsn,
        "SELECT jobtui.control_rate(rate_per_second, ramp_from, ramp_until, ramp_from + (ramp_until - ramp_from) / 2)"
        " FROM jobtui.queue_control WHERE kind = 'type' AND name = 'sms.send'",
    )
    assert rate == pytest.approx(0.5)


async def search(pilot: Any, app: Any, words: str, rows: int | None = None) -> JobSearchScreen:
    """The search screen for `words`; with `rows`, once it lists that many jobs."""
    await pilot.press("slash")
    await pilot.press(*words, "enter")
    await wait_for(pilot, lambda: isinstance(app.screen, JobSearchScreen), what="the search")
    screen = app.screen
    assert isinstance(screen, JobSearchScreen)
    if rows is not None:
        table = screen.query_one(KeyedTable)
        await wait_for(pilot, lambda: len(keys(table)) == rows, what=f"{rows} jobs listed for {words!r}")
    return screen


def status_line(screen: JobSearchScreen) -> str:
    return text(screen.query_one("#search-status"))


async def test_the_filter_box_searches_jobs_by_payload_and_pages(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn) as (app, pilot):
        screen = await search(pilot, app, "payload:to=user1@example.com")
        jobs = screen.query_one(KeyedTable)
        await wait_for(pilot, lambda: keys(jobs) == [str(s.ready[1])], what="the job")
        await wait_for(pilot, lambda: "1 job(s) match" in status_line(screen), what="the count")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.on_main_screen(), what="back")
        # A bad word says why in one line and opens nothing.
        await pilot.press("slash", *"status:sleeping", "enter")
        await wait_for(pilot, lambda: any("unknown status" in str(n.message) for n in app._notifications), what="toast")
        assert app.on_main_screen()


def search_waits_for_a_lock(dsn: str, screen: JobSearchScreen) -> bool:
    """Whether the search's own session waits for a lock (the console's others may too)."""
    conn = screen._conn
    if conn is None:
        return False
    pid = conn.info.backend_pid
    return query(dsn, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", pid) == [("Lock",)]


async def test_escape_cancels_a_search_that_waits(dsn: str) -> None:
    seed(dsn)
    with psycopg.connect(dsn) as locker:
        async with console(dsn) as (app, pilot):
            locker.execute("LOCK TABLE jobtui.job IN ACCESS EXCLUSIVE MODE")  # every read of it waits
            screen = await search(pilot, app, "payload:to=nobody")
            # Escape stops the search's statement once it runs: wait until it waits for the lock,
            # which a loaded machine may take a while to reach.
            await wait_for(pilot, lambda: search_waits_for_a_lock(dsn, screen), what="the search waiting for the lock")
            await stays(pilot, lambda: "searching" in status_line(screen), 0.5)
            await pilot.press("escape")
            await wait_for(pilot, lambda: "stopped" in status_line(screen), timeout=5.0, what="the search stopped")
            locker.rollback()


async def test_a_bulk_requeue_over_the_search_asks_with_the_count_then_runs(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn, actor="olga") as (app, pilot):
        await search(pilot, app, "type:invoice.render status:dead", rows=3)
        await pilot.press("c")  # cancel applies to ready and running jobs, not dead ones
        await wait_for(
            pilot, lambda: any("applies to ready" in str(n.message) for n in app._notifications), what="toast"
        )
        await pilot.press("r")
        question = await confirm_question(pilot, app)
        assert "Requeue the 3 dead and failed jobs matching status=dead type=invoice.render?" in question
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: set(statuses(dsn, s.dead_billing).values()) == {"ready"}, what="requeued")
        await wait_for(
            pilot, lambda: any("requeued 3 job(s)" in str(n.message) for n in app._notifications), what="toast"
        )
    assert statuses(dsn, [s.failed]) == {s.failed: "failed"}  # not in the filter
    [row] = audit(dsn)
    assert (row[0], row[1], row[4]) == ("olga", "bulk-requeue", 3)


async def test_read_only_searches_but_offers_no_bulk_action(dsn: str) -> None:
    s = seed(dsn)
    async with console(dsn, read_only=True) as (app, pilot):
        await queue_row(pilot, app, "queue:default")
        shown = {b.binding.action for b in app.screen.active_bindings.values()}
        assert not shown & {"rate", "ramp"}
        await search(pilot, app, "type:invoice.render status:dead", rows=3)
        shown = {b.binding.action for b in app.screen.active_bindings.values()}
        assert not any(a.startswith("bulk") for a in shown)
        await pilot.press("r", "d")
        await stays(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 0.3)
    assert set(statuses(dsn, s.dead_billing).values()) == {"dead"} and audit(dsn) == []


def enqueue_accounts(dsn: str, n: int, account: str = "acme") -> list[int]:
    with Client(dsn, max_connections=1) as q:
        return q.enqueue_many([NewJob("email.send", {"account": account, "n": i}) for i in range(n)])


async def test_a_search_pages_older_and_back_and_opens_a_jobs_detail(dsn: str) -> None:
    seed(dsn)
    enqueue_accounts(dsn, 150)
    enqueue_accounts(dsn, 5, account="other")
    newest = [
        str(r[0])
        for r in query(
            dsn, "SELECT id FROM jobtui.job WHERE payload @> %s ORDER BY id DESC", Jsonb({"account": "acme"})
        )
    ]
    assert len(newest) == 150
    async with console(dsn) as (app, pilot):
        screen = await search(pilot, app, "payload:account=acme")
        jobs = screen.query_one(KeyedTable)
        await wait_for(pilot, lambda: keys(jobs) == newest[:100], what="the newest page")
        await wait_for(pilot, lambda: "100 of 150 · ] older" in status_line(screen), what="the count")
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: keys(jobs) == newest[100:], what="the older page")
        await wait_for(pilot, lambda: f"50 of 50 below id {newest[99]}" in status_line(screen), what="its line")
        assert "older" not in status_line(screen)  # nothing older: ] does nothing now
        await pilot.press("right_square_bracket")
        await stays(pilot, lambda: keys(jobs) == newest[100:], 0.3)
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: keys(jobs) == newest[:100], what="back to the newest page")
        await wait_for(pilot, lambda: "100 of 150" in status_line(screen), what="the count again")
        jobs.move_cursor(row=3)
        await pilot.pause(0.05)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), what="the detail screen")
        detail = app.screen.query_one("#detail")
        await wait_for(pilot, lambda: "Loading" not in text(detail), what="the job's row")
        [(payload, status)] = query(dsn, "SELECT payload, status FROM jobtui.job WHERE id = %s", int(newest[3]))
        shown = text(detail)
        assert shown.startswith(f"Job {newest[3]} (email.send): {status}"), shown
        assert f'"n": {payload["n"]}' in shown and '"account": "acme"' in shown, shown
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen, what="back to the search")
        assert keys(jobs) == newest[:100]


async def test_a_bulk_discard_over_the_search_deletes_the_jobs_after_yes(dsn: str) -> None:
    s = seed(dsn)
    doomed = [*s.dead_billing, s.failed]
    async with console(dsn, actor="olga") as (app, pilot):
        screen = await search(pilot, app, "type:invoice.render status:dead,failed")
        await wait_for(
            pilot, lambda: sorted(keys(screen.query_one(KeyedTable))) == sorted(map(str, doomed)), what="jobs"
        )
        await pilot.press("d")
        question = await confirm_question(pilot, app)
        assert "Delete the 4 dead and failed jobs matching status=dead,failed type=invoice.render?" in question
        await answer(pilot, app, "n")  # no: nothing changes
        await stays(pilot, lambda: len(statuses(dsn, doomed)) == 4, 0.3)
        await pilot.press("d")
        await confirm_question(pilot, app)
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: statuses(dsn, doomed) == {}, what="the rows deleted")
        await wait_for(
            pilot, lambda: any("discarded 4 job(s)" in str(n.message) for n in app._notifications), what="toast"
        )
        await wait_for(pilot, lambda: keys(screen.query_one(KeyedTable)) == [], what="the search read again")
    assert set(statuses(dsn, s.dead_reset).values()) == {"dead"}  # another type: untouched
    [row] = audit(dsn)
    [(run,)] = query(dsn, "SELECT id FROM jobtui.bulk_run")
    assert row == ("olga", "bulk-discard", f"bulk run {run}: status=dead,failed type=invoice.render", [], 4)
    [(detail,)] = query(dsn, "SELECT detail FROM jobtui.audit")
    assert (detail["discarded"], detail["filter"]) == (4, {"statuses": ["dead", "failed"], "types": ["invoice.render"]})


async def test_a_bulk_discard_changes_only_the_jobs_its_question_counted(dsn: str) -> None:
    """Jobs that die while the question is open (one enqueued before the count, one after) are
    left dead, and the toast says so; pressing d again counts them."""
    s = seed(dsn)
    with Client(dsn, max_connections=1) as q:
        was_ready = q.enqueue("invoice.render", {"n": 1})
    async with console(dsn, actor="olga") as (app, pilot):
        screen = await search(pilot, app, "type:invoice.render status:dead", rows=3)
        await pilot.press("d")
        question = await confirm_question(pilot, app)
        assert "3 row(s) will change" in question
        query(dsn, "UPDATE jobtui.job SET status = 'dead', finished_at = now() WHERE id = %s RETURNING id", was_ready)
        [(newcomer,)] = query(
            dsn,
            "INSERT INTO jobtui.job (type, payload, status, attempts, max_attempts, last_error, finished_at)"
            " VALUES ('invoice.render', '{}', 'dead', 3, 3, 'KeyError: x', now()) RETURNING id",
        )
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: statuses(dsn, s.dead_billing) == {}, what="the counted jobs deleted")
        said = "discarded 3 job(s) (bulk run 1); 2 job(s) matched after the count and were left: press d again"
        await wait_for(
            pilot,
            lambda: any(said in str(n.message) for n in app._notifications),
            what=f"the toast, got {[str(n.message) for n in app._notifications]}",
        )
        assert statuses(dsn, [was_ready, newcomer]) == {was_ready: "dead", newcomer: "dead"}
        assert "Jobs that match after this count are left: press d again for them." in question
        await wait_for(pilot, lambda: "2 job(s) match" in status_line(screen), what="the search read again")
        await pilot.press("d")
        assert "2 row(s) will change" in await confirm_question(pilot, app)
        await answer(pilot, app, "n")
    [row] = audit(dsn)
    assert (row[1], row[4]) == ("bulk-discard", 3)


async def test_a_bulk_cancel_over_the_search_fails_the_ready_jobs_after_yes(dsn: str) -> None:
    s = seed(dsn)
    ready = [*s.ready, *s.delayed]
    async with console(dsn, actor="olga") as (app, pilot):
        await search(pilot, app, "type:email.send status:ready", rows=6)
        await pilot.press("c")
        question = await confirm_question(pilot, app)
        assert "Cancel the 6 ready and running jobs matching status=ready type=email.send?" in question
        await answer(pilot, app, "y")
        await wait_for(pilot, lambda: set(statuses(dsn, ready).values()) == {"failed"}, what="cancelled")
        await wait_for(
            pilot, lambda: any("cancelled 6 job(s)" in str(n.message) for n in app._notifications), what="toast"
        )
    [(run,)] = query(dsn, "SELECT id FROM jobtui.bulk_run")
    errors = query(dsn, "SELECT DISTINCT last_error FROM jobtui.job WHERE id = ANY(%s)", ready)
    assert errors == [(f"cancelled by olga (bulk run {run})",)]
    assert statuses(dsn, [s.sms, *s.running]) == {s.sms: "ready", **dict.fromkeys(s.running, "running")}
    [row] = audit(dsn)
    assert row == ("olga", "bulk-cancel", f"bulk run {run}: status=ready type=email.send", [], 6)
    [(detail,)] = query(dsn, "SELECT detail FROM jobtui.audit")
    assert (detail["cancelled"], detail["busy"], detail["stopped"]) == (6, 0, False)
