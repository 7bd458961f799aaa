"""`jobtui bench`: how fast this database runs jobtui, for sizing.

In its own schema (dropped afterwards): inserts N no-op jobs, drains them with P worker
processes, then measures enqueue-to-start latency at low load (one job every 10 ms). Every
time is read from the database (created_at, started_at, finished_at), never a local clock.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Any

from jobtui.cli.args import database_dsn, positive_int
from jobtui.clients.client import Client
from jobtui.core.bench import (
    BENCH_SCHEMA,
    claim_schema,
    drain_window,
    latencies,
    latency_left,
    mark_schema,
    queue_busy,
    vacuum,
)
from jobtui.core.jobs import COPY_THRESHOLD
from jobtui.core.registry import Job, Jobs
from jobtui.core.uninstall import drop_schema
from jobtui.kernel import migrate
from jobtui.kernel.db import check_schema_name, connect
from jobtui.kernel.domain import DEFAULT_SCHEMA, NewJob

NOOP = "bench.noop"
# Jobs per enqueue_many of the enqueue phase.
BATCH = 10_000

jobs = Jobs()


@jobs.handler(NOOP)
async def noop(job: Job) -> None:
    """Does nothing: the benchmark measures the queue, not the work."""


@dataclass(frozen=True, slots=True)
class BenchResult:
    jobs: int
    workers: int
    concurrency: int
    enqueue_per_s: float
    drain_per_s: float
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    latency_samples: int


def spawn_workers(
    dsn: str,
    schema: str,
    workers: int,
    concurrency: int,
    log: IO[bytes] | int,
    *,
    delete_on_complete: bool = False,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    pooler: str | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start `jobtui worker` processes running the no-op app; their logs go to `log`, a file
    (a pipe nobody reads would fill up and stall a worker mid-benchmark). `env` replaces the
    environment; `cwd` is where they start, and so whose jobtui they import (`python -m` puts
    the working directory ahead of PYTHONPATH: a benchmark that runs another source tree's
    jobtui starts them in it); `pooler` is given to them as --pooler."""
    cmd = [
        sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "--schema", schema,
        *(["--pooler", pooler] if pooler is not None else []),
        "worker", "--app", "jobtui.cli.bench:jobs", "--types", NOOP,
        "--concurrency", str(concurrency), "--no-scheduler", "--poll", "1s",
        *(["--delete-on-complete"] if delete_on_complete else []),
    ]  # fmt: skip
    return [
        subprocess.Popen(
            [*cmd, "--id", f"bench-{i}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
            cwd=cwd,
        )
        for i in range(workers)
    ]


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def run(
    dsn: str,
    *,
    n: int = 100_000,
    workers: int = 2,
    concurrency: int = 100,
    latency_jobs: int = 300,
    delete_on_complete: bool = False,
    schema: str = BENCH_SCHEMA,
    pooler: str | None = None,
) -> BenchResult:
    """Run the benchmark against `dsn` in `schema`, made for it and dropped at the end; returns
    the figures. A schema that exists and that no benchmark made is refused (InvalidInput)."""
    check_schema_name(schema)
    with connect(dsn, autocommit=True, pooler=pooler) as conn:
        claim_schema(conn, schema)
        drop_schema(conn, schema)
        migrate.migrate(conn, schema)
        mark_schema(conn, schema)
    try:
        with Client(dsn, schema=schema, pooler=pooler) as queue:
            t0 = time.perf_counter()
            for start in range(0, n, BATCH):
                queue.enqueue_many([NewJob(NOOP) for _ in range(min(BATCH, n - start))])
            enqueue_rate = n / (time.perf_counter() - t0)
        with connect(dsn, autocommit=True, pooler=pooler) as conn, tempfile.TemporaryFile() as log:
            vacuum(conn, schema)
            procs = spawn_workers(
                dsn, schema, workers, concurrency, log, delete_on_complete=delete_on_complete, pooler=pooler
            )
            try:
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:
                    if not queue_busy(conn, schema):
                        break
                    if any(p.poll() is not None for p in procs):
                        raise RuntimeError("a bench worker exited: " + _last_line(log))
                    time.sleep(0.2)
                else:
                    raise RuntimeError("the jobs were not drained within 10 minutes")
                # Drain rate from the database's own timestamps: first start to last finish.
                finished, span = drain_window(conn, schema)
                if finished != n:
                    raise RuntimeError(f"{finished} of {n} jobs finished: " + _last_line(log))
                drain_rate = n / span
                latencies = _latency(conn, dsn, schema, latency_jobs, pooler)
            finally:
                stop_workers(procs)
    finally:
        with connect(dsn, autocommit=True, pooler=pooler) as conn:
            drop_schema(conn, schema)
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return BenchResult(n, workers, concurrency, enqueue_rate, drain_rate, q[49], q[89], q[98], len(latencies))


def _latency(conn: Any, dsn: str, schema: str, count: int, pooler: str | None) -> list[float]:
    """Enqueue `count` jobs one by one every 10 ms to idle workers; started_at - created_at.
    The jobs carry keys, so workers that delete finished jobs keep these rows."""
    with Client(dsn, schema=schema, max_connections=1, pooler=pooler) as queue:
        queue.enqueue(NOOP, key="latency-warm-up")  # warm the connection and the workers
        time.sleep(0.5)
        first = queue.enqueue(NOOP, key="latency-0")
        for i in range(1, count):
            time.sleep(0.01)
            queue.enqueue(NOOP, key=f"latency-{i}")
    deadline = time.monotonic() + 30
    while latency_left(conn, schema, first) and time.monotonic() < deadline:
        time.sleep(0.1)
    return latencies(conn, schema, first)


def _last_line(log: IO[bytes]) -> str:
    log.seek(0)
    lines = log.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(no output)"


def enqueue_label(n: int) -> str:
    """How `run` enqueues `n` jobs: in batches of BATCH, by COPY from COPY_THRESHOLD jobs on."""
    if n >= COPY_THRESHOLD:
        return f"enqueue (COPY, batches of {BATCH:,})"
    return "enqueue (INSERT, one batch)"


def add_parsers(sub: Any) -> None:
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


def cmd_bench(args: argparse.Namespace) -> int:
    # `bench --schema X` or `jobtui --schema X bench`; never the default jobtui schema by default.
    schema = args.bench_schema or (args.schema if args.schema != DEFAULT_SCHEMA else BENCH_SCHEMA)
    dsn = database_dsn(args)
    with connect(dsn, autocommit=True, pooler=args.pooler) as conn:
        claim_schema(conn, check_schema_name(schema))
    deleting = ", deleting on complete" if args.delete_on_complete else ""
    print(
        f"jobtui bench: {args.jobs} no-op jobs, {args.workers} worker process(es) x concurrency {args.concurrency}"
        + deleting
        + f", in schema {schema} (dropped afterwards)"
    )
    result = run(
        dsn,
        n=args.jobs,
        workers=args.workers,
        concurrency=args.concurrency,
        delete_on_complete=args.delete_on_complete,
        schema=schema,
        pooler=args.pooler,
    )
    print(f"  {enqueue_label(args.jobs):<36}{result.enqueue_per_s:>10,.0f} jobs/s")
    print(f"  {'drain':<36}{result.drain_per_s:>10,.0f} jobs/s")
    print(
        f"  enqueue-to-start latency, low load  p50 {result.latency_p50_ms:.1f} ms  p90 {result.latency_p90_ms:.1f} ms"
        f"  p99 {result.latency_p99_ms:.1f} ms  ({result.latency_samples} jobs, one every 10 ms)"
    )
    return 0
