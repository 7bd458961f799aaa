"""`jobtui`, the operator console: live panes of the queue, and the keys to repair it.

jobtui --dsn postgresql://.../app            # watch and operate
jobtui --read-only                           # watch only
jobtui --work myapp.jobs:jobs                # with a worker inside the console
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.widgets import Footer, Input, Label, RichLog, Static, TabbedContent, TabPane

from ..metrics import DeadGroup, Snapshot
from ..safetext import SafeFormatter, line, shorten
from . import changes, render
from .data import Actions, DataSource, Fetched
from .screens import ConfirmScreen, HelpScreen, JobDetailScreen, JobListScreen
from .widgets import KeyedTable

PANES = ["ready", "running", "dead", "expiries", "schedules", "worker"]
HISTORY = 120  # samples of the oldest ready age kept for the sparkline


class LogToWidget(logging.Handler):
    """Keeps the embedded worker's log lines for the Worker pane (instead of the terminal),
    escaped: they carry job types and errors."""

    def __init__(self, keep: int = 2000) -> None:
        super().__init__()
        self.lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=keep)
        self.total = 0  # lines ever emitted: the pane's position, still right once old lines are dropped
        self.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, self.format(record)))
        self.total += 1

    def since(self, seen: int) -> tuple[list[tuple[int, str]], int]:
        """The (level, line)s emitted after the first `seen` that are still kept, and the new total."""
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            new = min(self.total - seen, len(self.lines))
            return (list(self.lines)[len(self.lines) - new :] if new > 0 else []), self.total


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

    BINDINGS = [
        Binding("1", "pane('ready')", "Ready", show=False),
        Binding("2", "pane('running')", "Running", show=False),
        Binding("3", "pane('dead')", "Dead", show=False),
        Binding("4", "pane('expiries')", "Expiries", show=False),
        Binding("5", "pane('schedules')", "Schedules", show=False),
        Binding("6", "pane('worker')", "Worker", show=False),
        Binding("enter", "open", "Open", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        Binding("r", "requeue", "Requeue"),
        Binding("k", "kill_lease", "Kill lease"),
        Binding("c", "cancel", "Cancel"),
        Binding("p", "pause_schedule", "Pause/resume"),
        Binding("n", "run_now", "Run now"),
        Binding("w", "toggle_worker", "Worker on/off"),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "jobtui",
        actor: str = "console",
        read_only: bool = False,
        thresholds: render.Thresholds | None = None,
        worker: Any = None,
        refresh_interval: float = 1.0,
    ) -> None:
        super().__init__()
        self.dsn = dsn
        self.schema = schema
        self.read_only = read_only
        self.thresholds = thresholds or render.Thresholds()
        self.source = DataSource(dsn, schema)
        self.actions_ = None if read_only else Actions(dsn, schema, actor)
        self.embedded_worker = worker
        self.refresh_interval = refresh_interval
        self.latest: Fetched | None = None
        self.history: collections.deque[float] = collections.deque(maxlen=HISTORY)
        self.connected = True
        self.last_error = ""
        self.needle = ""
        self._log_handler = LogToWidget() if worker is not None else None
        self._saved_loggers: list[tuple[logging.Logger, int, bool]] = []
        self._vitals_width: int | None = None
        self._vitals_lines = 0
        self._worker_lines_shown = 0
        # Seconds on a monotonic clock, for the live countdowns; tests substitute a fixed one.
        self.clock: Callable[[], float] = time.monotonic

    # -- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(Text("connecting..."), id="vitals")
        with TabbedContent(initial="ready", id="panes"):
            with TabPane("1 Ready", id="ready"):
                yield KeyedTable(render.COLUMNS["ready"], id="table-ready")
            with TabPane("2 Running", id="running"):
                yield KeyedTable(render.COLUMNS["running"], id="table-running")
            with TabPane("3 Dead", id="dead"):
                yield KeyedTable(render.COLUMNS["dead"], id="table-dead")
            with TabPane("4 Lease expiries", id="expiries"):
                yield KeyedTable(render.COLUMNS["expiries"], id="table-expiries")
            with TabPane("5 Schedules", id="schedules"):
                yield KeyedTable(render.COLUMNS["schedules"], id="table-schedules")
            if self.embedded_worker is not None:
                with TabPane("6 Worker", id="worker"):
                    yield Label("", id="worker-state")
                    yield RichLog(id="worker-log", max_lines=2000, wrap=False)
        yield Input(placeholder="filter by type or text; enter to apply, escape to clear", id="filter")
        yield Static("", id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "read-only" if self.read_only else ""
        if self.embedded_worker is not None:
            self._capture_logs()
            self.run_worker(self.embedded_worker.run(), name="embedded-worker", group="embedded", exit_on_error=False)
        self.refresh_data()
        self.set_interval(self.refresh_interval, self.refresh_data)
        self.set_interval(0.25, self.tick)
        self.current_table().focus()

    def on_unmount(self) -> None:
        self._release_logs()

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

    # -- data ------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="refresh")
    def refresh_data(self) -> None:
        try:
            fetched = self.source.fetch(self.needle)
        except Exception as exc:  # shown in the header; the data on screen stays
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.call_from_thread(self._disconnected, message)
            return
        self.call_from_thread(self._apply, fetched)

    def _disconnected(self, message: str) -> None:
        self.connected = False
        self.last_error = message
        self.tick()

    def _apply(self, fetched: Fetched) -> None:
        self.connected = True
        self.last_error = ""
        self.latest = fetched
        self.history.append(fetched.snapshot.oldest_ready_age or 0.0)
        self.render_panes()

    def render_panes(self) -> None:
        # A read or a tick can land while the app is closing, after its widgets are gone.
        with contextlib.suppress(NoMatches):
            self._render_panes()

    def _render_panes(self) -> None:
        if self.latest is None:
            return
        snap = self.latest.snapshot
        elapsed = self.clock() - self.latest.read_at
        needle = self.needle
        done_attempts = snap.attempts_by_type.get("done", {})
        self._table("ready").sync(render.ready_rows(snap.by_type, needle, self.thresholds, done_attempts))
        self._table("running").sync(render.running_rows(self.latest.running, needle, elapsed))
        self._table("dead").sync(render.dead_rows(snap.dead, needle, self._matched()))
        self._table("expiries").sync(render.expiry_rows(snap.recent_expiries, needle))
        self._table("schedules").sync(render.schedule_rows(snap.schedules, needle, elapsed))
        self._render_vitals(snap, elapsed)

    def tick(self) -> None:
        """Between reads: advance countdowns and ages, show the worker's state."""
        with contextlib.suppress(NoMatches):
            self._tick()

    def _tick(self) -> None:
        if self.latest is not None:
            elapsed = self.clock() - self.latest.read_at
            self._table("running").sync(render.running_rows(self.latest.running, self.needle, elapsed))
            self._render_vitals(self.latest.snapshot, elapsed)
        elif not self.connected:
            self.query_one("#vitals", Static).update(
                Text(f" DATABASE UNREACHABLE: {line(self.last_error)} ", style="bold white on red3")
            )
        self._render_worker()

    def _render_vitals(self, snap: Snapshot, elapsed: float) -> None:
        box = self.query_one("#vitals", Static)
        width = box.content_size.width or None  # unknown before the first layout
        header = render.vitals(
            snap, list(self.history), self.thresholds, connected=self.connected, stale_for=elapsed, width=width
        )
        # The header wraps when the figures outgrow the width. It keeps its tallest height until
        # the terminal is resized, so the panes below do not jump as numbers grow and shrink.
        lines = header.plain.count("\n") + 1
        if width != self._vitals_width:
            self._vitals_width, self._vitals_lines = width, 0
        if lines > self._vitals_lines:
            self._vitals_lines = lines
            box.styles.min_height = lines
        box.update(header)
        status = f"{self.schema} · {'read-only · ' if self.read_only else ''}"
        status += f"filter: '{self.needle}' · " if self.needle else ""  # as typed: not repr, which doubles \
        if self.needle and self.latest is not None and self.latest.needle == self.needle and self.latest.filter_problem:
            status += f"{self.latest.filter_problem} · "
        status += f"last error: {self.last_error}" if not self.connected else f"updated {render.age(elapsed)} ago"
        self.query_one("#status", Static).update(Text(line(status)))  # the filter and errors: not markup

    def _render_worker(self) -> None:
        if self.embedded_worker is None or self._log_handler is None:
            return
        w = self.embedded_worker
        state = "paused" if w.paused else ("running" if w.running else "stopped")
        flights = ", ".join(f"{f.job.id} {f.job.type}" for f in list(w.in_flight.values())[:8])
        counts = " · ".join(f"{k} {v}" for k, v in w.counts.items())
        self.query_one("#worker-state", Label).update(
            Text.assemble(
                f"local worker {line(str(w.worker_id))}: ",
                (state, "bold"),
                line(f" · {len(w.in_flight)}/{w.concurrency} in flight{': ' + flights if flights else ''}"),
                "\n",
                line(counts),
            )
        )
        lines, self._worker_lines_shown = self._log_handler.since(self._worker_lines_shown)
        log = self.query_one("#worker-log", RichLog)
        for level, entry in lines:
            log.write(render.log_line(level, entry))

    # -- helpers ---------------------------------------------------------------------------

    def _table(self, pane: str) -> KeyedTable:
        return self.query_one(f"#table-{pane}", KeyedTable)

    @property
    def pane(self) -> str:
        active = self.query_one("#panes", TabbedContent).active
        return active or "ready"

    def current_table(self) -> KeyedTable:
        pane = self.pane if self.pane != "worker" else "ready"
        return self._table(pane)

    def selected(self) -> str | None:
        return None if self.pane == "worker" else self.current_table().selected_key

    def _dead_group(self, key: str) -> DeadGroup | None:
        """The dead group of row `key`, as the pane shows it (with the filter's counts)."""
        if self.latest is None:
            return None
        shown = render.shown_dead_groups(self.latest.snapshot.dead, self.needle, self._matched())
        return next((g for g in shown if render.dead_key(g) == key), None)

    def _matched(self) -> list[DeadGroup] | None:
        """The groups of the jobs whose error matches the filter, if read for this filter."""
        latest = self.latest
        return latest.dead_matched if latest is not None and latest.needle == self.needle else None

    def _dead_filtered(self, group: DeadGroup) -> bool:
        """Whether `group` is shown for its jobs whose error matches the filter (not whole)."""
        latest = self.latest
        if not self.needle or latest is None or self._matched() is None:
            return False
        whole = render.shown_dead_groups(latest.snapshot.dead, self.needle, [])
        return all(render.dead_key(g) != render.dead_key(group) for g in whole)

    def on_main_screen(self) -> bool:
        """False while a drill-down, detail or dialog screen is on top of the panes."""
        return len(self.screen_stack) <= 1

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide actions that do not apply to the current pane (and all of them in read-only).

        Textual's meaning: True shows and enables, False hides and disables, None shows dimmed.
        """
        changes = {"requeue", "kill_lease", "cancel", "pause_schedule", "run_now"}
        if action in changes and self.read_only:
            return False
        # The panes' keys act on the pane's selection: not while another screen covers it.
        if action in changes | {"pane", "open", "filter", "sort"} and not self.on_main_screen():
            return False
        where = {
            "requeue": {"dead"},
            "kill_lease": {"running"},
            "cancel": {"running"},
            "pause_schedule": {"schedules"},
            "run_now": {"schedules"},
        }
        if action in where:
            return self.pane in where[action]
        if action == "toggle_worker":
            return self.embedded_worker is not None
        return True

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()
        if self.pane != "worker":
            self.current_table().focus()

    # -- navigation ------------------------------------------------------------------------

    def action_pane(self, pane: str) -> None:
        if pane == "worker" and self.embedded_worker is None:
            self.notify("no embedded worker: start the console with --work pkg.module:jobs", severity="warning")
            return
        self.query_one("#panes", TabbedContent).active = pane

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

    def action_sort(self) -> None:
        if self.pane != "worker":
            self.notify(self.current_table().cycle_sort(), timeout=2)
            self.render_panes()

    def action_filter(self) -> None:
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
        self.needle = event.value.strip()
        event.input.remove_class("visible")
        self.current_table().focus()
        self.render_panes()
        self.refresh_data()  # the dead groups whose errors match it are read by the database

    def on_key(self, event: Any) -> None:
        box = self.query_one("#filter", Input)
        if event.key == "escape" and box.has_class("visible"):
            self.needle = ""
            box.value = ""
            box.remove_class("visible")
            self.current_table().focus()
            self.render_panes()
            event.stop()

    def on_data_table_row_selected(self, event: KeyedTable.RowSelected) -> None:
        if self.on_main_screen():
            self.action_open()

    def action_open(self) -> None:
        key = self.selected()
        if key is None:
            return
        if self.pane == "ready":
            self.push_screen(JobListScreen("ready", f"Ready jobs of {key} (claim order)", job_type=key))
        elif self.pane == "dead":
            group = self._dead_group(key)
            if group is not None:
                title = f"{group.status} jobs of {group.type}: {group.fingerprint or '-'}"
                self.push_screen(
                    JobListScreen(
                        "dead", title, job_type=group.type, status=group.status, fingerprint=group.fingerprint
                    )
                )
        elif self.pane == "running":
            self.push_screen(JobDetailScreen(int(key)))
        elif self.pane == "expiries":
            self.push_screen(JobDetailScreen(int(key.split("\x1f")[0])))

    # -- actions ---------------------------------------------------------------------------

    def confirm_then(self, question: str | list[str], action: Callable[..., Any], *args: Any) -> None:
        """Ask `question` (its lines, each escaped); on yes, run `action(*args)` in a worker thread.

        The changes of `changes` take the console's `actions_` first: None in read-only, where
        this refuses before anything runs.
        """
        if self.read_only or self.actions_ is None:
            self.notify("read-only console: actions are disabled", severity="error")
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
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.call_from_thread(self.notify, f"failed: {text}", severity="error", timeout=8, markup=False)
            return
        self.call_from_thread(self.notify, message, timeout=5, markup=False)
        self.call_from_thread(self.refresh_data)

    def ask_requeue_group(self, status: str, job_type: str, fingerprint: str, error: str | None = None) -> None:
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

    def action_requeue(self) -> None:
        key = self.selected()
        group = self._dead_group(key) if key else None
        if group is not None:
            # A group shown because its jobs' errors match the filter counts only those jobs.
            error = self.needle if self._dead_filtered(group) else None
            self.ask_requeue_group(group.status, group.type, group.fingerprint, error)

    def _running_job(self) -> tuple[int, str] | None:
        key = self.selected()
        if key is None or self.latest is None:
            return None
        job = next((j for j in self.latest.running if str(j.id) == key), None)
        return None if job is None else (job.id, f"job {job.id} ({job.type}) on {job.worker}")

    def action_kill_lease(self) -> None:
        found = self._running_job()
        if found:
            job_id, what = found
            self.confirm_then(
                [f"Kill the lease of {what}?", "It returns to ready now; 1 row will change."],
                changes.kill_lease,
                self.actions_,
                job_id,
            )

    def action_cancel(self) -> None:
        found = self._running_job()
        if found:
            job_id, what = found
            self.confirm_then(
                [f"Cancel {what}? It becomes failed.", "1 row will change."], changes.cancel, self.actions_, job_id
            )

    def _schedule(self) -> Any:
        key = self.selected()
        if key is None or self.latest is None:
            return None
        return next((s for s in self.latest.snapshot.schedules if s.name == key), None)

    def action_pause_schedule(self) -> None:
        schedule = self._schedule()
        if schedule is None:
            return
        name = schedule.name
        if schedule.paused:
            self.confirm_then(
                [
                    f"Resume schedule {name}?",
                    "It fires again from its next slot; the slots that passed while it was paused stay skipped.",
                    "1 row will change.",
                ],
                changes.resume_schedule,
                self.actions_,
                name,
            )
        else:
            self.confirm_then(
                [
                    f"Pause schedule {name}?",
                    f"No {schedule.job_type} job is enqueued for its slots until it is resumed;"
                    " they count as skipped, not missed.",
                    "1 row will change.",
                ],
                changes.pause_schedule,
                self.actions_,
                name,
            )

    def action_run_now(self) -> None:
        schedule = self._schedule()
        if schedule is not None:
            self.confirm_then(
                [f"Run schedule {schedule.name} now?", f"One {schedule.job_type} job will be enqueued."],
                changes.run_schedule_now,
                self.actions_,
                schedule.name,
            )

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
                await self._sleep(0.1)
        self.source.close()
        if self.actions_ is not None:
            self.actions_.close()
        self.exit()

    @staticmethod
    async def _sleep(seconds: float) -> None:
        import asyncio

        await asyncio.sleep(seconds)
