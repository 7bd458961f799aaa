"""Where a drain's CPU goes: worker processes against the PostgreSQL server, per job.

    .venv/bin/python bench/drain_cpu.py [--dsn DSN] [--jobs 200000] [--workers 2]
                                        [--concurrency 100] [--rounds 3] [--raw]
                                        [--delete-on-complete]

A benchmark, not a test. In its own database (jobtui_bench_drain_cpu, dropped afterwards)
it enqueues --jobs no-op jobs, starts --workers `jobtui worker` processes (or, with --raw,
the raw psycopg claim/complete loop of bench/core.py, batch --concurrency) and reads, once
the queue is empty:

- the drain rate, jobs / (last finished_at - first started_at), the database's own clock;
- the CPU time of the worker processes (utime + stime from /proc, their start-up included)
  and of every PostgreSQL process on the machine (backends, WAL writer, checkpointer;
  the server must be local), each divided by the number of jobs.

On a machine whose CPUs are all busy during a drain, the rate is about
CPUs / (worker CPU + server CPU per job): the two columns say which side to work on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui import NewJob, Queue
from jobtui.migrate import migrate
from jobtui.sizing import NOOP as JOB_TYPE
from jobtui.sizing import drain_window, queue_busy, spawn_workers, stop_workers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import RawLoop  # bench/ is not a package

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "jobtui_bench_drain_cpu"
SCHEMA = "jobtui"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, or 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def postgres_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == "postgres":
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def raw_loop(dsn: str, batch: int, worker: str, delete: bool) -> None:
    """bench/core.py's raw loop, until a claim finds nothing."""
    loop = RawLoop(dsn, job_type=JOB_TYPE, worker=worker, delete=delete)
    try:
        loop.drain(batch)
    finally:
        loop.close()


def one_drain(
    dsn: str, jobs: int, workers: int, concurrency: int, raw: bool, delete: bool
) -> tuple[float, float, float]:
    """(jobs/s, worker CPU us/job, server CPU us/job) of one drain from a fresh table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobtui.job, jobtui.done_tally")
    with Queue(dsn) as queue:
        for start in range(0, jobs, 10_000):
            queue.enqueue_many([NewJob(JOB_TYPE) for _ in range(min(10_000, jobs - start))])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobtui.job")
        conn.execute("CHECKPOINT")
    server_before = {pid: cpu_seconds(pid) for pid in postgres_pids()}
    if raw:
        cmds = [
            [sys.executable, __file__, "--raw-loop", dsn, str(concurrency), f"raw-{i}", "delete" if delete else "keep"]
            for i in range(workers)
        ]
        procs = [subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) for cmd in cmds]
    else:
        procs = spawn_workers(dsn, SCHEMA, workers, concurrency, subprocess.DEVNULL, delete_on_complete=delete)
    worker_cpu = dict.fromkeys((p.pid for p in procs), 0.0)
    server_cpu = dict(server_before)

    def sample() -> None:
        # A raw loop and its backend exit when they are done: keep the last reading of each.
        for p in procs:
            worker_cpu[p.pid] = max(worker_cpu[p.pid], cpu_seconds(p.pid))
        for pid in postgres_pids():
            server_cpu[pid] = max(server_cpu.get(pid, 0.0), cpu_seconds(pid))

    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            sample()
            if not queue_busy(conn, SCHEMA):
                break
            time.sleep(0.05)
        sample()
        server = sum(cpu - server_before.get(pid, 0.0) for pid, cpu in server_cpu.items())
        finished, span = drain_window(conn, SCHEMA)
        rate = finished / span if span else 0.0
    stop_workers(procs)
    return rate, sum(worker_cpu.values()) / jobs * 1e6, server / jobs * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=100, help="per worker; the raw loop's batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--raw", action="store_true", help="the raw psycopg loop instead of jobtui workers")
    parser.add_argument(
        "--delete-on-complete", action="store_true", help="finished jobs are deleted and tallied (raw loop too)"
    )
    args = parser.parse_args(argv)

    params = conninfo_to_dict(args.dsn)
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    params["dbname"] = BENCH_DB
    dsn = make_conninfo(**params)  # type: ignore[arg-type]
    what = f"raw loop, batch {args.concurrency}" if args.raw else f"jobtui worker, concurrency {args.concurrency}"
    if args.delete_on_complete:
        what += ", --delete-on-complete" if not args.raw else ", completing by delete and tally"
    print(f"{args.workers} x {what}, {args.jobs:,} jobs, {os.cpu_count()} CPUs")
    figures = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        for r in range(args.rounds):
            rate, worker, server = one_drain(
                dsn, args.jobs, args.workers, args.concurrency, args.raw, args.delete_on_complete
            )
            figures.append((rate, worker, server))
            print(f"round {r + 1}: drain {rate:,.0f} jobs/s, worker CPU {worker:.1f} us/job, "
                  f"server CPU {server:.1f} us/job (load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
    rates, workers, servers = zip(*figures, strict=True)
    print(f"median: drain {statistics.median(rates):,.0f} jobs/s, worker CPU {statistics.median(workers):.1f} us/job, "
          f"server CPU {statistics.median(servers):.1f} us/job")  # fmt: skip
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--raw-loop":
        raw_loop(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "delete")
    else:
        sys.exit(main())
