"""`jobtui demo`: a live queue that shows every failure mode of the design.

Quick jobs, slow jobs that outlive their lease thanks to heartbeats, flaky jobs that succeed
after retries, a poison type that always raises (ends dead), a type that kills its worker
process (lease expiries, then dead), and schedules, one of them paused and one that missed
slots while "every scheduler was down".

The crash type runs in a separate worker process, supervised by the demo and restarted when
it dies (as systemd or Kubernetes would), so it never takes the console down with it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any

from jobtui.cli.args import demo_dsn, positive_int
from jobtui.clients.client import Client
from jobtui.core import scheduler as schedules
from jobtui.core.registry import Job, Jobs, Permanent
from jobtui.core.uninstall import drop_schema
from jobtui.kernel import migrate as migrations
from jobtui.kernel.backoff import BackoffPolicy
from jobtui.kernel.db import check_schema_name, connect, describe_dsn
from jobtui.kernel.domain import DEFAULT_SCHEMA, NewJob

DEMO_SCHEMA = "jobtui_demo"
LEASE = 10.0

jobs = Jobs()


@jobs.handler("email.send", max_attempts=5)
async def send_email(job: Job) -> None:
    """Quick: a few milliseconds of work."""
    await asyncio.sleep(random.uniform(0.005, 0.05))


@jobs.handler("report.build", max_attempts=3, timeout=120)
def build_report(job: Job) -> None:
    """Slow: runs longer than its lease; the worker's heartbeats keep the lease alive."""
    deadline = time.monotonic() + float(job.payload.get("seconds", 25))
    while time.monotonic() < deadline:
        if not job.heartbeat():
            return  # the lease was lost (killed from the console): stop early
        time.sleep(0.5)


@jobs.handler("webhook.deliver", max_attempts=6, backoff=BackoffPolicy(base=1, factor=2, cap=8))
def deliver_webhook(job: Job) -> None:
    """Flaky: fails most attempts with a connection error, then succeeds."""
    if random.random() < 0.6:
        raise ConnectionError(f"POST https://hooks.example.com/{job.payload.get('hook', 0)}: connection reset by peer")


@jobs.handler("invoice.render", max_attempts=3, backoff=BackoffPolicy(base=1, cap=2))
def render_invoice(job: Job) -> None:
    """Poison: always raises; ends dead after its attempts, grouped by error fingerprint."""
    customer = job.payload.get("customer", 0)
    if job.payload.get("bad_currency"):
        raise Permanent(f"currency XYZ of invoice {customer} is not supported")
    raise KeyError(f"customer {customer} has no billing address")


@jobs.handler("image.resize", max_attempts=2)
def resize_image(job: Job) -> None:
    """Crash: kills the worker process running it (a segfault, an OOM kill)."""
    time.sleep(0.5)
    os._exit(137)


jobs.schedule("demo.heartbeat", cron="*/5 * * * * *", type="email.send", payload={"to": "ops@example.com"}, offset=0)
jobs.schedule("demo.report", cron="*/20 * * * * *", type="report.build", payload={"seconds": 15}, offset=0)
jobs.schedule("demo.paused", cron="*/10 * * * * *", type="email.send", offset=0)
jobs.schedule("demo.catch-up", cron="* * * * *", type="email.send", missed="skip", offset=0)

CRASH_TYPES = ["image.resize"]
MAIN_TYPES = [t for t in jobs.handlers if t not in CRASH_TYPES]


def prepare(dsn: str, schema: str, pooler: str | None = None) -> None:
    """Sync the schedules, pause one, and make one look as if every scheduler had been down."""
    with connect(dsn, autocommit=True, pooler=pooler) as conn:
        schedules.sync(conn, jobs.schedule_specs(), schema)
        schedules.pause(conn, "demo.paused", schema, actor="demo")
        schedules.rewind(conn, "demo.catch-up", 15 * 60, schema)


def enqueue_burst(client: Client, rng: random.Random, n: int) -> None:
    """A mix of every job type, weighted like a real application's traffic."""
    batch: list[NewJob] = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.70:
            batch.append(NewJob("email.send", {"to": f"user{rng.randint(1, 9999)}@example.com"}))
        elif roll < 0.82:
            batch.append(NewJob("webhook.deliver", {"hook": rng.randint(1, 50)}, max_attempts=6))
        elif roll < 0.84:
            batch.append(NewJob("report.build", {"seconds": rng.randint(12, 30)}, max_attempts=3))
        elif roll < 0.985:
            payload: dict[str, Any] = {"customer": rng.randint(100, 999), "bad_currency": rng.random() < 0.3}
            batch.append(NewJob("invoice.render", payload, max_attempts=3))
        else:
            batch.append(NewJob("image.resize", {"image": i}, max_attempts=2))
    client.enqueue_many(batch)


