"""The console's header: where it reads, whether the database answers, then the vitals (with
what holds the oldest wait, once it passes the warning age), and what the fleet means for the
queue (a queue no live worker serves, a type no worker handles, more than one version running).

Pure, like the panes' rows: everything comes in as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from jobtui.kernel.safetext import line
from jobtui.reads.causes import Cause
from jobtui.reads.diagnosis import Diagnosis
from jobtui.reads.fleet import Finding
from jobtui.reads.metrics import Snapshot
from jobtui.tui import render
from jobtui.tui.data import Where

SPARK = "▁▂▃▄▅▆▇█"

# A read waiting this long means the database does not answer: the header turns red, with how
# old the figures on screen are, while the read still waits. Red within 3 s of a hang: the
# next read starts within a refresh (1 s), and the header is drawn every quarter second.
HUNG_AFTER = 1.5
ALARM = "bold white on red3"


def banner(*, connected: bool, last_error: str, hung_for: float, stale_for: float | None) -> Text | None:
    """The red line while the database does not answer or cannot be reached; None while it does."""
    old = "no data yet" if stale_for is None else f"data {render.age(stale_for)} old"
    if hung_for >= HUNG_AFTER:
        return Text(f" DATABASE NOT ANSWERING for {render.age(hung_for)} · {old} ", style=ALARM)
    if not connected:
        return Text(f" DATABASE UNREACHABLE · {old} · {line(last_error)} ", style=ALARM)
    return None


def where_line(where: Where | None, read_only: bool, schema: str, refuses: str = "") -> Text:
    """Role, host, port, database and schema, and the read-only states, in that order.

    `refuses` is why the server takes no change ("standby", "read-only server"): the console
    is then read-only by itself, and says so."""
    out = Text()
    out.append(line(where.label() if where is not None else f"schema {schema}"), style=render.STYLE["dim"])
    read_only_server = where is not None and where.server_read_only and not where.standby
    server = refuses or ("read-only server" if read_only_server else "")
    if read_only:
        out.append("  read-only console", style="bold")
        if server:
            out.append(f"  {server}", style=render.STYLE["warn"])
    elif refuses:
        said = "a standby" if refuses == "standby" else "read-only"
        out.append(f"  read-only console (the server is {said})", style=render.STYLE["warn"])
    elif server:
        out.append(f"  {server}", style=render.STYLE["warn"])
    return out


def header(
    snap: Snapshot | None,
    history: Sequence[float],
    thresholds: render.Thresholds,
    *,
    where: Where | None,
    schema: str,
    read_only: bool,
    refuses: str = "",
    connected: bool = True,
    last_error: str = "",
    hung_for: float = 0.0,
    stale_for: float | None = None,
    width: int | None = None,
    fleet: Sequence[Finding] = (),
    cause: Cause | None = None,
) -> Text:
    """The whole header: the red banner when the database does not answer, where the console
    reads, then the figures (none before the first read) with the first cause of the oldest
    wait beside its age, then the fleet's findings (but the one the cause says already)."""
    out = Text()
    alarm = banner(connected=connected, last_error=last_error, hung_for=hung_for, stale_for=stale_for)
    if alarm is not None:
        out.append_text(alarm)
        out.append("\n")
    out.append_text(where_line(where, read_only, schema, refuses))
    if snap is not None:
        out.append("\n")
        out.append_text(vitals(snap, history, thresholds, width=width, why=cause_piece(cause)))
    fleet = [f for f in fleet if not said_by(f, cause)]
    if fleet:
        out.append("\n")
        out.append_text(findings_line(fleet, width))
    return out


def ready_figure(snap: Snapshot) -> str:
    """Due ready jobs, +delayed ones; `~` and rounded when they were too many to count.

    The estimate says so: an operator must not read `~1.2M` as a count.
    """
    due, later = snap.ready_due, snap.ready - snap.ready_due
    if snap.ready_estimate is not None:
        return f"~{render.compact(due)}" + (f"+{render.compact(later)}" if later > 0 else "")
    return f"{due:,}" + (f"+{later:,}" if later > 0 else "")


def sparkline(values: Sequence[float], width: int = 20) -> str:
    """The last `width` values as block characters scaled to their own maximum.

    >>> sparkline([0, 1, 2, 4], width=4)
    '▁▃▅█'
    """
    data = list(values)[-width:]
    if not data:
        return ""
    top = max(data)
    if top <= 0:
        return SPARK[0] * len(data)
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in data)


