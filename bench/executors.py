"""Sync handlers in threads beside sync handlers in child processes, in one run.

    .venv/bin/python bench/executors.py [--dsn DSN] [--jobs 20000] [--jobs-10ms 5000]
                                        [--concurrency 20] [--latency-jobs 200] [--rounds 3]

A benchmark, not a test. In its own database (jobtui_bench_executors, dropped afterwards),
for each workload (a no-op sync handler, and one that sleeps 10 ms) and each executor
(`--executor thread`, `--executor process`), taking turns round after round in a rotating
order, it:

1. enqueues the jobs (COPY) and runs VACUUM ANALYZE;
2. starts one `jobtui worker` process and drains them: jobs / (first start to last finish,
   the database's clock), its pool of children started before the drain;
3. with the worker idle, enqueues --latency-jobs jobs one by one, one every 20 ms, and takes
   each one's time from enqueue to done (p50, p99): the whole path of one job, the
   executor's hand-over included;
4. reads the proportional memory (PSS) of the worker and its processes.

It prints the medians of the rounds, and process mode's share of thread mode's drain rate
against the targets: at least 50 % on no-op jobs, within 10 % on 10 ms jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui import Client, NewJob
from jobtui.kernel.migrate import migrate

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "jobtui_bench_executors"
HERE = Path(__file__).resolve().parent
WORKLOADS = {"noop": "bench.sync_noop", "10ms": "bench.sync_10ms"}
EXECUTORS = ("thread", "process")
TARGETS = {"noop": 0.50, "10ms": 0.90}  # process mode's drain rate over thread mode's, at least


@dataclass
class Figures:
    drain: float  # jobs/s
    p50: float  # ms, enqueue to done
    p99: float
    pss_mib: float


def with_dbname(dsn: str, dbname: str) -> str:
    return make_conninfo("", **{**conninfo_to_dict(dsn), "dbname": dbname})


def pss_mib(root: int) -> float:
    """The proportional set size of `root` and every process under it, in MiB."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError):
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        grew = bool(more)
        tree |= more
    total = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def wait_idle(conn: psycopg.Connection[tuple[object, ...]], proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = conn.execute(
            "SELECT EXISTS (SELECT FROM jobtui.job WHERE status = 'ready')"
            " OR EXISTS (SELECT FROM jobtui.job WHERE status = 'running')"
        ).fetchone()
        if busy is not None and not busy[0]:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode}")
        time.sleep(0.1)
    raise RuntimeError(f"jobs left after {timeout:.0f}s")


def measure(dsn: str, workload: str, executor: str, jobs: int, concurrency: int, latency_jobs: int) -> Figures:
    job_type = WORKLOADS[workload]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobtui.job")
        with Client(dsn) as client:
            for start in range(0, jobs, 10_000):
                client.enqueue_many([NewJob(job_type) for _ in range(min(10_000, jobs - start))])
        conn.execute("VACUUM ANALYZE jobtui.job")
        env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        cmd = [
            sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "worker", "--app", "executors_app:jobs",
            "--executor", executor, "--concurrency", str(concurrency), "--no-scheduler", "--poll", "1s",
            "--types", job_type,
        ]  # fmt: skip
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
            try:
                wait_idle(conn, proc, 600)
                row = conn.execute(
                    "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))"
                    " FROM jobtui.job WHERE status = 'done'"
                ).fetchone()
                assert row is not None and row[0] == jobs, row
                drain = jobs / float(row[1])
                memory = pss_mib(proc.pid)
                first = None
                with Client(dsn, max_connections=1) as client:
                    client.enqueue(job_type)  # warm the connection
                    time.sleep(0.5)
                    for _ in range(latency_jobs):
                        job_id = client.enqueue(job_type)
                        first = first or job_id
                        time.sleep(0.02)
                wait_idle(conn, proc, 60)
                latencies = [
                    float(r[0])
                    for r in conn.execute(
                        "SELECT extract(epoch FROM finished_at - created_at) * 1000 FROM jobtui.job WHERE id >= %s",
                        (first,),
                    )
                ]
            finally:
                proc.terminate()
                proc.wait(30)
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return Figures(drain, q[49], q[98], memory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--jobs", type=int, default=20_000, help="no-op jobs per drain")
    parser.add_argument("--jobs-10ms", type=int, default=5_000, help="10 ms jobs per drain")
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    dsn = with_dbname(args.dsn, BENCH_DB)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        configs = [(w, e) for w in WORKLOADS for e in EXECUTORS]
        results: dict[tuple[str, str], list[Figures]] = {c: [] for c in configs}
        for round_no in range(args.rounds):
            order = configs[round_no % len(configs) :] + configs[: round_no % len(configs)]
            for workload, executor in order:
                jobs = args.jobs if workload == "noop" else args.jobs_10ms
                found = measure(dsn, workload, executor, jobs, args.concurrency, args.latency_jobs)
                results[(workload, executor)].append(found)
                print(
                    f"round {round_no + 1} {workload:>4} {executor:<7} {found.drain:>9,.0f} jobs/s"
                    f"  p50 {found.p50:.2f} ms  p99 {found.p99:.2f} ms  PSS {found.pss_mib:.0f} MiB",
                    flush=True,
                )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))

    def med(workload: str, executor: str, field: str) -> float:
        return float(statistics.median(getattr(f, field) for f in results[(workload, executor)]))

    print(f"\nmedians of {args.rounds} round(s), --concurrency {args.concurrency}, one worker process:")
    print("| workload | executor | drain jobs/s | enqueue to done p50 / p99 ms | worker PSS MiB |")
    print("| --- | --- | ---: | ---: | ---: |")
    for workload, executor in configs:
        print(
            f"| {workload} | {executor} | {med(workload, executor, 'drain'):,.0f} | "
            f"{med(workload, executor, 'p50'):.2f} / {med(workload, executor, 'p99'):.2f} | "
            f"{med(workload, executor, 'pss_mib'):.0f} |"
        )
    failed = False
    for workload, target in TARGETS.items():
        pairs = zip(results[(workload, "process")], results[(workload, "thread")], strict=True)
        ratios = [p.drain / t.drain for p, t in pairs]
        ratio = statistics.median(ratios)
        ok = ratio >= target
        failed |= not ok
        print(f"process / thread, {workload}: {ratio:.0%} (target at least {target:.0%}): {'ok' if ok else 'MISSED'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
