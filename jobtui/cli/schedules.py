"""`jobtui schedule add|list|pause|resume|remove|run-now`: the cron schedules of
jobtui/core/scheduler.py from the shell; each change is audited."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from jobtui.cli import ops
from jobtui.cli.args import database_dsn, parse_payload, positive_int
from jobtui.cli.output import print_json
from jobtui.core.registry import ScheduleSpec, load_app
from jobtui.kernel import migrate as migrations
from jobtui.kernel.db import connect
from jobtui.kernel.domain import DEFAULT_QUEUE
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.safetext import quote


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("schedule", help="manage cron schedules")
    ssub = p.add_subparsers(dest="schedule_action", metavar="ACTION", required=True)
    a = ssub.add_parser("add", help="create or update a schedule")
    a.add_argument("name")
    a.add_argument("--cron", required=True, help="5 fields, or 6 with seconds first")
    a.add_argument("--type", required=True, help="job type to enqueue")
    a.add_argument("--payload", default="{}")
    a.add_argument("--timezone", default="UTC")
    a.add_argument("--offset", help="delay added to each slot (default: stable spread from the name)")
    a.add_argument(
        "--grace",
        default="30s",
        help="a slot whose scheduler comes this late or less still runs as on time, whatever the interval"
        " (default 30s, at most 1d); later slots were missed and --missed applies",
    )
    a.add_argument(
        "--missed",
        choices=["skip", "once", "all"],
        default="once",
        help="slots missed past the grace (every scheduler down): skip runs none, once (default) one job for"
        " the latest, all each of them (the newest 100)",
    )
    a.add_argument("--max-attempts", type=positive_int, help="attempts before dead (default: the handler's)")
    a.add_argument(
        "--queue",
        help="the queue its jobs go to (default: the queue --app's handler of --type declares, else default)",
    )
    a.add_argument("--app", metavar="M:ATTR", help="the app whose handler of --type names the default queue")
    a = ssub.add_parser("list", help="list schedules")
    a.add_argument("--json", action="store_true")
    for action, text in (
        ("pause", "stop firing (slots count as skipped)"),
        ("resume", "fire again from the next slot"),
        ("remove", "delete a schedule"),
        ("run-now", "enqueue the schedule's job now"),
    ):
        a = ssub.add_parser(action, help=text)
        a.add_argument("name")
    p.set_defaults(func=cmd_schedule)


def cmd_schedule(args: argparse.Namespace) -> int:
    from jobtui.core import scheduler as sched

    dsn = database_dsn(args)
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        migrations.check(conn, args.schema)
        action = args.schedule_action
        if action == "add":
            queue = args.queue
            if queue is None and args.app:
                # The queue the app's handler of the type declares, as a worker syncing the app's
                # own schedules would choose.
                queue = load_app(args.app).queue_of(args.type)
            spec = ScheduleSpec(
                name=args.name,
                cron=args.cron,
                type=args.type,
                payload=parse_payload(args.payload),
                timezone=args.timezone,
                offset=None if args.offset is None else parse_duration(args.offset),
                missed=args.missed,
                max_attempts=args.max_attempts,
                grace=parse_duration(args.grace),
                queue=DEFAULT_QUEUE if queue is None else queue,
            )
            sched.add(conn, spec, actor=args.actor, schema=args.schema)
            print(f"schedule {quote(args.name)} saved")
        elif action == "list":
            _print_schedules(sched.list_schedules(conn, args.schema), as_json=args.json)
        elif action == "pause":
            changed = sched.pause(conn, args.name, args.schema, actor=args.actor)
            print(f"schedule {quote(args.name)} {'paused' if changed else 'was already paused'}")
        elif action == "resume":
            changed = sched.resume(conn, args.name, args.schema, actor=args.actor)
            print(f"schedule {quote(args.name)} {'resumed' if changed else 'was not paused'}")
        elif action == "remove":
            sched.remove(conn, args.name, args.schema, actor=args.actor)
            print(f"schedule {quote(args.name)} removed")
        elif action == "run-now":
            print(sched.run_now(conn, args.name, args.schema, actor=args.actor))
    return 0


def _print_schedules(rows: list[Any], *, as_json: bool) -> None:
    if as_json:
        print_json([asdict(r) for r in rows])
        return
    from rich.table import Table

    table = Table(
        "name", "type", "queue", "cron", "tz", "grace", "policy", "next run", "last slot", "missed", "backfilled",
        "last missed", "skipped", "state",
    )  # fmt: skip
    for r in rows:
        table.add_row(
            r.name,
            r.job_type,
            r.queue,
            r.cron,
            r.timezone,
            f"{r.grace_seconds:g}s",
            r.missed_policy,
            r.next_run_at.isoformat(timespec="seconds"),
            r.last_slot.isoformat(timespec="seconds"),
            str(r.missed_count),
            str(r.backfilled_count),
            r.missed_slots[-1][:19] if r.missed_slots else "-",
            str(r.skipped_count),
            "paused" if r.paused else "active",
        )
    ops.wide_console().print(table)