def vitals(
    snap: Snapshot,
    history: Sequence[float],
    thresholds: render.Thresholds,
    *,
    width: int | None = None,
    why: Text | None = None,
) -> Text:
    """The header: the figures an operator looks at first, coloured by thresholds; `why`,
    what holds the oldest wait, beside its age.

    With a `width`, figures that would overflow the line start a new one (a figure is never
    split from its label), so a narrow terminal shows every figure on a second line.
    """
    t = thresholds
    pieces: list[Text] = []
    if snap.standby:
        # Read on a hot standby: every figure is as old as its replay.
        pieces.append(Text(f" {snap.standby_note} ", style="bold black on yellow"))
    oldest = snap.oldest_ready_age
    parts: list[tuple[str, str, str]] = [
        ("oldest ready", render.age(oldest), t.wait_level(oldest)),
        ("ready", ready_figure(snap), "ok"),
        ("running", f"{snap.running_count:,}", "warn" if snap.expired_leases else "ok"),
        ("dead", f"{snap.dead_count:,}", t.level(snap.dead_count, t.dead_warn, t.dead_crit)),
        ("failed", f"{snap.failed_count:,}", "ok"),
        ("done/min", f"{snap.done_last_minute:,}", "ok"),
        (
            "expiries 1h",
            f"{snap.lease_expiries_last_hour:,}",
            t.level(snap.lease_expiries_last_hour, t.expiries_warn, t.expiries_crit),
        ),
        ("missed slots", f"{snap.missed_slots:,}", t.level(snap.missed_slots, t.missed_warn, t.missed_crit)),
    ]
    ahead = snap.forecast
    if ahead.short:
        # When the due backlog drains, at the pace of the last minutes' flows.
        parts.insert(2, ("backlog", ahead.short, ahead.level))
    if snap.lock_waits:
        # Only while sessions wait: a queue blocked on a lock (a row held by a long
        # transaction, an ALTER TABLE) explains a backlog the other figures only show.
        kinds = " ".join(f"{kind} {n}" for kind, n in snap.lock_waits_by_kind.items() if n)
        # Claims taking turns under a queue's limit are the limit at work: shown, not amber.
        level = "warn" if snap.alarming_lock_waits else "ok"
        parts.append(
            ("lock waits", f"{snap.lock_waits} ({kinds}, longest {render.age(snap.longest_lock_wait)})", level)
        )
    for i, (label, value, level) in enumerate(parts):
        piece = Text()
        piece.append(f"{label} ", style=render.STYLE["dim"])
        piece.append(value, style=render.STYLE[level] or "bold")
        if i == 0 and history:
            piece.append(" " + sparkline(history, 16), style=render.STYLE[level] or "")
        pieces.append(piece)
        if i == 0 and why is not None:
            pieces.append(why)
    return pack(pieces, width)


def pack(pieces: Sequence[Text], width: int | None, gap: int = 2) -> Text:
    """`pieces` separated by `gap` spaces, on as many lines of `width` cells as they need.

    >>> pack([Text("aaa"), Text("bb"), Text("cccc")], width=8).plain
    'aaa  bb\\ncccc'
    """
    out = Text()
    used = 0
    for piece in pieces:
        size = piece.cell_len
        if used and width is not None and used + gap + size > width:
            out.append("\n")
            used = 0
        elif used:
            out.append(" " * gap)
            used += gap
        out.append_text(piece)
        used += size
    return out


# Findings the header names at most; the Workers pane and `jobtui workers` list them all.
FINDINGS_SHOWN = 4


def findings_line(found: Sequence[Finding], width: int | None) -> Text:
    """The first FINDINGS_SHOWN findings in red (a queue or type waiting on nothing) or amber
    (versions), and how many more, packed to the width; every name from the database
    escaped."""
    pieces = [Text(line(f.text), style=render.STYLE[f.level]) for f in found[:FINDINGS_SHOWN]]
    if len(found) > FINDINGS_SHOWN:
        more = len(found) - FINDINGS_SHOWN
        pieces.append(Text(f"and {more} more (jobtui workers)", style=render.STYLE["warn"]))
    return pack(pieces, width, gap=3)


def first_cause(diagnosis: Diagnosis | None, snap: Snapshot | None, thresholds: render.Thresholds) -> Cause | None:
    """The cause the header names: the first of the oldest wait's, once that wait passes the
    warning age."""
    if diagnosis is None or snap is None or (snap.oldest_ready_age or 0.0) < thresholds.oldest_ready_warn:
        return None
    first = diagnosis.first()
    return None if first is None else first[1]


def cause_piece(cause: Cause | None) -> Text | None:
    """`why: no live worker serves queue reports (0)`, in the cause's colour, escaped."""
    if cause is None:
        return None
    piece = Text("why ", style=render.STYLE["dim"])
    piece.append(line(cause.text), style=render.STYLE["crit" if cause.level == "crit" else "warn"])
    piece.append(" (0)", style=render.STYLE["dim"])
    return piece


def said_by(finding: Finding, cause: Cause | None) -> bool:
    """Whether the fleet's finding says what the cause beside the age says already."""
    if cause is None:
        return False
    same = {"no_live_worker": "queue", "workers_quiet": "queue", "no_handler": "type"}.get(cause.cause)
    return same == finding.kind and cause.about == (finding.kind, finding.name)
