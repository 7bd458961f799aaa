"""Operator commands of the `jobtui` CLI: stats, dead, requeue, kill-lease, cancel, audit,
metrics. Every change an operator makes writes an audit row.

What they print of the queue goes through `DataConsole`, which shows data as text: escaped,
never markup."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from jobtui.cli.args import (
    add_error_option,
    job_id,
    port_number,
    positive_int,
    positive_seconds,
    with_client,
    with_dsn,
)
from jobtui.cli.output import print_json
from jobtui.clients.client import Client
from jobtui.core.jobs import job_statuses_call
from jobtui.kernel.db import connect
from jobtui.kernel.domain import JobStatus
from jobtui.kernel.donehistory import DoneHistory
from jobtui.kernel.durations import duration_text
from jobtui.kernel.errors import InvalidInput, UnknownJob
from jobtui.kernel.forecast import Forecast
from jobtui.kernel.rates import RAMP_TOP, rate_text
from jobtui.kernel.safetext import line
from jobtui.reads.deadletters import check_regex
from jobtui.reads.flows import line_forecasts
from jobtui.reads.joblists import dead_groups
from jobtui.reads.metrics import Snapshot, TypeCounts
from jobtui.reads.overview import QueueLine, read_with_snapshot
from jobtui.reads.timers import watched
from jobtui.tui.render import age


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("stats", help="the queue's health: ages, counts, throughput, dead groups")
    p.add_argument("--json", action="store_true", help="one JSON document for scripts")
    p.add_argument("--watch", type=positive_seconds, nargs="?", const=2.0, help="refresh every N seconds (default 2)")
    p.set_defaults(func=with_dsn(cmd_stats))

    p = sub.add_parser("dead", help="dead and failed jobs grouped by error fingerprint")
    p.add_argument("--type", help="only this job type")
    add_error_option(p, "only jobs whose error matches PATTERN, the same rows as `requeue --error PATTERN`")
    p.add_argument("--json", action="store_true", help="the groups as JSON, each with its job ids")
    p.set_defaults(func=with_dsn(cmd_dead))

    p = sub.add_parser("requeue", help="move dead/failed jobs back to ready")
    p.add_argument("ids", nargs="*", type=job_id, help="job ids")
    p.add_argument("--type", help="every dead/failed job of this type")
    add_error_option(p, "every dead/failed job whose error matches PATTERN, the rows `dead --error PATTERN` lists")
    p.add_argument("--all", action="store_true", help="every dead/failed job")
    p.add_argument("--dry-run", action="store_true", help="count, change nothing")
    p.set_defaults(func=with_client(cmd_requeue))

    p = sub.add_parser("kill-lease", help="return running jobs to ready now")
    p.add_argument("ids", nargs="+", type=job_id)
    p.set_defaults(func=with_client(cmd_kill_lease))

    p = sub.add_parser("cancel", help="mark ready or running jobs failed")
    p.add_argument("ids", nargs="+", type=job_id)
    p.set_defaults(func=with_client(cmd_cancel))

    p = sub.add_parser("audit", help="operator actions, newest first")
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=with_client(cmd_audit))

    p = sub.add_parser("metrics", help="serve Prometheus metrics")
    p.add_argument("--port", type=port_number, required=True)
    p.add_argument("--addr", help="the address to listen on, e.g. 127.0.0.1 (default: every address)")
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="answer only requests with `Authorization: Bearer TOKEN`, TOKEN read from PATH",
    )
    p.set_defaults(func=with_dsn(cmd_metrics))


class DataConsole(Console):
    """A rich Console for the queue's data, which is text, whatever it holds.

    Markup, emoji codes and highlighting are off, and every string it renders (a table cell,
    a title, a printed line) is escaped as one line (`safetext.line`): `[bold red]` or
    `[link=...]` in an error prints as written, `[/]` cannot break it, an escape sequence
    cannot reach the terminal. Styles come only from `Text` objects built by jobtui.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, emoji=False, highlight=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(line(text), **kwargs)


def _figures(*figures: tuple[str, object]) -> Text:
    """`label value` pairs on one line, the labels bold."""
    out = Text()
    for label, value in figures:
        out.append(label, style="bold").append(f" {value}   ")
    return out


