"""The jobs search of the console: the filter box's `payload:account=acme` (with `status:`,
`type:`, `queue:`, `error:`, `older:` and `since:` words) opens the jobs that match, newest
first, a page at a time, with the search's progress while it reads and a count that goes on
after the page; escape cancels it. Over the same filter, `r` requeues, `d` discards (dead and
failed jobs) and `c` cancels (ready and running ones) in bulk: counted first, asked, then
run batch by batch with a progress bar (bulk.py), over only the jobs the count could see (a
job that matched after it is left, and the toast says so); escape stops it, and a second
run resumes it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, cast

import psycopg
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Label, ProgressBar

from jobtui.core import bulk
from jobtui.kernel.db import connect, first_line
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.jobfilter import JobFilter
from jobtui.kernel.safetext import line
from jobtui.reads.jobquery import JobSummary, SearchCancelled, SearchResult, search, search_count
from jobtui.tui import render
from jobtui.tui.console import Change, Console, change_actions
from jobtui.tui.screens import ConfirmScreen, JobDetailScreen
from jobtui.tui.widgets import KeyedTable

COLUMNS = ["id", "type", "queue", "status", "attempts", "created", "last error"]
PAGE = 100
VERB = {"requeue": "Requeue", "discard": "Delete", "cancel": "Cancel"}


def job_rows(jobs: list[JobSummary]) -> list[render.Row]:
    return [
        render.row(
            str(j.id),
            [
                str(j.id),
                j.type,
                j.queue,
                j.status.value,
                f"{j.attempts}/{j.max_attempts if j.max_attempts is not None else '-'}",
                j.created_at.strftime("%m-%d %H:%M:%S"),
                j.last_error or "-",
            ],
        )
        for j in jobs
    ]


class JobSearchScreen(Screen[None]):
    """The jobs of a filter, and the bulk actions over them. Keys typed meanwhile wait for the
    first search to end (LOADS_ROWS, keys.py)."""

    LOADS_ROWS = True

    BINDINGS = [
        Binding("escape", "back", "Back / cancel"),
        Binding("enter", "open", "Detail", show=False),
        Binding("right_square_bracket", "next_page", "Older", show=False),
        Binding("left_square_bracket", "first_page", "Newest", show=False),
        Change("r", "bulk('requeue')", "Requeue all"),
        Change("d", "bulk('discard')", "Discard all"),
        Change("c", "bulk('cancel')", "Cancel all"),
    ]
    DEFAULT_CSS = """
    #search-title { padding: 0 1; background: $boost; width: 100%; }
    #search-status { padding: 0 1; width: 100%; }
    #search-progress { padding: 0 1; display: none; }
    #search-progress.busy { display: block; }
    """

    def __init__(self, text: str, filt: JobFilter) -> None:
        super().__init__()
        self.text = line(text)
        self.filter = filt
        self.before: int | None = None  # the page shown starts below this id (None: the newest)
        self.result: SearchResult | None = None
        self.total: int | None = None  # counted to the end
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None  # the statement to cancel
        self._busy = ""  # what runs now: "searching", "counting", "requeue"...

    @property
    def console(self) -> Console:
        return cast(Console, self.app)

    def compose(self) -> ComposeResult:
        yield Label(Text(f"Jobs matching {self.text}"), id="search-title")
        yield ProgressBar(total=1.0, show_eta=False, id="search-progress")
        yield Label(Text("searching..."), id="search-status")
        yield KeyedTable(COLUMNS, id="search-jobs")
        yield Footer()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        changes = {a.split("(")[0] for a in change_actions(type(self))}  # bulk('requeue') is action bulk
        return not (action in changes and self.console.read_only)

    def on_mount(self) -> None:
        self.query_one(KeyedTable).focus()
        self.load()

    # -- reading ---------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        source = self.console.source
        return connect(source.dsn, autocommit=True, pooler=source.pooler, connect_timeout=3)

    # What the threads report comes back here, possibly after the screen closed: then it is
    # dropped (NoMatches).

    def _began(self, what: str) -> None:
        self._busy = what
        self._stop.clear()
        with contextlib.suppress(NoMatches):
            self.query_one("#search-progress", ProgressBar).add_class("busy")
            self.query_one("#search-progress", ProgressBar).update(progress=0.0)

    def _ended(self) -> None:
        self._busy = ""
        with contextlib.suppress(NoMatches):
            self.query_one("#search-progress", ProgressBar).remove_class("busy")
        self.console.screen_loaded(self)

    def _status(self, text: str) -> None:
        with contextlib.suppress(NoMatches):
            self.query_one("#search-status", Label).update(Text(line(text)))

    def _reporter(self, text: Callable[[float, int], str]) -> Callable[[float, int], None]:
        """A progress callback for a worker thread: the bar and the status line follow it."""
        return lambda done, n: self.app.call_from_thread(self._progress, done, text(done, n))

    def _progress(self, done: float, said: str) -> None:
        with contextlib.suppress(NoMatches):
            self.query_one("#search-progress", ProgressBar).update(progress=done)
        self._status(said)

    @work(thread=True, exclusive=True, group="search")
    def load(self) -> None:
        schema = self.console.source.schema
        self.app.call_from_thread(self._began, "searching")
        try:
            with self._connect() as conn:
                self._conn = conn
                said = self._reporter(lambda d, n: f"searching: {d:.0%} of the table read, {n:,} found")
                found = search(conn, self.filter, limit=PAGE, before=self.before, schema=schema, stop=self._stop,
                               progress=said)  # fmt: skip
                self.app.call_from_thread(self._shown, found)
                if found.complete or self.total is not None:
                    return
                shown, least = len(found.jobs), found.matched
                said = self._reporter(
                    lambda d, n: f"{shown:,} of at least {max(n, least):,} · counting: {d:.0%} of the table read"
                )
                counts = search_count(conn, self.filter, schema=schema, stop=self._stop, progress=said)
                self.total = sum(c.jobs for c in counts)
                self.app.call_from_thread(self._shown, found)
        except (SearchCancelled, psycopg.errors.QueryCanceled) as exc:
            why = first_line(exc) if isinstance(exc, SearchCancelled) else "cancelled"
            self.app.call_from_thread(self._status, f"stopped: {why}")
        except Exception as exc:  # said in place; nothing changed
            self.app.call_from_thread(self._status, f"cannot search: {first_line(exc)}")
        finally:
            self._conn = None
            self.app.call_from_thread(self._ended)

    def _shown(self, found: SearchResult) -> None:
        self.result = found
        with contextlib.suppress(NoMatches):
            self.query_one(KeyedTable).sync(job_rows(found.jobs))
        first = "" if self.before is None else f" below id {self.before}"
        if found.complete and self.before is None:
            said = f"{found.matched:,} job(s) match"
        elif self.total is not None and self.before is None:
            said = f"{len(found.jobs):,} of {self.total:,}"
        else:
            said = f"{found.said()}{first}"
        more = " · ] older" if found.more else ""
        index = "" if found.indexed or self.filter.payload is None else " · read without the payload index"
        self._status(f"{said}{more}{index}")

    def cancel_running(self) -> bool:
        """Stop what runs (between windows or batches, and the statement itself); True if something did."""
        if not self._busy:
            return False
        self._stop.set()
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):  # the statement ended meanwhile
                conn.cancel_safe(timeout=1.0)
        return True

    def action_back(self) -> None:
        if not self.cancel_running():
            self.app.pop_screen()

    def action_next_page(self) -> None:
        if self.result is not None and self.result.more and not self._busy:
            self.before = self.result.jobs[-1].id
            self.load()

    def action_first_page(self) -> None:
        if self.before is not None and not self._busy:
            self.before = None
            self.load()

    def action_open(self) -> None:
        key = self.query_one(KeyedTable).selected_key
        if key is not None:
            self.app.push_screen(JobDetailScreen(int(key)))

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    # -- bulk actions ----------------------------------------------------------------------

    def action_bulk(self, action: str) -> None:
        actions = self.console.actions_
        if self.console.read_only or actions is None:
            self.app.notify("read-only console: actions are disabled", severity="error")
            return
        if self._busy:
            self.app.notify(f"{self._busy} still runs: escape stops it first", severity="warning")
            return
        scope = bulk.SCOPE[cast(bulk.Action, action)]
        bad = [s for s in self.filter.statuses if s not in scope]
        if bad:
            self.app.notify(f"{action} applies to {' and '.join(scope)} jobs, not {', '.join(bad)}", severity="error")
            return
        self.console.keys.hold("counting")  # the keys wait for the question
        self._count_then_ask(action)

    @work(thread=True, exclusive=True, group="search")
    def _count_then_ask(self, action: str) -> None:
        try:
            self._ask(action)
        finally:
            self.app.call_from_thread(self.console.keys.ready, "counting")

    def _ask(self, action: str) -> None:
        actions = self.console.actions_
        assert actions is not None
        self.app.call_from_thread(self._began, f"counting for {action}")
        try:
            with self._connect() as conn:
                self._conn = conn
                job = bulk.Bulk(conn, action, self.filter, actor=actions.actor, schema=actions.schema)
                pending = job.pending()
                said = self._reporter(lambda d, n: f"counting: {n:,} found")
                tally = None if pending is not None else job.tally(stop=self._stop, progress=said)
        except Exception as exc:
            self.app.call_from_thread(self._status, f"cannot count: {first_line(exc)}")
            return
        finally:
            self._conn = None
            self.app.call_from_thread(self._ended)
        scope = " and ".join(bulk.SCOPE[job.action])
        count = None if tally is None else tally.jobs
        if pending is not None:
            question = [
                f"{VERB[action]} the {scope} jobs matching {self.filter.describe()}?",
                f"This resumes bulk run {pending.id} of {pending.started_by} ({pending.changed:,} done so far):",
                "the jobs it has not reached yet will change, none twice.",
            ]
        elif count == 0:
            self.app.call_from_thread(self.app.notify, f"no {scope} jobs match: nothing to {action}")
            return
        else:
            question = [
                f"{VERB[action]} the {count:,} {scope} jobs matching {self.filter.describe()}?",
                f"{count:,} row(s) will change, {bulk.BATCH:,} per transaction; workers go on meanwhile.",
                f"Jobs that match after this count are left: press {action[0]} again for them.",
                "Escape stops it between two batches; doing it again resumes it.",
            ]

        def answered(yes: bool | None) -> None:
            if yes:
                self._run_bulk(action, tally)
            elif self.result is not None:
                self._shown(self.result)  # the status line says what is shown again

        asking = f"{action} {'the rest' if count is None else f'{count:,} job(s)'}? asking first"
        self.app.call_from_thread(self._status, asking)
        self.app.call_from_thread(self.app.push_screen, ConfirmScreen(question), answered)

    @work(thread=True, exclusive=True, group="search")
    def _run_bulk(self, action: str, tally: bulk.Tally | None) -> None:
        """Run the action from the count's mark (`tally`, None when resuming a run: its own
        mark), then count what matched past the mark, which the run left."""
        actions = self.console.actions_
        assert actions is not None
        past = bulk.PAST[cast(bulk.Action, action)]
        self.app.call_from_thread(self._began, action)
        later: int | None = None
        try:
            with self._connect() as conn:
                job = bulk.Bulk(conn, action, self.filter, actor=actions.actor, schema=actions.schema)
                said = self._reporter(lambda d, n: f"{action}: {n:,} {past}, {d:.0%} of the table")
                started = job.start(None if tally is None else tally.mark)
                outcome = job.run(started, stop=self._stop, progress=said)
                if not outcome.stopped:
                    self.app.call_from_thread(
                        self._status, f"{past} {outcome.changed:,}; counting what matched since the count"
                    )
                    # The toast says what changed without it if this count fails or is stopped.
                    with contextlib.suppress(psycopg.Error, InvalidInput):
                        later = job.tally(started.mark, stop=self._stop).later
        except Exception as exc:
            why = first_line(exc)
            self.app.call_from_thread(self.app.notify, f"{action} failed: {why}", severity="error", timeout=8)
            return
        finally:
            self.app.call_from_thread(self._ended)
        counted = None if tally is None or outcome.resumed else tally.jobs
        self.app.call_from_thread(self.app.notify, bulk_toast(action, outcome, counted, later), timeout=8)
        self.total = None
        self.app.call_from_thread(self.load)


def bulk_toast(action: str, outcome: bulk.BulkOutcome, counted: int | None, later: int | None) -> str:
    """What a bulk run did, against what its question said (bulk.outcome_line)."""
    return bulk.outcome_line(cast(bulk.Action, action), outcome, counted, later, f"press {action[0]} again")
