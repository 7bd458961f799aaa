"""Modal and drill-down screens of the console."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import cast

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Label, Static

from jobtui.kernel.errors import first_line
from jobtui.kernel.explain import explain
from jobtui.kernel.safetext import block, line, shorten
from jobtui.reads.backlog import READY_EXACT_CAP
from jobtui.reads.joblists import DeadJob, ReadyJob
from jobtui.tui import changes, render
from jobtui.tui.console import Change, Console, change_actions
from jobtui.tui.widgets import KeyedTable


class ConfirmScreen(ModalScreen[bool]):
    """Asks before a change; says exactly what will change and how many rows.

    The question comes as lines, each escaped on its own: they quote job types and errors,
    and a newline in those must not add a line to the question (`0 row(s) will change`).
    Each is then cut to LINE characters (its start and end kept): a type or an error can be
    as long as a hand insert makes it, and the count and the buttons must stay on an 80x24
    screen.
    """

    # Two or three rows of the dialog: longer than any line of a question's own text, short
    # enough that a question of six lines all quoting data fits on 24 rows with its buttons.
    LINE = 120

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("enter", "answer(True)", "Yes", show=False),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "No", show=False),
    ]

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    #dialog { width: 72; max-width: 95%; height: auto; border: thick $warning; background: $surface; padding: 1 2; }
    #question { width: 100%; margin-bottom: 1; }
    #buttons { height: auto; width: 100%; align-horizontal: right; }
    Button { margin-left: 2; }
    """

    def __init__(self, question: str | list[str]) -> None:
        super().__init__()
        parts = [question] if isinstance(question, str) else question
        # Escaped first, so the cut bounds what is drawn, escapes included.
        self.question = "\n".join(shorten(line(part), self.LINE) for part in parts)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Label(Text(self.question), id="question")  # not markup: it quotes error messages
            with Horizontal(id="buttons"):
                yield Button("Yes (y)", variant="warning", id="yes")
                yield Button("No (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


HELP = """\
[b]Panes[/]   1 ready · 2 running · 3 dead · 4 lease expiries · 5 schedules · 7 queues
        6 worker (with --work) · 8 charts of the last hour · 9 workers (the fleet) · 0 why
        (what holds each queue and type, the evidence and the fix); or click a tab
[b]0[/]       in queues: why, of the selected queue or type alone ([b]a[/] in why: every one);
        in why, [b]enter[/] goes where the selected cause's fix is
[b]Move[/]    arrows, page up/down, home/end; [b]enter[/] drill down: a type, a group, a job,
        a worker's jobs; [b]a[/] back to every worker (running), every type (dead)
[b]Ready[/]   by type; "attempts (done 1h)": jobs done in the last hour by attempts used
[b]/[/]       filter by type or text (escape clears); words such as payload:account=acme
        status:dead (type:, queue:, error:, older:, since:) search the jobs instead
[b]s[/]       sort by the next column (again: reversed); [b]] \\[[/] next page, first page

[b]Actions[/] each change asks first and writes the audit log; hidden with --read-only
[b]r[/]       requeue the selected dead group (in its list: the job; in a jobs search: all)
[b]R[/]       requeue the whole group, from a group's list
[b]k[/]       kill the selected job's lease (ready again; dead if it was its last attempt)
[b]c[/]       cancel the selected job (failed; its worker stops it); in a jobs search: all
[b]d[/]       in a jobs search: delete its dead and failed jobs (esc stops, again resumes)
[b]p[/]       pause/resume the selected schedule; in queues, a queue or type fleet-wide;
        in workers, quiet (claims stop, jobs in flight finish) or resume a process
[b]x[/]       in workers: stop the selected process (as SIGTERM: its jobs finish, it exits)
[b]P[/]       in workers: quiet (or resume) every process shown (filter by host, version...)
[b]X[/]       in workers: stop every process shown
[b]n[/]       run the selected schedule now
[b]l[/]       in queues: at most N of the queue's jobs running at once, fleet-wide
[b]t[/]       in queues: the queue's or type's rate (20/s, 1200/min), fleet-wide
[b]u[/]       in queues: resume a paused queue or type with a ramp (its rate rises from 1/s)
[b]w[/]       pause or resume the embedded worker (--work; local, not asked)

[b]?[/] this help · [b]esc[/] back · [b]q[/] quit (a worker finishes its jobs first)
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    #help {
        width: 92; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")


class JobDetailScreen(Screen[None]):
    """One job explained from its row, refreshed every second."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "Back")]
    DEFAULT_CSS = "#detail { padding: 0 1; }"

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text(f"Loading job {self.job_id}..."), id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.load()
        self.set_interval(1.0, self.load)

    @work(thread=True, exclusive=True, group="detail")
    def load(self) -> None:
        try:
            job = cast(Console, self.app).source.job(self.job_id)
            text = f"No job {self.job_id} (archived or deleted)." if job is None else "\n".join(explain(job, full=True))
        except Exception as exc:  # shown in place (never the end of the console); the next tick tries again
            text = f"Cannot read job {self.job_id}: {first_line(exc)}"
        self.app.call_from_thread(self._show, text)

    def _show(self, text: str) -> None:
        # Payloads and errors are neither markup nor terminal codes (explain escapes its lines;
        # a database error is escaped here). A read that ends after the screen closed is dropped.
        with contextlib.suppress(NoMatches):
            self.query_one("#detail", Static).update(Text(block(text)))


# A drill-down list's columns, by its kind: the ready jobs of a type, the jobs of a dead group.
JOB_COLUMNS = {
    "ready": ["id", "type", "attempts", "waiting", "age", "last error"],
    "dead": ["id", "type", "status", "attempts", "finished", "worker", "last error"],
}


def ready_job_cells(j: ReadyJob) -> list[Text | str]:
    waiting = render.age(j.waiting) if j.waiting >= 0 else f"in {render.age(-j.waiting)}"
    return [str(j.id), j.type, f"{j.attempts}/{j.max_attempts}", waiting, render.age(j.age), j.last_error or "-"]


def dead_job_cells(j: DeadJob) -> list[Text | str]:
    attempts = f"{j.attempts}/{j.max_attempts}"
    return [str(j.id), j.type, j.status, attempts, render.when(j.finished_at), j.worker or "-", j.last_error]


def ready_job_rows(jobs: Sequence[ReadyJob]) -> list[render.Row]:
    return [render.row(str(j.id), ready_job_cells(j)) for j in jobs]


def dead_job_rows(jobs: Sequence[DeadJob]) -> list[render.Row]:
    return [render.row(str(j.id), dead_job_cells(j)) for j in jobs]


class JobListScreen(Screen[None]):
    """A drill-down list: the ready jobs of a type, or the jobs of a dead-letter group. Keys
    typed with the one that opened it wait for its first rows (LOADS_ROWS, keys.py)."""

    LOADS_ROWS = True

    BINDINGS = [
        Binding("escape,q", "app.pop_screen", "Back"),
        Binding("enter", "open", "Detail"),
        Change("r", "requeue", "Requeue job"),
        Change("R", "requeue_group", "Requeue group"),
        Change("c", "cancel", "Cancel job"),
    ]
    DEFAULT_CSS = "#title { padding: 0 1; background: $boost; width: 100%; }"

    def __init__(self, kind: str, title: str, *, job_type: str, status: str = "", fingerprint: str = "") -> None:
        super().__init__()
        self.kind = kind  # "ready" or "dead"
        self.title_text = line(title)  # it names the type and the error
        self.job_type = job_type
        self.status = status
        self.fingerprint = fingerprint

    def compose(self) -> ComposeResult:
        yield Label(Text(self.title_text), id="title")
        yield KeyedTable(JOB_COLUMNS[self.kind], id="jobs")
        yield Footer()

    @property
    def console(self) -> Console:
        return cast(Console, self.app)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in change_actions(type(self)) and self.console.read_only:
            return False  # hidden (None would show them dimmed)
        if action in ("requeue", "requeue_group"):
            return self.kind == "dead"
        if action == "cancel":
            return self.kind == "ready"
        return True

    def on_mount(self) -> None:
        table = self.query_one(KeyedTable)
        table.focus()
        table.loading = True  # until the first read: an empty table would say "no jobs"
        self.load()
        self.set_interval(1.0, self.load)

    @work(thread=True, exclusive=True, group="list")
    def load(self) -> None:
        source = self.console.source
        note = ""
        try:
            if self.kind == "ready":
                ready = source.ready_jobs(self.job_type)
                rows = ready_job_rows(ready.jobs)
                # A bounded read: past that many, the list says it did not look further.
                note = f" · among the oldest {READY_EXACT_CAP:,} ready jobs" if ready.cut else ""
            else:
                rows = dead_job_rows(source.dead_jobs(self.status, self.job_type, self.fingerprint))
        except Exception as exc:  # said in the title; the next tick tries again
            why = first_line(exc)
            self.app.call_from_thread(self._title, f"{self.title_text} · cannot read: {why}")
            self.app.call_from_thread(self.console.screen_loaded, self)  # the keys act on no rows
            return
        self.app.call_from_thread(self._loaded, rows, note)

    def _title(self, text: str) -> None:
        with contextlib.suppress(NoMatches):  # a read that ends after the screen closed
            self.query_one("#title", Label).update(Text(line(text)))

    def _loaded(self, rows: list[render.Row], note: str = "") -> None:
        with contextlib.suppress(NoMatches):  # a read that ends after the screen closed
            table = self.query_one(KeyedTable)
            table.loading = False
            table.sync(rows)
            self._title(f"{self.title_text}{'' if rows else ' · none now'}{note}")
        self.console.screen_loaded(self)

    def _selected_id(self) -> int | None:
        key = self.query_one(KeyedTable).selected_key
        return int(key) if key else None

    def action_open(self) -> None:
        job_id = self._selected_id()
        if job_id is not None:
            self.app.push_screen(JobDetailScreen(job_id))

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        event.stop()  # handled: enter on a job explains it
        self.action_open()

    def _ask_job(self, question: str, change: Callable[..., str]) -> None:
        """Ask `question` of the selected job (`{job}` names it); on yes, `change` it."""
        job_id = self._selected_id()
        if job_id is not None:
            what = question.format(job=f"job {job_id} ({self.job_type})")
            self.console.confirm_then([what, "1 row will change."], change, self.console.actions_, job_id)

    def action_requeue(self) -> None:
        self._ask_job("Requeue {job}?", changes.requeue_job)

    def action_requeue_group(self) -> None:
        self.console.ask_requeue_group(self.status, self.job_type, self.fingerprint)

    def action_cancel(self) -> None:
        self._ask_job("Cancel {job}? It becomes failed.", changes.cancel)