def render_stats(snap: Snapshot, console: Console) -> None:
    """People's view of a snapshot: vital signs, then per type, dead groups, schedules."""
    if snap.standby:
        console.print(Text(f"{snap.standby_note}: the figures are the primary's as replayed here", style="bold"))
    header = _figures(
        ("oldest ready", age(snap.oldest_ready_age)),
        ("ready", f"{estimated(snap, str(snap.ready))} ({estimated(snap, str(snap.ready_due))} due)"),
        ("running", snap.running_count),
        ("dead", snap.dead_count),
        ("failed", snap.failed_count),
        ("done/min", snap.done_last_minute),
        ("lease expiries 1h", snap.lease_expiries_last_hour),
        ("missed slots", snap.missed_slots),
        ("backlog", snap.forecast.text),
    )
    console.print(header.append(f"done ≈ {snap.done_estimate} (estimate)", style="dim"))
    types = Table("type", "ready", "due", "oldest ready", "running", "dead", "failed", title="Jobs by type")
    for t in snap.by_type:
        types.add_row(
            t.type,
            estimated(snap, str(t.ready)),
            estimated(snap, str(t.ready_due)),
            type_age(snap, t),
            str(t.running),
            str(t.dead),
            str(t.failed),
        )
    console.print(types)
    if snap.ready_estimate is not None:
        console.print(f"~ estimated: too many ready jobs to count on every read; from {snap.ready_estimate.source}")
    if snap.running:
        running = Table("type", "worker", "jobs", "expired leases", "oldest heartbeat", title="Running")
        for g in snap.running:
            running.add_row(g.type, g.worker or "-", str(g.jobs), str(g.expired), age(g.oldest_heartbeat_age))
        console.print(running)
    if snap.dead:
        render_dead(snap, console)
    hour = snap.attempts_last_hour.get("done", {})
    if hour:
        dist = ", ".join(f"{a}: {n}" for a, n in sorted(hour.items()))
        console.print(f"attempts used by jobs done in the last hour: {dist}")
    render_attempts(snap, console)
    if snap.schedules:
        sched = Table(
            "schedule", "type", "cron", "next in", "missed", "backfilled", "skipped", "state", title="Schedules"
        )
        for s in snap.schedules:
            overdue = f"overdue {age(-s.next_in)}"
            nxt = "-" if s.paused else (age(s.next_in) if s.next_in >= 0 else overdue)
            sched.add_row(
                s.name,
                s.job_type,
                s.cron,
                nxt,
                str(s.missed),
                str(s.backfilled),
                str(s.skipped),
                "paused" if s.paused else "active",
            )
        console.print(sched)
    tables = " · ".join(
        f"{t.table}: {t.live_rows} live / {t.dead_rows} dead tuples{_kept(snap, t.table)}"
        for t in snap.tables
        if t.table in HEALTH_TABLES
    )
    console.print(
        Text(
            f"lock waits {lock_waits_text(snap)} · oldest transaction {age(snap.oldest_xact_age)} · {tables}",
            style="dim",
        )
    )


def estimated(snap: Snapshot, text: str) -> str:
    """A ready figure of `stats`, marked `~` when the ready jobs were too many to count."""
    return text if snap.ready_estimate is None else f"~{text}"


def type_age(snap: Snapshot, t: TypeCounts) -> str:
    """A type's oldest ready age for `stats`: counted, or above the cap the archiver's (`~`,
    as old as its minute row), `?` when not known for a type with ready jobs."""
    if snap.ready_estimate is None:
        return age(t.oldest_ready_age)
    if t.oldest_ready_age is None:
        return "?" if t.ready else "-"
    return f"~{age(t.oldest_ready_age)}"


# The tables whose health `jobtui stats` shows: the queue, and those the archiver prunes
# besides it, which grow with every effect, every operator action and every keyed job.
HEALTH_TABLES = ("job", "effect", "audit", "job_key")


def _kept(snap: Snapshot, table: str) -> str:
    """What a table of `stats` keeps, where it is a window: job_key's keys."""
    if table != "job_key":
        return ""
    return f" (keys kept {duration_text(snap.key_retention)} after their jobs finish)"


