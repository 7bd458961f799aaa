"""The `jobtui` command: its parser, the data commands and `main`. User mistakes print one line
on stderr and exit with 2.

Job data, and user input echoed in errors, is printed escaped (`safetext`); tables go through
`cli_ops.DataConsole`, logs through `safetext.SafeFormatter`; `--json` prints it exact. The
long-running commands live in `cli_run`, the argument types in `cli_args`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import psycopg

from jobtui.cli import ops
from jobtui.cli.admin import add_admin_commands, add_migrate_command
from jobtui.cli.args import (
    ERROR_MATCH,
    Command,
    Parser,
    accept_global_options_anywhere,
    add_metrics_options,
    add_wait_for_db,
    database_dsn,
    default_actor,
    job_id,
    name_commands,
    one_line,
    open_queue,
    parse_payload,
    port_number,
    positive_int,
    positive_seconds,
    queue_slots,
    refuse_changes_when_read_only,
    with_dsn,
    with_queue,
)
from jobtui.cli.bulk import add_bulk_commands
from jobtui.cli.queues import add_queue_commands
from jobtui.cli.run import cmd_bench, cmd_console, cmd_demo, cmd_scheduler, cmd_worker
from jobtui.cli.search import add_index_command, add_search_options
from jobtui.cli.search import cmd_jobs as search_cmd_jobs
from jobtui.cli.serve import add_serve_commands
from jobtui.core.audit import record_audit
from jobtui.core.registry import ScheduleSpec, load_app
from jobtui.kernel import migrate as migrations
from jobtui.kernel.db import POOLERS, connect, pooler_mode
from jobtui.kernel.domain import DEFAULT_QUEUE
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import JobtuiError, UnknownJob
from jobtui.kernel.explain import explain
from jobtui.kernel.safetext import quote


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = parse_payload(args.payload)
    delay = parse_duration(args.delay)
    with open_queue(args) as queue:
        job_id = queue.enqueue(
            args.type, payload, key=args.key, delay=delay, max_attempts=args.max_attempts, queue=args.queue
        )
    print(job_id)
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    with open_queue(args) as queue:
        job = queue.get(args.id)
    if job is None:
        raise UnknownJob(
            f"no job with id {args.id} in schema {args.schema!r} (finished jobs leave it when archived, or at once"
            " with workers started with --delete-on-complete); list jobs with `jobtui stats`"
        )
    if args.json:
        print(json.dumps(_job_json(job), default=str, indent=2))
    else:
        print("\n".join(explain(job)))
    return 0


def _job_json(job: Any) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(job)
    data["status"] = job.status.value
    return data


def cmd_schedule(args: argparse.Namespace) -> int:
    from jobtui.core import scheduler as sched

    dsn = database_dsn(args)
    with connect(dsn, autocommit=True) as conn:
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
            with conn.transaction():
                sched.upsert(conn, spec, source="cli", schema=args.schema)
                record_audit(conn, args.actor, "schedule-add", f"schedule {args.name}", 1, schema=args.schema)
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
        from dataclasses import asdict

        print(json.dumps([asdict(r) for r in rows], default=str, indent=2))
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


def add_operator_commands(sub: Any) -> None:
    p = sub.add_parser("stats", help="the queue's health: ages, counts, throughput, dead groups")
    p.add_argument("--json", action="store_true", help="one JSON document for scripts")
    p.add_argument("--watch", type=positive_seconds, nargs="?", const=2.0, help="refresh every N seconds (default 2)")
    p.set_defaults(func=with_dsn(ops.cmd_stats))

    p = sub.add_parser("dead", help="dead and failed jobs grouped by error fingerprint")
    p.add_argument("--type", help="only this job type")
    p.add_argument(
        "--error",
        metavar="PATTERN",
        help="only jobs whose error matches PATTERN, the same rows as `requeue --error PATTERN`: " + ERROR_MATCH,
    )
    p.add_argument("--json", action="store_true", help="the groups as JSON, each with its job ids")
    p.set_defaults(func=with_dsn(ops.cmd_dead))

    p = sub.add_parser("requeue", help="move dead/failed jobs back to ready")
    p.add_argument("ids", nargs="*", type=job_id, help="job ids")
    p.add_argument("--type", help="every dead/failed job of this type")
    p.add_argument(
        "--error",
        metavar="PATTERN",
        help="every dead/failed job whose error matches PATTERN, the rows `dead --error PATTERN` lists: " + ERROR_MATCH,
    )
    p.add_argument("--all", action="store_true", help="every dead/failed job")
    p.add_argument("--dry-run", action="store_true", help="count, change nothing")
    p.set_defaults(func=with_queue(ops.cmd_requeue))

    p = sub.add_parser("kill-lease", help="return running jobs to ready now")
    p.add_argument("ids", nargs="+", type=job_id)
    p.set_defaults(func=with_queue(ops.cmd_kill_lease))

    p = sub.add_parser("cancel", help="mark ready or running jobs failed")
    p.add_argument("ids", nargs="+", type=job_id)
    p.set_defaults(func=with_queue(ops.cmd_cancel))

    p = sub.add_parser("audit", help="operator actions, newest first")
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=with_queue(ops.cmd_audit))

    p = sub.add_parser("metrics", help="serve Prometheus metrics")
    p.add_argument("--port", type=port_number, required=True)
    p.add_argument("--addr", help="the address to listen on, e.g. 127.0.0.1 (default: every address)")
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="answer only requests with `Authorization: Bearer TOKEN`, TOKEN read from PATH",
    )
    p.set_defaults(func=with_dsn(ops.cmd_metrics))


def package_version() -> str:
    """The installed distribution's version (what `pip` installed), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jobtui")
    except PackageNotFoundError:
        return "unknown (not installed)"


