"""7 Queues: each queue and job type with its ready, running, limit, rate, pause, oldest wait
and drain forecast; pause or resume one on every worker (or resume it with a ramp), set a
queue's global limit, or a queue's or type's rate; 0 says what holds the selected one."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from jobtui.core import queues
from jobtui.kernel.db import connect
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.forecast import Forecast
from jobtui.kernel.rates import RAMP_TOP, parse_rate, ramp_rate, rate_text
from jobtui.kernel.safetext import line
from jobtui.reads.flows import line_forecasts
from jobtui.reads.overview import QueueLine
from jobtui.tui import render
from jobtui.tui.console import Change, View
from jobtui.tui.data import Actions
from jobtui.tui.panes.base import TablePane
from jobtui.tui.widgets import SubmitBox

T = TypeVar("T")

# The forecast next to the counts it is about; the levers after the figures.
COLUMNS = ["kind", "name", "ready", "due", "running", "forecast", "oldest ready", "done/min", "limit", "rate", "paused"]


def rate_cell(q: QueueLine) -> str:
    """`20/s`, `3.2/s → 20/s` while a ramp rises, `-` without a rate."""
    if q.ramping:
        top = q.rate or RAMP_TOP
        return f"{rate_text(q.rate_now)} → {rate_text(top) if top < 1000 else render.compact(round(top)) + '/s'}"
    return "-" if q.rate is None else rate_text(q.rate)


def key_of(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def marked(q: QueueLine, field: str, text: str) -> str:
    """`text`, with `~` when the field is an estimate (a backlog too big to count on every read)."""
    return f"~{text}" if field in q.estimated else text


def queue_rows(
    lines: Sequence[QueueLine],
    needle: str,
    thresholds: render.Thresholds,
    forecasts: Mapping[tuple[str, str], Forecast] | None = None,
    done_read: bool = True,
) -> list[render.Row]:
    """Queues first, then types; a paused one says so in amber, a limit that is reached in
    red, a ramp in amber, a backlog that grows in amber and one that is stalled in red;
    estimates start with `~`. Without `done_read` (lines read while the pane was closed, shown
    until the read it makes when opened), the done column says `…`."""
    rows: list[render.Row] = []
    for q in lines:
        ahead = (forecasts or {}).get((q.kind, q.name))
        if needle and needle.lower() not in q.name.lower():
            continue
        level = thresholds.wait_level(q.oldest_age)
        full = q.max_running is not None and q.running >= q.max_running
        oldest = "?" if q.oldest_age is None and "oldest_age" in q.estimated else "-"
        rows.append(
            render.row(
                key_of(q.kind, q.name),
                [
                    q.kind,
                    q.name,
                    marked(q, "ready", f"{q.ready:,}"),
                    marked(q, "due", f"{q.due:,}"),
                    render.styled(f"{q.running:,}", "crit") if full else f"{q.running:,}",
                    render.styled(ahead.short, ahead.level) if ahead is not None and ahead.short else "-",
                    render.styled(marked(q, "oldest_age", render.age(q.oldest_age)), level)
                    if q.oldest_age is not None
                    else oldest,
                    marked(q, "done_last_minute", f"{q.done_last_minute:,}") if done_read else "…",
                    "-" if q.max_running is None else f"{q.max_running:,}",
                    render.styled(rate_cell(q), "warn") if q.ramping else rate_cell(q),
                    render.styled(f"by {q.paused_by}", "warn") if q.paused else "-",
                ],
            )
        )
    return rows


# -- the changes, run in a worker thread once the operator said yes --------------------------


def pause(actions: Actions, kind: queues.Kind, name: str) -> str:
    with connect(actions.dsn, autocommit=True, pooler=actions.pooler) as conn:
        changed = queues.pause(conn, kind, name, actor=actions.actor, schema=actions.schema)
    return f"{kind} {name} " + ("paused on every worker" if changed else "was already paused")


def resume(actions: Actions, kind: queues.Kind, name: str) -> str:
    with connect(actions.dsn, autocommit=True, pooler=actions.pooler) as conn:
        changed = queues.resume(conn, kind, name, actor=actions.actor, schema=actions.schema)
    return f"{kind} {name} " + ("resumed" if changed else "was not paused")


def set_limit(actions: Actions, name: str, limit: int | None, seen: int | None) -> str:
    with connect(actions.dsn, autocommit=True, pooler=actions.pooler) as conn:
        change = queues.set_limit(
            conn, name, limit, actor=actions.actor, expected=seen, fenced=True, schema=actions.schema
        )
    was = "none" if change.was is None else str(change.was)
    if not change.changed:
        return f"queue {name}: its limit changed to {was} meanwhile; nothing changed (look again)"
    return f"queue {name}: limit {'none' if limit is None else limit} (was {was})"


def parse_limit(text: str) -> int | None:
    """What the limit box holds: a number of jobs, or empty / none for no limit."""
    text = text.strip().lower()
    if text in ("", "none", "off"):
        return None
    try:
        return queues.check_limit(int(text))
    except ValueError:
        raise InvalidInput(f"{line(text)!r} is not a number of jobs: type one, or none") from None


class LimitScreen(ModalScreen[str | None]):
    """Asks for a queue's new limit; returns the text typed, None when dismissed."""

    BINDINGS = [Binding("escape", "dismiss_none", "Back", show=False)]
    DEFAULT_CSS = """
    LimitScreen { align: center middle; }
    #limit-dialog { width: 64; max-width: 95%; height: auto; border: thick $warning; background: $surface;
                    padding: 1 2; }
    """

    def __init__(self, name: str, current: int | None) -> None:
        super().__init__()
        self.queue_name = name
        self.current = current

    def compose(self) -> ComposeResult:
        now = "none" if self.current is None else str(self.current)
        with Vertical(id="limit-dialog"):
            yield Label(Text(line(f"Jobs of queue {self.queue_name} running at once, across every worker (now {now})")))
            yield Label(Text("A number (0 holds the queue), or none; enter, then confirm."))
            yield SubmitBox(value="" if self.current is None else str(self.current), id="limit-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


def set_rate(actions: Actions, kind: queues.Kind, name: str, rate: float | None, seen: float | None) -> str:
    with connect(actions.dsn, autocommit=True, pooler=actions.pooler) as conn:
        change = queues.set_rate(
            conn, kind, name, rate, actor=actions.actor, expected=seen, fenced=True, schema=actions.schema
        )
    if not change.changed:
        return f"{kind} {name}: its rate changed to {rate_text(change.was)} meanwhile; nothing changed (look again)"
    return f"{kind} {name}: rate {rate_text(rate)} (was {rate_text(seen)})"


def resume_ramped(actions: Actions, kind: queues.Kind, name: str, ramp: float) -> str:
    with connect(actions.dsn, autocommit=True, pooler=actions.pooler) as conn:
        changed = queues.resume(conn, kind, name, actor=actions.actor, ramp=ramp, schema=actions.schema)
    return f"{kind} {name} " + (f"resumed, its rate rising over {ramp:g}s" if changed else "was not paused")


def parse_rate_box(text: str) -> float | None:
    """What the rate box holds: `20/s`, `1200/min`, or empty / none for no rate."""
    return None if not text.strip() else parse_rate(text)


class ValueScreen(ModalScreen[str | None]):
    """Asks for one value (a rate, a ramp); returns the text typed, None when dismissed."""

    BINDINGS = [Binding("escape", "dismiss_none", "Back", show=False)]
    DEFAULT_CSS = """
    ValueScreen { align: center middle; }
    #value-dialog { width: 64; max-width: 95%; height: auto; border: thick $warning; background: $surface;
                    padding: 1 2; }
    #value-dialog Label { width: 100%; }
    """

    def __init__(self, lines: list[str], value: str) -> None:
        super().__init__()
        self.lines = lines
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(id="value-dialog"):
            for text in self.lines:
                yield Label(Text(line(text)))
            yield SubmitBox(value=self.value, id="value-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class QueuesPane(TablePane):
    """The fleet-wide levers: opened from the Ready pane, the cursor is on the type selected there."""

    ID = "queues"
    KEY = "7"
    TITLE = "Queues"
    COLUMNS = COLUMNS
    BINDINGS = [
        Change("p", "pause_queue", "Pause/resume"),
        Change("u", "ramp", "Resume with ramp"),
        Change("l", "limit", "Limit"),
        Change("t", "rate", "Rate"),
        Binding("0", "why", "Why"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.chosen: str | None = None  # a line to select once it is read (a `queue:NAME` link, the Why pane)
        self._kept: str | None = None  # the line chosen so, which the switch to this pane keeps

    def aim(self, kind: str, name: str) -> None:
        """Select the line of queue or type `name` once it is read."""
        self.chosen = key_of(kind, name)

    def show(self, view: View) -> None:
        super().show(view)
        chosen = self.chosen
        if chosen is not None and any(key_of(q.kind, q.name) == chosen for q in view.fetched.queues):
            self.chosen, self._kept = None, chosen
            keys = [str(r.key.value) for r in self.table.ordered_rows]
            if chosen in keys:
                self.table.move_cursor(row=keys.index(chosen), animate=False)

    def rows(self, view: View) -> list[render.Row]:
        lines = view.fetched.queues
        forecasts = line_forecasts(lines, view.snapshot.flows)
        return queue_rows(lines, view.needle, view.thresholds, forecasts, view.fetched.queues_done)

    def focus_default(self) -> None:
        super().focus_default()
        # From the Ready pane, its selected type is one key away: p pauses it, y confirms.
        from jobtui.tui.panes.ready import ReadyPane

        chosen = self.app.query_one(ReadyPane).selected_key
        kept, self._kept = self._kept, None
        if chosen is not None and self.chosen is None and kept is None:
            self.select(key_of("type", chosen))

    def select(self, key: str) -> None:
        view = self.console.view()
        if view is None:
            return
        self.show(view)
        keys = [str(r.key.value) for r in self.table.ordered_rows]  # as shown, sorted or not
        if key in keys:
            self.table.move_cursor(row=keys.index(key), animate=False)

    def _line(self) -> QueueLine | None:
        key = self.selected_key
        view = self.console.view()
        if key is None or view is None:
            return None
        return next((q for q in view.fetched.queues if key_of(q.kind, q.name) == key), None)

    def action_why(self) -> None:
        """What holds the selected queue or type (the Why pane, on it alone)."""
        q = self._line()
        if q is None:
            self.goto("why")
        else:
            self.goto("why", q.kind, q.name)

    def action_pause_queue(self) -> None:
        q = self._line()
        if q is None:
            return
        what = f"{q.kind} {q.name}"
        if q.paused:
            self.console.confirm_then(
                [f"Resume {what}?", f"Every worker claims its {q.ready:,} ready job(s) again.", "1 row will change."],
                resume,
                self.console.actions_,
                q.kind,
                q.name,
            )
        else:
            self.console.confirm_then(
                [
                    f"Pause {what} on every worker?",
                    f"Its {q.running:,} running job(s) finish; its {q.ready:,} ready job(s) wait, and the oldest"
                    " wait keeps growing.",
                    "1 row will change.",
                ],
                pause,
                self.console.actions_,
                q.kind,
                q.name,
            )

    def _ask_value(self, screen: ModalScreen[str | None], parse: Callable[[str], T], then: Callable[[T], None]) -> None:
        """Push `screen`; the text typed in it, once `parse` takes it, goes to `then`. A value
        it refuses is said, and nothing is asked."""

        def typed(text: str | None) -> None:
            if text is None:
                return
            try:
                value = parse(text)
            except InvalidInput as exc:
                self.app.notify(str(exc), severity="error")
                return
            then(value)

        self.app.push_screen(screen, typed)

    def action_limit(self) -> None:
        q = self._line()
        if q is None:
            return
        if q.kind != "queue":
            self.app.notify("limits are per queue: select a queue's row", severity="warning")
            return
        name, seen = q.name, q.max_running
        self._ask_value(LimitScreen(name, seen), parse_limit, lambda limit: self._ask_limit(name, limit, seen))

    def _ask_limit(self, name: str, limit: int | None, seen: int | None) -> None:
        says = "no limit" if limit is None else f"at most {limit:,} running at once across every worker"
        question: list[Any] = [
            f"Set the limit of queue {name} to {says}?",
            f"It was {'none' if seen is None else seen}; every worker holds to it from its next claim.",
            "1 row will change.",
        ]
        self.console.confirm_then(question, set_limit, self.console.actions_, name, limit, seen)

    def action_rate(self) -> None:
        q = self._line()
        if q is None:
            return
        kind, name, seen = q.kind, q.name, q.rate

        def ask(rate: float | None) -> None:
            says = "no rate" if rate is None else f"at most {rate_text(rate)} claimed, across every worker"
            question: list[Any] = [
                f"Set the rate of {kind} {name} to {says}?",
                f"It was {rate_text(seen)}; every worker holds to it from its next claim.",
                "1 row will change.",
            ]
            self.console.confirm_then(question, set_rate, self.console.actions_, kind, name, rate, seen)

        lines = [f"Jobs of {kind} {name} claimed at most, across every worker (now {rate_text(seen)})",
                 "Like 20/s, 1200/min or 30/h, or none; enter, then confirm."]  # fmt: skip
        self._ask_value(ValueScreen(lines, "" if seen is None else rate_text(seen)), parse_rate_box, ask)

    def action_ramp(self) -> None:
        q = self._line()
        if q is None:
            return
        if not q.paused:
            self.app.notify(
                f"{q.kind} {q.name} is not paused: a ramp lets a paused backlog back in", severity="warning"
            )
            return
        kind, name, ready = q.kind, q.name, q.ready
        top = rate_text(q.rate or RAMP_TOP)
        # A ramp starts at 1/s, or at the rate when that is lower: then it has nothing to rise by.
        flat = ramp_rate(q.rate, 0.0) >= (q.rate or RAMP_TOP)
        rises = (
            f"come back at {top} from the start: a rate of 1/s or less does not rise"
            if flat
            else f"come back at 1/s, rising tenfold in equal steps to {top}"
        )

        def ask(ramp: float | None) -> None:
            assert ramp is not None
            question: list[Any] = [
                f"Resume {kind} {name} with a ramp of {ramp:g}s?",
                f"Its {ready:,} ready job(s) {rises}.",
                "1 row will change.",
            ]
            self.console.confirm_then(question, resume_ramped, self.console.actions_, kind, name, ramp)

        lines = [
            f"Resume {kind} {name}: how long its rate rises, from 1/s to {top}"
            if not flat
            else f"Resume {kind} {name} with a ramp: its rate of {top} holds from the start",
            "Like 60s or 5m; enter, then confirm.",
        ]
        self._ask_value(ValueScreen(lines, "60s"), lambda text: queues.check_ramp(parse_duration(text)), ask)