def attempts_text(buckets: dict[int, int]) -> str:
    """A distribution of attempts used, as `jobtui stats` and the console show it.

    >>> attempts_text({1: 1180, 2: 31, 3: 4})
    '1: 1,180, 2: 31, 3: 4'
    """
    return ", ".join(f"{used}: {jobs:,}" for used, jobs in sorted(buckets.items())) or "-"


def render_attempts(snap: Snapshot, console: Console) -> None:
    """Jobs finished in the last hour by type and attempts used (what Prometheus exports)."""
    done = snap.attempts_by_type.get("done", {})
    dead = snap.attempts_by_type.get("dead_or_failed", {})
    if not done and not dead:
        return
    table = Table("type", "done", "dead or failed", title="Attempts used by jobs finished in the last hour")
    for job_type in sorted(set(done) | set(dead)):
        table.add_row(job_type, attempts_text(done.get(job_type, {})), attempts_text(dead.get(job_type, {})))
    console.print(table)


def lock_waits_text(snap: Snapshot) -> str:
    """The lock waits and their kinds: `2 (transactionid 1, tuple 1; longest 2.5s)`."""
    if not snap.lock_waits:
        return "0"
    kinds = ", ".join(f"{kind} {n}" for kind, n in snap.lock_waits_by_kind.items() if n)
    return f"{snap.lock_waits} ({kinds}; longest {snap.longest_lock_wait:.1f}s)"


def render_dead(snap: Snapshot | None, console: Console, groups: list[Any] | None = None) -> None:
    table = Table(
        "status", "type", "jobs", "error fingerprint", "first seen", "last seen", "latest job", title="Dead and failed"
    )
    for g in groups if groups is not None else (snap.dead if snap else []):
        table.add_row(
            g.status,
            g.type,
            str(g.jobs),
            g.fingerprint,
            g.first_seen.isoformat(timespec="seconds") if g.first_seen else "-",
            g.last_seen.isoformat(timespec="seconds") if g.last_seen else "-",
            str(g.latest_job_id),
        )
    console.print(table)


def wide_console() -> Console:
    """A console for data that does not squeeze tables to 80 columns when piped or logged
    (unless COLUMNS says how wide)."""
    console = DataConsole()
    return console if console.is_terminal or os.environ.get("COLUMNS", "").isdigit() else DataConsole(width=160)


def estimate_mark(q: QueueLine, field: str, text: str) -> str:
    """`text` marked `~` when the line's `field` is an estimate (`?` for an age not known)."""
    if field not in q.estimated:
        return text
    return "?" if text == "-" else f"~{text}"


def queue_table(lines: list[QueueLine], forecasts: dict[tuple[str, str], Forecast] | None = None) -> Table:
    """Each queue and job type: ready, due, running, limit, rate, pause, oldest wait, done/min,
    and with `forecasts` when its due backlog drains."""
    table = Table("kind", "name", "ready", "due", "running", "limit", "rate", "paused", "oldest ready", "done/min",
                  title="Queues and job types")  # fmt: skip
    if forecasts is not None:
        table.add_column("forecast")
    for q in lines:
        more = [] if forecasts is None else [forecasts[(q.kind, q.name)].text]
        table.add_row(
            q.kind,
            q.name,
            estimate_mark(q, "ready", str(q.ready)),
            estimate_mark(q, "due", str(q.due)),
            str(q.running),
            "-" if q.max_running is None else str(q.max_running),
            rate_cell(q),
            f"by {q.paused_by}" if q.paused else "-",
            estimate_mark(q, "oldest_age", age(q.oldest_age)),
            estimate_mark(q, "done_last_minute", str(q.done_last_minute)),
            *more,
        )
    return table


def rate_cell(q: QueueLine) -> str:
    """`20/s`, `3.2/s ramping to 20/s until 12:00:30` (UTC), or `-` without a rate."""
    if q.ramp_until is not None:
        return f"{rate_text(q.rate_now)} ramping to {rate_text(q.rate or RAMP_TOP)} until {q.ramp_until:%H:%M:%S}"
    return "-" if q.rate is None else rate_text(q.rate)


