"""A drain of jobs that await a short sleep, by one `jobtui worker` of each checkout in turns.

    .venv/bin/python bench/sleep_drain.py --tree main=. --tree other=PATH [--jobs 20000]
        [--mean-ms 2] [--rounds 4] [--concurrency 200]

Each job awaits `asyncio.sleep` for an exponentially distributed time of mean `--mean-ms`,
so a claim's jobs end one by one, not together as no-op jobs do: it shows what a claim
policy costs jobs that wait on something. Each round fills a fresh table with `--jobs` jobs,
starts one worker process of a checkout, and measures from the first job's start to the
last one's end (the database's timestamps); the checkouts take turns. The database
(jobtui_bench_sleep) is dropped at the end.
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

HERE = Path(__file__).resolve().parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "jobtui_bench_sleep"
APP = "bench_sleep_app"

APP_SOURCE = """
import asyncio
import random

from jobtui import Job, Jobs

jobs = Jobs()


@jobs.handler("bench.sleep")
async def nap(job: Job) -> None:
    await asyncio.sleep(random.expovariate(1000.0 / job.payload["mean_ms"]))
"""


def drain(dsn: str, tree: Path, app_dir: Path, jobs: int, mean_ms: float, concurrency: int) -> float:
    """Jobs per second of one worker of `tree` draining `jobs` sleeping jobs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobtui.job, jobtui.done_tally")
        conn.execute(
            "INSERT INTO jobtui.job (type, payload) SELECT 'bench.sleep', jsonb_build_object('mean_ms', %s::float)"
            " FROM generate_series(1, %s)",
            (mean_ms, jobs),
        )
        conn.execute("VACUUM ANALYZE jobtui.job")
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{app_dir}")
    command = [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "worker", "--app", f"{APP}:jobs",
               "--types", "bench.sleep", "--concurrency", str(concurrency)]  # fmt: skip
    worker = subprocess.Popen(command, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            left = "SELECT count(*) FROM jobtui.job WHERE type = 'bench.sleep' AND status <> 'done'"
            while (row := conn.execute(left).fetchone()) and row[0]:
                time.sleep(0.1)
            span = conn.execute(
                "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM jobtui.job"
                " WHERE type = 'bench.sleep'"
            ).fetchone()
    finally:
        worker.terminate()
        worker.wait()
    assert span is not None
    return jobs / float(span[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a database of the server; the bench makes its own")
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--mean-ms", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=200)
    args = parser.parse_args()
    trees = [(name, Path(path).resolve()) for name, path in (t.split("=", 1) for t in args.tree)]
    params = conninfo_to_dict(args.dsn)
    dsn = make_conninfo("", **{**params, "dbname": BENCH_DB})
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    app_dir = Path(f"/tmp/{BENCH_DB}-{os.getpid()}")
    app_dir.mkdir(exist_ok=True)
    (app_dir / f"{APP}.py").write_text(APP_SOURCE)
    rates: dict[str, list[float]] = {name: [] for name, _ in trees}
    try:
        subprocess.run([sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "migrate"], check=True, capture_output=True)
        for r in range(args.rounds):
            for name, tree in trees[r % len(trees) :] + trees[: r % len(trees)]:
                rate = drain(dsn, tree, app_dir, args.jobs, args.mean_ms, args.concurrency)
                rates[name].append(rate)
                print(f"round {r + 1} {name}: {rate:,.0f} jobs/s (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
    print()
    for name, got in rates.items():
        print(f"{name}: median {statistics.median(got):,.0f} jobs/s")
    first = trees[0][0]
    for name, got in rates.items():
        if name != first:
            ratios = [a / b for a, b in zip(got, rates[first], strict=True)]
            print(f"{name} against {first}, paired by round: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
