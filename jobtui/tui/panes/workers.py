"""9 Workers: the fleet, one line per registered process (reads/fleet.py): its host, version,
state, queues and slots, jobs in flight, executor and memory; lost ones in red with how long
ago they were seen, and the workers holding leases without a live row (a release before the
registry). Enter shows the jobs a worker holds under Running; quiet, resume or stop one, or
every process the filter shows (core/members.py), each asked first."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Label

from jobtui.core.members import LOST_AFTER_REFRESHES, REFRESH, Action, Target, done_word, why_unchanged
from jobtui.kernel.safetext import line
from jobtui.kernel.sizes import size_text
from jobtui.kernel.version import installed_version
from jobtui.reads.fleet import Fleet, Holder, Process, holders
from jobtui.tui import render
from jobtui.tui.console import Change, View
from jobtui.tui.data import Actions
from jobtui.tui.panes.base import TablePane

# What an operator needs first comes first, so that 80 columns show it: which process, where,
# in what state, doing how much, for which queues.
COLUMNS = ["name", "host", "state", "in flight", "queues", "version", "kind", "seen", "up", "memory", "executor",
           "types"]  # fmt: skip
HOLDER = "holder:"  # the key of a lease holder's row, before its name
# Rows drawn at most: a thousand processes, refreshed every second, would cost the console
# most of a core; the filter (by host, version, queue, state) finds the others.
SHOWN = 200


def matches(p: Process, needle: str, queues: Collection[str] = ()) -> bool:
    """Whether the filter shows process `p`: its name, host, kind, version or state holds the
    text, or one of its named queues does, or the text is one of `queues` (the queues known)
    and it serves it (a process serving every queue serves it too)."""
    if not needle:
        return True
    low = needle.lower()
    fields = (p.name, p.host, p.kind, p.version, p.status, *p.queues)
    return any(low in line(f).lower() for f in fields) or (needle in queues and p.serves(needle))


def state_cell(p: Process, times: int = 1) -> Text:
    """running; quiet and stopping in amber; LOST and its age in red (with how many lost rows
    of the name and host it stands for); an order not taken up."""
    if p.lost:
        again = f" ({times} times)" if times > 1 else ""
        return render.styled(f"LOST {render.age(p.seen_ago)} ago{again}", "crit")
    text = render.styled(p.state, "ok" if p.state == "running" else "warn")
    if p.asked is not None:
        text.append(f" ({p.asked} asked)", style=render.STYLE["dim"])
    return text


def seen_cell(p: Process) -> Text | str:
    """When it was last seen: within its interval for a live process refreshing in time (the
    same text refresh after refresh, so the row is not redrawn), late in amber, lost in red."""
    interval = p.lost_after / LOST_AFTER_REFRESHES
    if p.lost:
        return render.styled(f"{render.age(p.seen_ago)} ago", "crit")
    if p.seen_ago <= interval + 1:
        return f"<{math.ceil(interval)}s ago"
    return render.styled(f"{render.age(p.seen_ago)} ago", "warn")


def uptime(seconds: float) -> str:
    """How long it has run, to the minute: `<1m`, `12m`, `3h04m`, `2d03h`.

    >>> uptime(30), uptime(750), uptime(11_040), uptime(183_600)
    ('<1m', '12m', '3h04m', '2d03h')
    """
    minutes = int(seconds // 60)
    if minutes < 1:
        return "<1m"
    if minutes < 60:
        return f"{minutes}m"
    hours = minutes // 60
    return f"{hours}h{minutes % 60:02d}m" if hours < 24 else f"{hours // 24}d{hours % 24:02d}h"


def work_cell(p: Process) -> str:
    if p.kind == "serve":
        return f"{p.in_flight} console{'s' if p.in_flight != 1 else ''}"
    return "-" if not p.claims else f"{p.in_flight}/{p.slots}"


def newest_lost(processes: Iterable[Process]) -> tuple[list[Process], dict[int, int]]:
    """The processes, the lost rows of one name and host shown as one, the last seen of them
    (a worker with a fixed --id that crashes again and again), with how many each stands for."""
    listed = list(processes)
    newest: dict[tuple[str, str], Process] = {}
    times: dict[tuple[str, str], int] = {}
    for p in listed:
        if p.lost:
            key = (p.name, p.host)
            times[key] = times.get(key, 0) + 1
            if key not in newest or p.seen_ago < newest[key].seen_ago:
                newest[key] = p
    chosen = {p.id: times[key] for key, p in newest.items()}
    return [p for p in listed if not p.lost or p.id in chosen], chosen


def process_rows(processes: Sequence[Process], needle: str, queues: Collection[str] = ()) -> list[render.Row]:
    """The processes the filter shows, in the fleet's order (host, name), at most SHOWN of
    them: the lost ones first of all, then the live ones up to SHOWN."""
    rows = []
    shown, times = newest_lost(p for p in processes if matches(p, needle, queues))
    if len(shown) > SHOWN:
        room = SHOWN - sum(1 for p in shown if p.lost)
        kept = {p.id for p in shown if p.lost} | {p.id for p in [q for q in shown if not q.lost][: max(0, room)]}
        shown = [p for p in shown if p.id in kept][:SHOWN]
    for p in shown:
        kind = p.kind + (" +sched" if p.scheduler and p.kind != "scheduler" else "")
        executor = (p.executor or "-") + (f" ({p.children})" if p.children else "")
        rows.append(
            render.row(
                str(p.id),
                [
                    render.styled(p.name, "crit") if p.lost else p.name,
                    p.host,
                    state_cell(p, times.get(p.id, 1)),
                    work_cell(p),
                    p.queues_text() if p.claims else "-",
                    p.version,
                    kind,
                    seen_cell(p),
                    uptime(p.up),
                    size_text(p.rss_bytes),
                    executor,
                    f"{len(p.types)}" if p.claims else "-",
                ],
            )
        )
    return rows


def holder_rows(found: Sequence[Holder], needle: str) -> list[render.Row]:
    """The workers holding leases that never registered (a release before the registry):
    what their leases show. A lost one has its own row already."""
    rows = []
    for h in found:
        if h.lost or (needle and needle.lower() not in line(h.name).lower()):
            continue
        beat = "-" if h.heartbeat_age is None else f"beat {render.age(h.heartbeat_age)} ago"
        expired = render.styled(f"{h.jobs} held, {h.expired} expired", "crit") if h.expired else f"{h.jobs} held"
        state = render.styled("not registered", "warn")
        cells: list[Text | str] = [h.name, "-", state, expired, "-", "older", "worker?", beat, "-", "-", "-", "-"]
        rows.append(render.row(HOLDER + h.name, cells))
    return rows


def known_queues(view: View) -> set[str]:
    """The queues the filter may name: those with jobs, and those a process serves by name."""
    return {q.name for q in view.fetched.queues if q.kind == "queue"} | set(view.fetched.fleet.queues())


def caption(fleet: Fleet, found: Sequence[Holder], shown: int) -> str:
    """How many live and lost, on how many hosts and versions (how many of them shown); that
    workers of an older release show only by their leases."""
    live, lost = fleet.live, fleet.lost
    hosts = len({p.host for p in live})
    versions = len({p.version for p in live})
    text = f"{len(live)} live on {hosts} host{'s' if hosts != 1 else ''}"
    text += f", {versions} version{'s' if versions != 1 else ''}" if live else ""
    lost_names = len({(p.name, p.host) for p in lost})  # a crashing worker's rows count once
    text += f", {lost_names} lost" if lost else ""
    if shown >= SHOWN and shown < len(fleet.processes):
        text += f" · {shown:,} shown: / filters by host, version, queue, state"
    text += " · enter: a worker's jobs"
    unregistered = len([h for h in found if not h.lost])
    older = f"workers before {installed_version()} do not register"
    if unregistered:
        return f"{text} · {unregistered} worker(s) hold leases unregistered ({older})"
    return f"{text} · {older}: they show by their leases"


# -- the changes, run in a worker thread once the operator said yes --------------------------


def order(actions: Actions, action: Action, ids: list[int]) -> str:
    result = actions.order(action, Target(ids=ids))
    said = f"{done_word(action)} {len(result.changed)} process(es)"
    left = result.unchanged
    if left:
        said += "; left as they were: " + ", ".join(f"{m.name} ({why_unchanged(action, m)})" for m in left[:3])
    gone = [m for m in result.matched if not m.live]
    if gone:
        said += f"; {len(gone)} lost meanwhile, not told"
    return said


WHAT = {
    "quiet": "claims no new jobs; its jobs in flight finish",
    "resume": "claims jobs again",
    "stop": "stops as on SIGTERM: its jobs in flight get its shutdown timeout, then go back to ready;"
    " the process exits (whatever supervises it may start it again)",
}


def question(action: Action, chosen: Sequence[Process]) -> list[str]:
    if len(chosen) == 1:
        p = chosen[0]
        head = f"{action.capitalize()} {p.kind} {p.name} on {p.host} ({p.in_flight} in flight)?"
        what = f"It {WHAT[action]}."
    else:
        names = ", ".join(p.name for p in chosen[:4]) + (f" and {len(chosen) - 4} more" if len(chosen) > 4 else "")
        head = f"{action.capitalize()} the {len(chosen)} processes shown: {names}?"
        what = f"Each {WHAT[action]}."
    who = "It reads" if len(chosen) == 1 else "Each reads"
    return [
        head,
        what,
        f"{who} the order at once where it listens, else at its next refresh (within {REFRESH:g}s).",
        f"{len(chosen)} process(es) will change; the order is audited.",
    ]


class WorkersPane(TablePane):
    """Every process of the fleet; p quiets or resumes the selected one, x stops it; P and X
    do the same to every process the filter shows (by host, version, queue, state)."""

    ID = "workers"
    KEY = "9"
    TITLE = "Workers"
    COLUMNS = COLUMNS
    BINDINGS = [
        Change("p", "quiet", "Quiet/resume"),
        Change("x", "stop", "Stop"),
        Change("P", "quiet_shown", "Quiet/resume shown"),
        Change("X", "stop_shown", "Stop shown"),
    ]
    DEFAULT_CSS = "#workers-caption { padding: 0 1; color: $text-muted; }"

    def compose(self) -> ComposeResult:
        yield Label("", id="workers-caption")
        yield self.new_table()

    def rows(self, view: View) -> list[render.Row]:
        fleet = view.fetched.fleet
        found = holders(fleet, view.snapshot.running)
        return process_rows(fleet.processes, view.needle, known_queues(view)) + holder_rows(found, view.needle)

    def show(self, view: View) -> None:
        rows = self.rows(view)
        self.table.sync(rows)
        fleet = view.fetched.fleet
        shown = sum(1 for key, _ in rows if not key.startswith(HOLDER))
        found = holders(fleet, view.snapshot.running)
        self.query_one("#workers-caption", Label).update(Text(line(caption(fleet, found, shown))))

    def _shown(self) -> list[Process]:
        view = self.console.view()
        if view is None:
            return []
        return [p for p in view.fetched.fleet.processes if matches(p, view.needle, known_queues(view))]

    def _selected(self) -> Process | None:
        key = self.selected_key
        return next((p for p in self._shown() if str(p.id) == key), None)

    def action_open(self) -> None:
        """The jobs the selected worker holds, under Running."""
        key = self.selected_key
        if key is None:
            return
        name = key.removeprefix(HOLDER) if key.startswith(HOLDER) else None
        if name is None:
            p = self._selected()
            if p is None or not p.claims:
                self.app.notify("only workers hold jobs: select a worker", severity="warning")
                return
            name = p.name
        from jobtui.tui.panes.running import RunningPane

        self.app.query_one(RunningPane).hold(name)

    def _ask(self, action: Action, chosen: list[Process]) -> None:
        if not chosen:
            self.app.notify(f"no live process to {action} here", severity="warning")
            return
        ids = [p.id for p in chosen]
        self.console.confirm_then(question(action, chosen), order, self.console.actions_, action, ids)

    def action_quiet(self) -> None:
        p = self._selected()
        if p is None or p.lost:
            self.app.notify("select a live process (lost ones read no order)", severity="warning")
            return
        self._ask("resume" if p.state == "quiet" or p.wanted == "quiet" else "quiet", [p])

    def action_stop(self) -> None:
        p = self._selected()
        if p is None or p.lost:
            self.app.notify("select a live process (lost ones read no order)", severity="warning")
            return
        if p.state == "stopping" or p.wanted == "stopping":
            self.app.notify(f"{p.name} is already stopping", severity="warning")
            return
        self._ask("stop", [p])

    def action_quiet_shown(self) -> None:
        live = [p for p in self._shown() if p.live and p.kind != "serve" and p.state != "stopping"]
        running = [p for p in live if p.state == "running" and p.wanted == "running"]
        if running:
            self._ask("quiet", running)
        else:
            self._ask("resume", [p for p in live if p.state == "quiet" or p.wanted == "quiet"])

    def action_stop_shown(self) -> None:
        self._ask("stop", [p for p in self._shown() if p.live and p.state != "stopping" and p.wanted != "stopping"])