def queue_json(
    lines: list[QueueLine], forecasts: dict[tuple[str, str], Forecast] | None = None
) -> list[dict[str, Any]]:
    from dataclasses import asdict

    out = [{**asdict(q), "paused": q.paused, "ramping": q.ramping} for q in lines]
    if forecasts is not None:
        for q, data in zip(lines, out, strict=True):
            data["forecast"] = forecasts[(q.kind, q.name)].to_json()
    return out


def cmd_stats(args: argparse.Namespace, dsn: str) -> int:
    console = wide_console()
    history = DoneHistory()
    while True:
        with watched(connect(dsn, autocommit=True, pooler=args.pooler), args.schema) as conn:
            view, snap = read_with_snapshot(conn, args.schema, history=history)
            lines = view.lines
        forecasts = line_forecasts(lines, snap.flows)
        if args.json:
            print_json({**snap.to_json(), "queues": queue_json(lines, forecasts)})
        else:
            if args.watch:
                console.clear()
            render_stats(snap, console)
            # Only when there is more than the one default queue, or a lever is pulled.
            if any(_lever_pulled(q) for q in lines):
                shown = [q for q in lines if q.kind == "queue" or q.paused or q.rate_now is not None]
                console.print(queue_table(shown, forecasts))
        if not args.watch:
            return 0
        time.sleep(args.watch)


def _lever_pulled(q: QueueLine) -> bool:
    """Whether `stats` shows the queues: more than the one default queue, or a lever pulled."""
    levers = q.paused or q.max_running is not None or q.rate_now is not None
    return levers or (q.kind == "queue" and q.name != "default")


