"""Pure rendering of snapshots into the console's rows and vital signs.

No database, no clock: everything comes in as arguments, so panes are testable from plain
data. Each row has a key so the tables update rows in place instead of being rebuilt.
Every cell is text shown as is: escaped (`safetext.line`), never markup (cells are `Text`
or plain strings, which the table shows as `Text`); keys keep the data exact, for queries.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.text import Text

from jobtui.kernel.durations import age_text
from jobtui.kernel.safetext import block, line
from jobtui.reads.joblists import DeadJob, ReadyJob, RunningJob
from jobtui.reads.metrics import DeadGroup, LeaseExpiry, ScheduleHealth, Snapshot, TypeCounts

# Colours readable on both light and dark backgrounds.
STYLE = {"ok": "", "warn": "bold dark_orange", "crit": "bold red3", "dim": "grey50"}
SPARK = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a vital sign turns amber (warn) and red (crit)."""

    oldest_ready_warn: float = 60.0
    oldest_ready_crit: float = 300.0
    dead_warn: int = 1
    dead_crit: int = 100
    expiries_warn: int = 1
    expiries_crit: int = 20
    missed_warn: int = 1
    missed_crit: int = 10

    def level(self, value: float | None, warn: float, crit: float) -> str:
        if value is None or value < warn:
            return "ok"
        return "crit" if value >= crit else "warn"


Row = tuple[str, list[Text | str]]


def age(seconds: float | None) -> str:
    """Seconds as a short duration (`3m12s`), `-` for none.

    >>> age(192.4)
    '3m12s'
    """
    return age_text(seconds)


def compact(n: int) -> str:
    """A count in at most four significant characters, for estimates.

    >>> compact(1_234_567), compact(48_200), compact(950)
    ('1.2M', '48k', '950')
    """
    for size, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def ready_figure(snap: Snapshot) -> str:
    """Due ready jobs, +delayed ones; `~` and rounded when they were too many to count.

    The estimate says so: an operator must not read `~1.2M` as a count.
    """
    due, later = snap.ready_due, snap.ready - snap.ready_due
    if snap.ready_estimate is not None:
        return f"~{compact(due)}" + (f"+{compact(later)}" if later > 0 else "")
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


