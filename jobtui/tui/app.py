"""`jobtui`, the operator console: live panes of the queue, and the keys to repair it.

jobtui --dsn postgresql://.../app            # watch and operate
jobtui --read-only                           # watch only
jobtui --work myapp.jobs:jobs                # with a worker inside the console
jobtui --open workers                        # on a view: workers, job:ID, dead:TYPE, queue:NAME

The panes (panes/, one module each) own their keys and draw themselves from a `View`; this
app holds what they share: the header and status line, the reads, the filter, the questions
before a change, help, quit and the embedded worker's lifecycle.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import Footer, Input, Static, TabbedContent

from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import InvalidInput, first_line
from jobtui.kernel.jobfilter import is_search, parse_filter
from jobtui.kernel.safetext import line, shorten
from jobtui.kernel.views import OpenView
from jobtui.reads.fleet import Finding, findings, holders
from jobtui.reads.metrics import Snapshot
from jobtui.tui import changes, header, panes, render
from jobtui.tui.console import Console, View
from jobtui.tui.data import Actions, DataSource, Fetched
from jobtui.tui.keys import KeyGate
from jobtui.tui.panes import LogToWidget, Pane, WorkerPane
from jobtui.tui.screens import ConfirmScreen, HelpScreen, JobDetailScreen
from jobtui.tui.search import JobSearchScreen
from jobtui.tui.widgets import SubmitBox

HISTORY = 120  # samples of the oldest ready age kept for the sparkline
WHY_ROWS = ("why", "rows")  # what the keys typed as the Why pane opens wait for (keys.py)
# The panes whose refreshes read the done jobs of the last minute by queue and type.
DONE_PANES = ("queues", "workers")
PANE_ACTIONS: frozenset[str] = frozenset().union(*(pane.actions() for pane in panes.ALL))


class JobtuiApp(App[None]):
    """The console. Reads every second in a worker thread; never blocks on the database."""

    TITLE = "jobtui"
    CSS = """
    Screen { layout: vertical; overflow: hidden; }
    #vitals { height: auto; padding: 0 1; background: $boost; }
    #panes { height: 1fr; }
    #status { height: 1; padding: 0 1; color: $text-muted; background: $boost; }
    #filter { display: none; }
    #filter.visible { display: block; }
    KeyedTable { height: 1fr; }
    TabPane { padding: 0; }
    #worker-state { height: auto; padding: 0 1; }
    """

    # The panes' own keys come first in the footer: the focus is in the pane on screen.
    BINDINGS = [
        *(Binding(pane.KEY, f"pane('{pane.ID}')", pane.ID.capitalize(), show=False) for pane in panes.ALL),
        Binding("w", "toggle_worker", "Worker on/off"),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        actor: str = "console",
        read_only: bool = False,
        thresholds: render.Thresholds | None = None,
        worker: Any = None,
        refresh_interval: float = 1.0,
        pooler: str | None = None,
        open_view: OpenView | None = None,
    ) -> None:
        super().__init__()
        self.dsn = dsn
        self.schema = schema
        self.read_only_asked = read_only
        # Why the server takes no change, once a read said so ("standby", "read-only server");
        # '' while it takes them. The console is then read-only by itself.
        self.server_refuses = ""
        self.thresholds = thresholds or render.Thresholds()
        self.source = DataSource(dsn, schema, pooler)
        # Past the warning age, each refresh reads what holds the oldest wait (the header says it).
        self.source.why_after = self.thresholds.oldest_ready_warn
        self.actions_ = None if read_only else Actions(dsn, schema, actor, pooler)
        self.embedded_worker = worker
        self.refresh_interval = refresh_interval
        self.open_view = open_view  # the view to start on (`--open`, a web console's ?open=)
        self.latest: Fetched | None = None
        self.findings: list[Finding] = []
        self.history: collections.deque[float] = collections.deque(maxlen=HISTORY)
        self.connected = True
        self.last_error = ""
        self.needle = ""
        self._log_handler = LogToWidget() if worker is not None else None
        self._saved_loggers: list[tuple[logging.Logger, int, bool]] = []
        self._vitals_width: int | None = None
        self._vitals_lines = 0
        # Seconds on a monotonic clock, for the live countdowns; tests substitute a fixed one.
        self.clock: Callable[[], float] = time.monotonic
        # Keys one at a time, held while a screen or a pane opens (keys.py).
        self.keys = KeyGate(self)

    # -- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(Text("connecting..."), id="vitals")
        start = self.open_view.pane if self.open_view is not None else "ready"
        if start == "worker" and self._log_handler is None:
            start = "ready"
        with TabbedContent(initial=start, id="panes"):
            for pane in panes.ALL:  # in the order of their number keys
                if pane is not WorkerPane:
                    yield pane()
                elif self._log_handler is not None:
                    yield WorkerPane(self.embedded_worker, self._log_handler)
        yield SubmitBox(
            placeholder="filter by type or text, or search jobs: payload:account=acme status:dead; enter, escape",
            id="filter",
        )
        yield Static("", id="status")
        yield Footer()

    @property
    def read_only(self) -> bool:
        """No change keys: asked for with --read-only, or on a standby (or a server whose
        transactions are read-only), where every change would fail."""
        return self.read_only_asked or bool(self.server_refuses)

    def on_mount(self) -> None:
        self.sub_title = "read-only" if self.read_only else ""
        if self.embedded_worker is not None:
            self._capture_logs()
            self.run_worker(self.embedded_worker.run(), name="embedded-worker", group="embedded", exit_on_error=False)
        self._open(self.open_view)
        self.refresh_data()
        self.set_interval(self.refresh_interval, self.refresh_data)
        self.set_interval(0.25, self.tick)
        self.active_pane.focus_default()
        self.screen_change_signal.subscribe(
            self, lambda screen: self.keys.screen_changed(screen, self.screen_stack), immediate=True
        )

    def _open(self, view: OpenView | None) -> None:
        """Start on `view`: its pane is on screen already (compose); a job is explained over
        it, a type's dead letters shown alone, a queue's line selected once read."""
        if view is None:
            return
        if view.kind == "worker" and self._log_handler is None:
            self.notify("no embedded worker: start the console with --work pkg.module:jobs", severity="warning")
        elif view.kind == "job" and view.value is not None:
            self.push_screen(JobDetailScreen(int(view.value)))
        elif view.kind == "dead" and view.value is not None:
            self.query_one(panes.DeadPane).aim("type", view.value)
        elif view.kind == "queue" and view.value is not None:
            self.query_one(panes.QueuesPane).aim("queue", view.value)

    def on_goto(self, message: panes.Goto) -> None:
        """A pane sent the console to another pane, maybe to a line in it."""
        message.stop()
        if message.kind is not None and message.name is not None:
            self.query_one(f"#{message.pane}", Pane).aim(message.kind, message.name)
        self.action_pane(message.pane)  # the keys after it wait for that pane, as after its key

    def on_unmount(self) -> None:
        self._release_logs()

    # -- keys ------------------------------------------------------------------------------

    async def on_event(self, event: events.Event) -> None:
        """Keys from the terminal go on one at a time, and wait while a screen opens (keys.py)."""
        if isinstance(event, events.Key) and not event.is_forwarded:
            if self.keys.arrived(event):
                return
            target = self.focused or self.screen
            await super().on_event(event)
            self.keys.passed(event, target)
            return
        await super().on_event(event)

    def screen_loaded(self, screen: Screen[Any]) -> None:
        """A list's first rows are shown (or it said why not): its keys may go."""
        self.keys.ready((screen, "rows"))

    # -- data ------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="refresh")
    def refresh_data(self) -> None:
        try:
            fetched = self.source.fetch(self.needle)
        except Exception as exc:  # shown in the header; the data on screen stays
            message = first_line(exc)
            self.call_from_thread(self._disconnected, message)
            return
        self.call_from_thread(self._apply, fetched)

    def _disconnected(self, message: str) -> None:
        self.connected = False
        self.last_error = message
        self.tick()
        self.keys.ready(WHY_ROWS)  # the Why pane says the database is not answering

    def _apply(self, fetched: Fetched) -> None:
        self.connected = True
        self.last_error = ""
        self.latest = fetched
        # What the fleet means for the queue: worked out once per read, drawn at every tick.
        self.findings = findings(fetched.fleet, fetched.queues, holders(fetched.fleet, fetched.snapshot.running))
        self._server_refusal(fetched)
        self.history.append(fetched.snapshot.oldest_ready_age or 0.0)
        self.render_panes()
        if self.source.done_wanted and not fetched.queues_done:
            self.refresh_data()  # read before its pane opened (the first read, on a start there)
        if fetched.diagnosis is not None:
            self.keys.ready(WHY_ROWS)

    def _server_refusal(self, fetched: Fetched) -> None:
        """Read-only by itself while the server takes no change: the snapshot asks each read
        whether it is in recovery (so a promoted standby takes changes again); a server whose
        transactions are read-only says so when the console connects."""
        where = fetched.where
        if fetched.snapshot.standby:
            refuses = "standby"
        elif where is not None and where.server_read_only and not where.standby:
            refuses = "read-only server"
        else:
            refuses = ""
        if refuses != self.server_refuses:
            self.server_refuses = refuses
            self.sub_title = "read-only" if self.read_only else ""
            self.refresh_bindings()  # the change keys go (or come back)

    def view(self) -> View | None:
        """What the panes show now: the last read, aged by the clock, with the filter."""
        if self.latest is None:
            return None
        return View(self.latest, self.clock() - self.latest.read_at, self.needle, self.thresholds)

    def render_panes(self) -> None:
        # A read or a tick can land while the app is closing, after its widgets are gone.
        with contextlib.suppress(NoMatches):
            view = self.view()
            if view is None:
                return
            # Only the pane on screen: drawing the charts and a page of running jobs behind
            # another pane every second cost the console most of its CPU. A pane is drawn
            # with the last read when it comes on screen.
            self.active_pane.show(view)
            self._render_vitals(view.snapshot, view.elapsed)

    def tick(self) -> None:
        """Between reads: advance countdowns and ages, show the worker's state, and turn the
        header red as soon as a read has waited too long (the read itself is still waiting)."""
        self.source.give_up_if_hung()
        self.keys.tick()
        with contextlib.suppress(NoMatches):
            view = self.view()
            self._render_vitals(None if view is None else view.snapshot, None if view is None else view.elapsed)
            self.active_pane.tick(view)

    def _render_vitals(self, snap: Snapshot | None, elapsed: float | None) -> None:
        box = self.query_one("#vitals", Static)
        width = box.content_size.width or None  # unknown before the first layout
        where = self.latest.where if self.latest is not None and self.latest.where else self.source.where
        # The sparkline: the database's minutes when there are some (the hour before the console
        # opened), else what this console has seen.
        ages = [m.oldest_ready_age or 0.0 for m in snap.minutes] if snap is not None else []
        cause = header.first_cause(self.latest.diagnosis if self.latest else None, snap, self.thresholds)
        text = header.header(
            snap,
            ages or list(self.history),
            self.thresholds,
            where=where,
            schema=self.schema,
            read_only=self.read_only_asked,
            refuses=self.server_refuses,
            connected=self.connected,
            last_error=self.last_error,
            hung_for=self.source.busy_for(),
            stale_for=elapsed,
            width=width,
            fleet=self.findings if snap is not None else [],
            cause=cause if self.connected else None,
        )
        # The header wraps when the figures outgrow the width. It keeps its tallest height until
        # the terminal is resized, so the panes below do not jump as numbers grow and shrink.
        lines = text.plain.count("\n") + 1
        if width != self._vitals_width:
            self._vitals_width, self._vitals_lines = width, 0
        if lines > self._vitals_lines:
            self._vitals_lines = lines
            box.styles.min_height = lines
        box.update(text)
        if elapsed is None:
            return
        status = f"{self.schema} · {'read-only · ' if self.read_only else ''}"
        status += f"filter: '{self.needle}' · " if self.needle else ""  # as typed: not repr, which doubles \
        if self.needle and self.latest is not None and self.latest.needle == self.needle and self.latest.filter_problem:
            status += f"{self.latest.filter_problem} · "
        status += f"last error: {self.last_error}" if not self.connected else f"updated {render.age(elapsed)} ago"
        self.query_one("#status", Static).update(Text(line(status)))  # the filter and errors: not markup

    # -- panes -----------------------------------------------------------------------------

    @property
    def pane(self) -> str:
        """The id of the pane on screen."""
        active = self.query_one("#panes", TabbedContent).active
        return active or "ready"

    @property
    def active_pane(self) -> Pane:
        return self.query_one(f"#{self.pane}", Pane)

    def selected(self) -> str | None:
        """The key of the row selected in the pane on screen."""
        return self.active_pane.selected_key

    def on_main_screen(self) -> bool:
        """False while a drill-down, detail or dialog screen is on top of the panes."""
        return len(self.screen_stack) <= 1

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Whether a key is live: True shows and enables it, False hides it, None dims it.

        Textual asks this of the app's own keys; the panes answer for theirs. Asked about a
        pane's action (scripts and tests do), the pane on screen answers.
        """
        if action == "toggle_worker":
            return self.embedded_worker is not None
        if action == "pane":
            return self.on_main_screen()  # not under a drill-down: it would switch panes unseen
        if action in PANE_ACTIONS:
            pane = self.active_pane
            return action in pane.actions() and pane.check_action(action, parameters)
        return True

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if not self.screen_stack:
            return  # a tab change that comes as the app exits: no screen left to show it on
        self.refresh_bindings()
        pane = self.active_pane
        # The Why pane's refreshes read the diagnosis; opened, it reads at once.
        self.source.why_open = pane.ID == "why"
        if self.source.why_open and (self.latest is None or self.latest.diagnosis is None):
            self.keys.hold(WHY_ROWS)  # its rows come with the diagnosis: the keys wait for them
            self.refresh_data()
        elif not self.source.why_open:
            self.keys.ready(WHY_ROWS)  # left before its rows came: the reads bring none now
        # The done jobs by queue are read only while a pane that uses them is open; opened, it
        # reads at once (and _apply reads again if a read made before came back after).
        self.source.done_wanted = pane.ID in DONE_PANES
        if self.source.done_wanted and self.latest is not None and not self.latest.queues_done:
            self.refresh_data()
        view = self.view()
        if view is not None:
            with contextlib.suppress(NoMatches):
                pane.show(view)  # hidden, it was not drawn: the last read, now
        pane.focus_default()
        self.call_later(self.keys.ready, ("pane", pane.ID))  # once the focus has moved

    def action_pane(self, pane: str) -> None:
        if pane == "worker" and self.embedded_worker is None:
            self.notify("no embedded worker: start the console with --work pkg.module:jobs", severity="warning")
            return
        tabs = self.query_one("#panes", TabbedContent)
        if tabs.active != pane:
            self.keys.hold(("pane", pane))  # its keys, once its table has the focus
        tabs.active = pane

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every toast, escaped, cut to a readable length and never markup: many quote schedule
        names, types and errors."""
        message, title = line(shorten(message)), line(shorten(title))
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    # -- the filter, one for every pane ----------------------------------------------------

    def show_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("visible")
        box.value = self.needle
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        # A pasted control character is shown, and matched, as the cells show it: escaped.
        box = event.input
        if box.id == "filter" and box.value != line(box.value):
            box.value = line(box.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            self._submitted(event)
        finally:
            self.keys.submitted(event.input)  # the keys typed after enter go on

    def _submitted(self, event: Input.Submitted) -> None:
        if is_search(event.value):
            # `payload:account=acme status:dead ...`: the jobs search, on a screen of its own.
            try:
                filt = parse_filter(event.value)
            except InvalidInput as exc:
                self.notify(str(exc), severity="error")
                return
            event.input.remove_class("visible")
            event.input.value = self.needle  # the box keeps the panes' filter, not the search
            self.active_pane.focus_default()  # back from the search, the pane's keys are live
            self.push_screen(JobSearchScreen(event.value.strip(), filt))
            return
        self.needle = event.value.strip()
        event.input.remove_class("visible")
        self.active_pane.focus_default()
        self.render_panes()
        self.refresh_data()  # the dead groups whose errors match it are read by the database

    def on_key(self, event: events.Key) -> None:
        if self.keys.back(event):  # passed on before what it belongs to began to open
            event.prevent_default()
            event.stop()
            return
        if event.key == "enter" and isinstance(self.focused, SubmitBox):
            self.keys.submitting(self.focused)  # its binding submits the box next
        box = self.query_one("#filter", Input)
        if event.key == "escape" and box.has_class("visible"):
            self.needle = ""
            box.value = ""
            box.remove_class("visible")
            self.active_pane.focus_default()
            self.render_panes()
            event.stop()

    # -- asking before a change ------------------------------------------------------------

    def confirm_then(self, question: str | list[str], action: Callable[..., Any], *args: Any) -> None:
        """Ask `question` (its lines, each escaped); on yes, run `action(*args)` in a worker thread.

        The changes of `changes` take the console's `actions_` first: None in read-only, where
        this refuses before anything runs.
        """
        if self.read_only or self.actions_ is None:
            why = f" (the server is a {self.server_refuses})" if self.server_refuses else ""
            self.notify(f"read-only console{why}: actions are disabled", severity="error")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._run_action(action, *args)

        self.push_screen(ConfirmScreen(question), answered)

    @work(thread=True, group="actions")
    def _run_action(self, action: Callable[..., Any], *args: Any) -> None:
        try:
            message = action(*args)
        except Exception as exc:  # one line for the operator; nothing half-done (one transaction)
            text = first_line(exc)
            self.call_from_thread(self.notify, f"failed: {text}", severity="error", timeout=8, markup=False)
            return
        self.call_from_thread(self.notify, message, timeout=5, markup=False)
        self.call_from_thread(self.refresh_data)

    def ask_requeue_group(self, status: str, job_type: str, fingerprint: str, error: str | None = None) -> None:
        """Count a dead group's jobs now, then ask to requeue exactly those (the dead pane's r,
        a group list's R). The keys wait for the question."""
        self.keys.hold("counting")
        self._count_then_confirm(status, job_type, fingerprint, error)

    @work(thread=True, group="actions")
    def _count_then_confirm(self, status: str, job_type: str, fingerprint: str, error: str | None) -> None:
        # The ids are read now and exactly those are requeued on yes: the number asked about
        # is the number that changes. A group still growing (a poison job failing again and
        # again) would otherwise send jobs nobody was shown back into the same failure.
        try:
            ids = self.source.dead_group_ids(status, job_type, fingerprint, error)
        except Exception as exc:
            self.call_from_thread(self.notify, f"cannot count the group: {exc}", severity="error", markup=False)
            self.call_from_thread(self.keys.ready, "counting")
            return
        question = changes.requeue_group_question(status, job_type, fingerprint, ids, error)
        self.call_from_thread(
            self.confirm_then,
            question,
            changes.requeue_group,
            self.actions_,
            self.source,
            status,
            job_type,
            fingerprint,
            ids,
            error,
        )
        self.call_from_thread(self.keys.ready, "counting")  # the question now holds them

    # -- the embedded worker ---------------------------------------------------------------

    def _capture_logs(self) -> None:
        """Send the embedded worker's log lines to the Worker pane instead of the terminal."""
        assert self._log_handler is not None
        for name in ("jobtui.worker", "jobtui.scheduler", "jobtui.db"):
            logger = logging.getLogger(name)
            self._saved_loggers.append((logger, logger.level, logger.propagate))
            logger.addHandler(self._log_handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False

    def _release_logs(self) -> None:
        """Put the loggers back as they were (the console may run inside a longer process)."""
        while self._saved_loggers:
            logger, level, propagate = self._saved_loggers.pop()
            if self._log_handler is not None:
                logger.removeHandler(self._log_handler)
            logger.setLevel(level)
            logger.propagate = propagate

    def action_toggle_worker(self) -> None:
        w = self.embedded_worker
        if w is None:
            return
        if w.paused:
            w.resume()
            self.notify("local worker resumed")
        else:
            w.pause()
            self.notify("local worker paused: in-flight jobs finish, no new ones are claimed")

    async def action_quit(self) -> None:
        w = self.embedded_worker
        if w is not None and w.running:
            self.notify(f"stopping the local worker: waiting for {len(w.in_flight)} in-flight job(s)...", timeout=30)
            w.stop()
            for _ in range(int((w.shutdown_timeout + 10) / 0.1)):
                if not w.running:
                    break
                await asyncio.sleep(0.1)
        self.exit()

    def on_exit_app(self) -> None:
        """However the app exits (q, the web console's stop, a signal), its reads and actions
        end: a read waiting on a frozen database must not keep the process alive."""
        self.source.close()
        if self.actions_ is not None:
            self.actions_.close()


def _is_a_console(app: JobtuiApp) -> Console:
    """Never called: mypy checks here that the app gives its panes what `Console` promises."""
    return app