def cmd_dead(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        check_regex(conn, args.error, args.schema)
        # The rows `requeue --type --error` would move, grouped; with their ids for scripts.
        groups = dead_groups(conn, args.schema, job_type=args.type, error=args.error, with_ids=args.json)
    if args.json:
        from dataclasses import asdict

        print_json([asdict(g) for g in groups])
    elif groups:
        render_dead(None, wide_console(), groups)
        print(f"{sum(g.jobs for g in groups)} job(s) in {len(groups)} group(s)")
    else:
        print("no dead or failed jobs match")
    return 0


def _check_ids(client: Client, ids: list[int], wanted: tuple[str, ...], verb: str) -> list[int]:
    """The ids, when every one is in a state `verb` applies to; an unknown id, or one in
    another state, is a user mistake: one line, exit 2, nothing changed (as for requeue,
    kill-lease and cancel alike)."""
    statuses = client.run(job_statuses_call(ids))
    missing = [i for i in ids if i not in statuses]
    if missing:
        raise UnknownJob(f"no job with id {', '.join(map(str, missing))}; nothing was changed")
    wrong = [i for i in dict.fromkeys(ids) if statuses[i].value not in wanted]
    if wrong:
        raise InvalidInput(wrong_state(wrong, {i: statuses[i].value for i in wrong}, wanted, verb, len(set(ids))))
    return ids


def wrong_state(wrong: list[int], states: dict[int, str], wanted: tuple[str, ...], verb: str, given: int) -> str:
    """Why a command on job ids changed nothing, in one line.

    >>> wrong_state([12], {12: "ready"}, ("running",), "kill", 1)
    'job 12 is ready, not running: nothing to kill'
    >>> wrong_state([3, 4], {3: "ready", 4: "done"}, ("dead", "failed"), "requeue", 3)
    'jobs 3 (ready) and 4 (done) are not dead or failed: nothing was changed; give only dead or failed jobs'
    """
    allowed = " or ".join(wanted)
    if len(wrong) == 1:
        said = f"job {wrong[0]} is {states[wrong[0]]}, not {allowed}"
    else:
        listed = [f"{i} ({states[i]})" for i in wrong]
        said = f"jobs {', '.join(listed[:-1])} and {listed[-1]} are not {allowed}"
    if len(wrong) == given:
        return f"{said}: nothing to {verb}"
    return f"{said}: nothing was changed; give only {allowed} jobs"


def cmd_requeue(args: argparse.Namespace, client: Client) -> int:
    by_match = bool(args.type) or args.error is not None or args.all
    if args.ids and by_match:
        raise InvalidInput("give job ids, or --type/--error/--all, not both")
    if args.ids:
        ids = _check_ids(client, args.ids, ("dead", "failed"), "requeue")
        moved = client.requeue(ids, actor=args.actor)
        print(f"requeued {len(moved)} job(s){_left(ids, moved, 'dead or failed')}")
        return 0
    if not by_match:
        raise InvalidInput("say which jobs: ids, --type T, --error PATTERN, or --all for every dead/failed job")
    if args.dry_run:
        # A dry run is audited, except under --read-only, which writes nothing (and works with
        # the read-only role).
        actor = None if args.read_only else args.actor
        ids = client.requeueable(job_type=args.type, error=args.error, actor=actor)
        print(f"would requeue {len(ids)} job(s){id_list(ids)} (dry run, nothing changed)")
        return 0
    moved = client.requeue_matching(job_type=args.type, error=args.error, actor=args.actor)
    print(f"requeued {len(moved)} job(s)")
    return 0


def id_list(ids: list[int], shown: int = 50) -> str:
    """`: 12, 15` for a message, the first `shown` ids and how many more.

    >>> id_list([3, 4]), id_list([]), id_list(list(range(1, 6)), shown=2)
    (': 3, 4', '', ': 1, 2 and 3 more')
    """
    if not ids:
        return ""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ": " + ", ".join(map(str, ids[:shown])) + more


def cmd_kill_lease(args: argparse.Namespace, client: Client) -> int:
    ids = _check_ids(client, args.ids, ("running",), "kill")
    killed = client.kill_lease(ids, actor=args.actor)
    after = client.run(job_statuses_call(ids))
    dead = [i for i in killed if after.get(i) is JobStatus.DEAD]
    # Still running and not killed: its handler is inside job.once()'s transaction, which
    # holds the row until the effect commits (see the kill_lease statement).
    busy = [i for i in ids if i not in killed and after.get(i) is JobStatus.RUNNING]
    said = f"killed {len(killed)} lease(s): {len(killed) - len(dead)} ready again"
    said += f", {len(dead)} dead (it was their last attempt: {', '.join(map(str, dead))})" if dead else ""
    if busy:
        said += f"; job(s) {', '.join(map(str, busy))} are committing an effect: try again in a moment"
    gone = [i for i in ids if i not in killed and i not in busy]
    print(said + _left(gone, [], "running"))
    return 1 if busy and not killed else 0


def cmd_cancel(args: argparse.Namespace, client: Client) -> int:
    ids = _check_ids(client, args.ids, ("ready", "running"), "cancel")
    cancelled = client.cancel(ids, actor=args.actor)
    print(f"cancelled {len(cancelled)} job(s){_left(ids, cancelled, 'ready or running')}")
    return 0


def _left(asked: list[int], done: list[int], state: str) -> str:
    """What changed state between the check and the change (a worker finished the job)."""
    gone = sorted(set(asked) - set(done))
    return f"; job(s) {', '.join(map(str, gone))} were no longer {state}" if gone else ""


def cmd_audit(args: argparse.Namespace, client: Client) -> int:
    entries = client.audit(args.limit)
    if args.json:
        from dataclasses import asdict

        print_json([asdict(e) for e in entries])
        return 0
    table = Table("when", "who", "action", "target", "rows", title="Operator actions (newest first)")
    for e in entries:
        table.add_row(e.at.isoformat(timespec="seconds"), e.actor, e.action, e.target or "-", str(e.rows))
    wide_console().print(table)
    return 0


def cmd_metrics(args: argparse.Namespace, dsn: str) -> int:
    from jobtui.service.endpoints import describe, read_token
    from jobtui.service.prometheus import serve

    token = read_token(args.token_file) if args.token_file else None
    server = serve(
        dsn, args.port, args.schema, args.addr, token=token, fix="choose another --port or --addr", pooler=args.pooler
    )
    print(f"{describe(server)} (Ctrl-C to stop)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