def add_log_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="log lines as escaped text or one JSON object per line (default: JOBTUI_LOG_FORMAT, else text)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="jobtui", description="PostgreSQL job queue and operator console")
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: JOBTUI_DSN, else DATABASE_URL)")
    parser.add_argument(
        "--embedded", action="store_true", help="with no DSN, use the embedded PostgreSQL (as `jobtui demo` does)"
    )
    parser.add_argument("--schema", default="jobtui", help="schema holding jobtui's tables (default: jobtui)")
    parser.add_argument("--actor", default=default_actor(), help="who acts, for the audit log (default user@host)")
    parser.add_argument("--version", action="version", version=f"jobtui {package_version()}")
    parser.add_argument(
        "--pooler",
        choices=POOLERS,
        help="transaction: the DSN goes through PgBouncer with pool_mode = transaction, so jobtui keeps no"
        " session state (default: JOBTUI_POOLER, else none)",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="the console (and `serve`'s consoles) hide and refuse every action; a command that changes the"
        " database refuses to run",
    )
    console = parser.add_argument_group("console (jobtui with no command)")
    console.add_argument("--work", metavar="M:ATTR", help="run a worker (and scheduler) inside the console")
    console.add_argument(
        "--concurrency", type=positive_int, default=4, help="embedded worker's concurrency (default 4)"
    )
    console.add_argument(
        "--executor",
        choices=("thread", "process"),
        default="thread",
        help="embedded worker's sync handlers: a thread each, or child processes it can stop (default thread)",
    )
    console.add_argument("--warn-age", default="1m", help="oldest ready age that turns amber (default 1m)")
    console.add_argument("--crit-age", default="5m", help="oldest ready age that turns red (default 5m)")
    console.add_argument("--warn-dead", type=int, default=1, help="dead count that turns amber (default 1)")
    console.add_argument("--crit-dead", type=int, default=100, help="dead count that turns red (default 100)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    add_migrate_command(sub)

    p = sub.add_parser("enqueue", help="add a job")
    p.add_argument("type", help="job type, e.g. email.send")
    p.add_argument("--payload", default="{}", help="JSON payload (default {})")
    p.add_argument("--key", help="idempotency key: a second enqueue with it returns the first job")
    p.add_argument("--delay", default="0", help="run after this long, e.g. 30s, 5m")
    p.add_argument("--max-attempts", type=positive_int, help="attempts before dead (default: the handler's)")
    p.add_argument("--queue", help=f"the job's queue (default: {DEFAULT_QUEUE})")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("jobs", help="list jobs, newest first, or count them (--count)")
    p.add_argument("--status", help="comma-separated statuses: ready, running, done, failed, dead")
    p.add_argument("--type", help="only this job type")
    p.add_argument("--queue", help="only jobs of this queue")
    p.add_argument("--since", help="created this long ago or less, e.g. 1h")
    p.add_argument("--error", help="regular expression the last error matches")
    p.add_argument("--limit", type=positive_int, default=50, help="jobs per page (default 50, at most 1000)")
    p.add_argument("--before", type=job_id, help="the page older than this job id")
    p.add_argument("--count", action="store_true", help="how many jobs match, by status and type")
    p.add_argument("--json", action="store_true")
    add_search_options(p)
    p.set_defaults(func=with_queue(search_cmd_jobs))

    p = sub.add_parser("worker", help="run jobs with the handlers of an app")
    p.add_argument("--app", required=True, help="the Jobs registry, as pkg.module:jobs")
    p.add_argument("--concurrency", type=positive_int, default=10, help="jobs run at once (default 10)")
    p.add_argument("--types", help="comma-separated job types to run (default: every registered type)")
    p.add_argument(
        "--queues",
        type=queue_slots,
        help="queues to claim from, each with its own slots: NAME=CONCURRENCY,... (default: every queue, "
        "sharing --concurrency)",
    )
    p.add_argument("--lease", default="30s", help="lease length; heartbeats extend it (default 30s)")
    p.add_argument("--id", help="worker name shown as locked_by (default host:pid)")
    p.add_argument("--shutdown-timeout", default="30s", help="time in-flight jobs get on SIGTERM (default 30s)")
    p.add_argument("--poll", default="1s", help="poll interval besides LISTEN wake-ups (default 1s)")
    p.add_argument(
        "--listen-dsn",
        default=os.environ.get("JOBTUI_LISTEN_DSN") or None,
        help="a direct DSN (not through a transaction pooler) for LISTEN wake-ups (default: JOBTUI_LISTEN_DSN;"
        " with --pooler transaction and none, the worker polls)",
    )
    p.add_argument(
        "--executor",
        choices=("thread", "process"),
        default=os.environ.get("JOBTUI_EXECUTOR") or "thread",
        help="where sync handlers run: a thread each, or a pool of child processes the worker can stop"
        " (default: JOBTUI_EXECUTOR, else thread; a handler's executor= wins)",
    )
    p.add_argument(
        "--max-jobs-per-child", type=positive_int, help="process executor: replace a child after this many jobs"
    )
    p.add_argument(
        "--max-memory-per-child",
        help="process executor: resident memory (like 512M) a child may hold; over it while a job runs, the"
        " child is stopped and the attempt fails; over it when its job returns, the child is replaced",
    )
    p.add_argument("--no-scheduler", action="store_true", help="do not run the scheduler in this worker")
    p.add_argument("--retention", default="1d", help="how long done jobs stay before archiving (default 1d)")
    p.add_argument("--dead-retention", default="30d", help="how long dead/failed jobs stay (default 30d)")
    p.add_argument("--delete-done", action="store_true", help="delete done jobs instead of archiving them")
    p.add_argument(
        "--delete-on-complete",
        action="store_true",
        help="delete jobs without a key when they finish, keeping only their count (faster; no done rows)",
    )
    add_metrics_options(p)
    add_wait_for_db(p)
    add_log_options(p)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("scheduler", help="run only the scheduler (workers run one too)")
    p.add_argument("--app", help="also sync the schedules declared in this app (pkg.module:jobs)")
    add_metrics_options(p)
    add_wait_for_db(p)
    add_log_options(p)
    p.set_defaults(func=cmd_scheduler)

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

    add_operator_commands(sub)
    add_queue_commands(sub)
    add_index_command(sub)
    add_bulk_commands(sub)
    add_serve_commands(sub)
    add_admin_commands(sub)

    p = sub.add_parser("bench", help="measure enqueue, drain and latency on this database (own schema)")
    p.add_argument("--jobs", type=positive_int, default=100_000)
    p.add_argument("--workers", type=positive_int, default=2, help="worker processes (default 2)")
    p.add_argument("--concurrency", type=positive_int, default=100, help="per worker (default 100)")
    p.add_argument("--delete-on-complete", action="store_true", help="workers delete finished jobs (see `worker`)")
    p.add_argument(
        "--schema",
        dest="bench_schema",
        metavar="SCHEMA",
        help="schema to make for the benchmark and drop afterwards; one that exists is refused (default jobtui_bench)",
    )
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="a live demo queue showing every failure mode, in the console")
    p.add_argument("--no-tui", action="store_true", help="run headless and print the stats at the end")
    p.add_argument("--seconds", type=float, default=30.0, help="how long a --no-tui run lasts (default 30)")
    p.add_argument("--reset", action="store_true", help="start from an empty demo schema")
    p.add_argument("--demo-concurrency", type=positive_int, default=16, help="embedded worker concurrency (default 16)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("job", help="explain one job from its row")
    p.add_argument("id", type=job_id)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_job)
    accept_global_options_anywhere(parser)
    name_commands(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, decoded by Python as surrogates
            print(f"jobtui: error: argument {quote(arg)} is not valid UTF-8 text; check its encoding", file=sys.stderr)
            return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Command = getattr(args, "func", None) or cmd_console
    try:
        refuse_changes_when_read_only(args)
        if args.pooler is not None:
            # One setting for the whole process and the workers it starts: every connection
            # reads it (db.pooler_mode).
            os.environ["JOBTUI_POOLER"] = args.pooler
        pooler_mode()  # a bad JOBTUI_POOLER is one line, before anything connects
        return func(args)
    except JobtuiError as exc:
        print(f"jobtui: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except psycopg.errors.InsufficientPrivilege as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"jobtui: error: {one_line(first)}: the database role lacks a privilege this command needs "
            "(see Privileges in jobtui's README)",
            file=sys.stderr,
        )
        return 2
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"jobtui: database error: {one_line(first)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