FINGERPRINT_CELL = 60  # characters of an error fingerprint a dead group's row shows


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, ending in an ellipsis when cut (the whole text is in
    the drill-down's title).

    >>> clip("TimeoutError: upstream <n>", 12)
    'TimeoutErro…'
    """
    return text if len(text) <= limit else text[: limit - 1] + "…"


def styled(text: str, level: str) -> Text:
    return Text(line(text), style=STYLE[level])


def row(key: str, cells: Sequence[Text | str]) -> Row:
    """A table row whose plain-string cells are escaped (`Text` cells are built by `styled`)."""
    return (key, [cell if isinstance(cell, Text) else line(cell) for cell in cells])


def vitals(
    snap: Snapshot,
    history: Sequence[float],
    thresholds: Thresholds,
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
        ("oldest ready", age(oldest), t.level(oldest, t.oldest_ready_warn, t.oldest_ready_crit)),
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
        parts.append(("lock waits", f"{snap.lock_waits} ({kinds}, longest {age(snap.longest_lock_wait)})", level))
    for i, (label, value, level) in enumerate(parts):
        piece = Text()
        piece.append(f"{label} ", style=STYLE["dim"])
        piece.append(value, style=STYLE[level] or "bold")
        if i == 0 and history:
            piece.append(" " + sparkline(history, 16), style=STYLE[level] or "")
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


def _matches(needle: str, *fields: str | None) -> bool:
    """Whether a field holds `needle`, as shown (escaped): what the operator sees is what the
    filter finds, `\\x1b` included."""
    if not needle:
        return True
    lowered = needle.lower()
    return any(f is not None and lowered in line(f).lower() for f in fields)


def attempts_cell(buckets: Mapping[int, int]) -> str:
    """Jobs per number of attempts used, compact: `1:1,180 2:31 3:4`.

    >>> attempts_cell({2: 31, 1: 1180})
    '1:1,180 2:31'
    """
    return " ".join(f"{used}:{jobs:,}" for used, jobs in sorted(buckets.items())) or "-"


def ready_rows(
    by_type: Sequence[TypeCounts],
    needle: str,
    thresholds: Thresholds,
    attempts: Mapping[str, Mapping[int, int]] | None = None,
    estimated: bool = False,
) -> list[Row]:
    """One row per type with ready jobs or jobs done in the last hour: counts, the oldest
    wait, and the attempts the last hour's done jobs used (`attempts`: type -> attempts ->
    jobs, the snapshot's figures, so this costs no query of its own). With `estimated` (too
    many ready jobs to count), the due and delayed figures are marked `~`."""
    attempts = attempts or {}
    mark = "~" if estimated else ""
    counts = {t.type: t for t in by_type}
    # A type whose jobs all ran (none waiting, none dead) is in the done figures only.
    every = sorted(set(counts) | set(attempts))
    rows: list[Row] = []
    for t in (counts.get(name) or TypeCounts(name) for name in every):
        if (t.ready == 0 and not attempts.get(t.type)) or not _matches(needle, t.type):
            continue
        level = thresholds.level(t.oldest_ready_age, thresholds.oldest_ready_warn, thresholds.oldest_ready_crit)
        rows.append(
            row(
                t.type,
                [
                    t.type,
                    f"{mark}{t.ready_due:,}",
                    f"{mark}{t.ready - t.ready_due:,}",
                    styled(age(t.oldest_ready_age), level),
                    f"{t.running:,}",
                    attempts_cell(attempts.get(t.type, {})),
                ],
            )
        )
    return rows


def running_rows(jobs: Sequence[RunningJob], needle: str, elapsed: float = 0.0) -> list[Row]:
    """Running jobs; `elapsed` seconds since the data was read make the countdowns live."""
    rows: list[Row] = []
    for j in jobs:
        if not _matches(needle, j.type, j.worker, str(j.id)):
            continue
        left = j.lease_left - elapsed
        if left < 0:
            lease = styled(f"EXPIRED {age(-left)} ago", "crit")
        else:
            lease = styled(age(left), "warn" if left < 5 else "ok")
        hb = None if j.heartbeat_age is None else j.heartbeat_age + elapsed
        rows.append(
            row(
                str(j.id),
                [
                    str(j.id),
                    j.type,
                    j.worker or "-",
                    f"{j.attempt}/{j.max_attempts}",
                    age(hb),
                    lease,
                    age(None if j.running_for is None else j.running_for + elapsed),
                    str(j.runner) if j.runner is not None else "-",
                ],
            )
        )
    return rows


def dead_key(group: DeadGroup) -> str:
    return f"{group.status}\x1f{group.type}\x1f{group.fingerprint}"


def shown_dead_groups(
    groups: Sequence[DeadGroup], needle: str, matched: Sequence[DeadGroup] | None = None
) -> list[DeadGroup]:
    """The dead groups a filter shows: a group whose type or status holds the text, whole;
    else, when `matched` gives the groups of the jobs whose error matches it (the rows
    `jobtui dead --error` lists, counting only those jobs), those. Without `matched`, the
    text is looked for in the fingerprint too."""
    if not needle:
        return list(groups)
    if matched is None:
        return [g for g in groups if _matches(needle, g.type, g.fingerprint, g.status)]
    whole = [g for g in groups if _matches(needle, g.type, g.status)]
    keys = {dead_key(g) for g in whole}
    return whole + [g for g in matched if dead_key(g) not in keys]


def dead_rows(groups: Sequence[DeadGroup], needle: str, matched: Sequence[DeadGroup] | None = None) -> list[Row]:
    """Dead and failed groups, oldest first: a stable order, so a growing group never moves
    the row under the operator's cursor (press `s` to sort by count). With a filter, the
    groups `shown_dead_groups` gives."""
    rows: list[Row] = []
    shown = shown_dead_groups(groups, needle, matched)
    stable = sorted(shown, key=lambda g: (g.first_seen is None, g.first_seen or 0, dead_key(g)))
    for g in stable:
        rows.append(
            row(
                dead_key(g),
                [
                    styled(g.status, "crit" if g.status == "dead" else "warn"),
                    g.type,
                    f"{g.jobs:,}",
                    g.last_seen.strftime("%m-%d %H:%M:%S") if g.last_seen else "-",
                    clip(line(g.fingerprint), FINGERPRINT_CELL) if g.fingerprint else "-",
                    g.first_seen.strftime("%m-%d %H:%M:%S") if g.first_seen else "-",
                    str(g.latest_job_id),
                ],
            )
        )
    return rows


def expiry_rows(expiries: Sequence[LeaseExpiry], needle: str) -> list[Row]:
    rows: list[Row] = []
    for e in expiries:
        if not _matches(needle, e.type, e.worker, str(e.job_id)):
            continue
        rows.append(
            row(
                f"{e.job_id}\x1f{e.attempt}\x1f{e.reaped_at.isoformat()}",
                [
                    e.reaped_at.strftime("%m-%d %H:%M:%S"),
                    str(e.job_id),
                    e.type,
                    e.worker or "-",
                    str(e.attempt),
                    styled(e.outcome, "crit" if e.outcome == "dead" else "ok"),
                ],
            )
        )
    return rows


def schedule_rows(schedules: Sequence[ScheduleHealth], needle: str, elapsed: float = 0.0) -> list[Row]:
    rows: list[Row] = []
    for s in schedules:
        if not _matches(needle, s.name, s.job_type):
            continue
        left = s.next_in - elapsed
        if s.paused:
            nxt: Text | str = styled("paused", "warn")
        elif left < -5:
            nxt = styled(f"overdue {age(-left)}", "crit")  # no scheduler is running
        else:
            nxt = age(max(0.0, left))
        missed = styled(str(s.missed), "warn" if s.missed else "ok")
        last_missed = s.missed_slots[-1][5:19].replace("T", " ") if s.missed_slots else "-"
        # Of the missed slots, those the policy still ran late.
        backfilled = str(s.backfilled) if s.missed else "-"
        rows.append(
            row(
                s.name,
                [
                    s.name,
                    nxt,
                    missed,
                    last_missed,
                    backfilled,
                    str(s.skipped),
                    s.job_type,
                    s.queue,
                    s.cron,
                    s.last_slot.strftime("%m-%d %H:%M:%S"),
                    "paused" if s.paused else "active",
                ],
            )
        )
    return rows


def log_line(level: int, entry: str) -> Text:
    """A line of the embedded worker's log with its level name coloured (amber, red), escaped
    (a traceback keeps its lines).

    >>> log_line(logging.ERROR, "12:00:01 ERROR job 7 is dead").spans
    [Span(9, 14, 'bold red3')]
    """
    text = Text(block(entry))
    name = logging.getLevelName(level)
    at = text.plain.find(f" {name} ")
    kind = "crit" if level >= logging.ERROR else "warn" if level >= logging.WARNING else "ok"
    if at >= 0 and STYLE[kind]:
        text.stylize(STYLE[kind], at + 1, at + 1 + len(name))
    return text


def ready_job_rows(jobs: Sequence[ReadyJob]) -> list[Row]:
    return [
        row(
            str(j.id),
            [
                str(j.id),
                j.type,
                f"{j.attempts}/{j.max_attempts}",
                age(j.waiting) if j.waiting >= 0 else f"in {age(-j.waiting)}",
                age(j.age),
                j.last_error or "-",
            ],
        )
        for j in jobs
    ]


def dead_job_rows(jobs: Sequence[DeadJob]) -> list[Row]:
    return [
        row(
            str(j.id),
            [
                str(j.id),
                j.type,
                j.status,
                f"{j.attempts}/{j.max_attempts}",
                j.finished_at.strftime("%m-%d %H:%M:%S") if j.finished_at else "-",
                j.worker or "-",
                j.last_error,
            ],
        )
        for j in jobs
    ]


COLUMNS = {
    "ready": ["type", "due", "delayed", "oldest wait", "running", "attempts (done 1h)"],
    "running": ["id", "type", "worker", "attempt", "heartbeat", "lease left", "running for", "runs in"],
    # What an operator needs first comes first, so an 80-column terminal shows it without
    # scrolling: which error, how many, still happening; then the schedules' health.
    "dead": ["status", "type", "jobs", "last seen", "error fingerprint", "first seen", "latest"],
    "expiries": ["reaped", "job", "type", "worker", "attempt", "outcome"],
    "schedules": [
        "name",
        "next",
        "missed",
        "last missed",
        "backfilled",
        "skipped",
        "type",
        "queue",
        "cron",
        "last slot",
        "state",
    ],
    "ready_jobs": ["id", "type", "attempts", "waiting", "age", "last error"],
    "dead_jobs": ["id", "type", "status", "attempts", "finished", "worker", "last error"],
}