class Traffic:
    """Enqueues bursts every second in a background thread until stopped."""

    def __init__(self, dsn: str, schema: str, per_second: int = 6, pooler: str | None = None) -> None:
        self.client = Client(dsn, schema=schema, max_connections=1, pooler=pooler)
        self.per_second = per_second
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobtui-demo-traffic", daemon=True)

    def start(self) -> None:
        enqueue_burst(self.client, random.Random(1), 60)
        self.client.enqueue_many([NewJob("image.resize", {"image": 0}, max_attempts=2)])
        self._thread.start()

    def _run(self) -> None:
        rng = random.Random(2)
        while not self._stop.wait(1.0):
            try:
                enqueue_burst(self.client, rng, rng.randint(1, self.per_second))
            except Exception:  # the database may be restarting; the next burst tries again
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.client.close()


class CrashWorker:
    """A worker process for the crash type, restarted each time it dies."""

    def __init__(self, dsn: str, schema: str, pooler: str | None = None) -> None:
        self.dsn = dsn
        self.schema = schema
        self.pooler = pooler
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="jobtui-demo-crash", daemon=True)

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable, "-m", "jobtui.cli", "--dsn", self.dsn, "--schema", self.schema,
            *(["--pooler", self.pooler] if self.pooler is not None else []), "worker",
            "--app", "jobtui.cli.demo:jobs", "--types", ",".join(CRASH_TYPES), "--lease", f"{LEASE:.0f}s",
            "--concurrency", "1", "--no-scheduler", "--id", "demo-crasher",
        ]  # fmt: skip
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        self._proc = self._spawn()
        self._thread.start()

    def _supervise(self) -> None:
        # Restart after a pause, like a service manager's restart delay.
        while not self._stop.wait(3.0):
            if self._proc is not None and self._proc.poll() is not None:
                self.restarts += 1
                self._proc = self._spawn()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("demo", help="a live demo queue showing every failure mode, in the console")
    p.add_argument("--no-tui", action="store_true", help="run headless and print the stats at the end")
    p.add_argument("--seconds", type=float, default=30.0, help="how long a --no-tui run lasts (default 30)")
    p.add_argument("--reset", action="store_true", help="start from an empty demo schema")
    p.add_argument("--demo-concurrency", type=positive_int, default=16, help="embedded worker concurrency (default 16)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """A live demo queue: embedded PostgreSQL unless --dsn is given, then the console."""
    # The crash worker imports this module for its handlers: what only the command needs is
    # imported here.
    from jobtui.cli import ops
    from jobtui.cli.run import setup_logging
    from jobtui.worker import Worker

    schema = args.schema if args.schema != DEFAULT_SCHEMA else DEMO_SCHEMA
    dsn = demo_dsn(args)
    # Another terminal can watch or query the same queue while the demo runs.
    print(
        f"jobtui demo: the queue is in schema {schema} of {describe_dsn(dsn)}; from another terminal:"
        f" jobtui --dsn '{describe_dsn(dsn)}' --schema {schema} stats",
        file=sys.stderr,
    )
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        if args.reset:
            drop_schema(conn, check_schema_name(schema))
        migrations.migrate(conn, schema)
    prepare(dsn, schema, args.pooler)
    worker = Worker(jobs, dsn, concurrency=args.demo_concurrency, types=MAIN_TYPES, lease=LEASE,
                    schema=schema, shutdown_timeout=5, worker_id="demo-main", pooler=args.pooler)  # fmt: skip
    traffic = Traffic(dsn, schema, pooler=args.pooler)
    crasher = CrashWorker(dsn, schema, args.pooler)
    traffic.start()
    crasher.start()
    try:
        if args.no_tui:
            setup_logging(False)
            logging.getLogger("jobtui").setLevel(logging.ERROR)  # the stats at the end tell the story
            asyncio.run(_run_for(worker, args.seconds))
        else:
            from jobtui.tui.app import JobtuiApp

            worker.registered_as = "console"  # in the fleet: the console's embedded worker
            JobtuiApp(dsn, schema=schema, actor=args.actor, worker=worker, pooler=args.pooler).run()
    finally:
        traffic.stop()
        crasher.stop()
    if args.no_tui:
        from jobtui.reads.metrics import snapshot

        with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
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
