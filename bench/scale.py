"""Does the queue slow down as done jobs pile up? Claim latency and drain rate at table sizes.

    .venv/bin/python bench/scale.py [--dsn DSN] [--sizes 10000,1000000,5000000] [--jobs 50000]
                                    [--rounds 3] [--workers 2] [--concurrency 100]

A benchmark, not a test. For each size it creates a database of its own
(jobtui_bench_scale_<size>, dropped at the end) on the server of --dsn, migrates it, and:

1. fills the job table with that many done jobs (finished over the last 7 days, as a
   production table keeps them until the archiver moves them), then VACUUM ANALYZE;
2. per round: enqueues --jobs no-op jobs with `Queue.enqueue_many`, `VACUUM ANALYZE`s,
   waits until no autovacuum worker runs on the server (the 5,000,000-row fill sets one off
   for minutes) and checkpoints, so that every size starts from the same state; then
   - claim latency: 200 claims of 10 jobs, one at a time, each completed before the next,
     on one connection set up as the worker's claim connection; median and p99 ms;
   - drain: --workers `jobtui worker` processes (concurrency --concurrency) drain the jobs;
     jobs / (last finished_at - first started_at), from the database's own clock;
   then deletes the round's jobs again, so every round starts from the same table.

Sizes take turns round by round (noise on the shared machine falls on all of them alike),
and the table gives medians over the rounds with each size's figures as a share of the
smallest size's. The issue's bar: within 20 % of each other. Exit status 1 past it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui import NewJob, Queue
from jobtui.db import run
from jobtui.migrate import migrate
from jobtui.queue import claim_call, complete_call
from jobtui.sizing import NOOP as JOB_TYPE
from jobtui.sizing import queue_busy, spawn_workers, stop_workers

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "jobtui_bench_scale"
SCHEMA = "jobtui"
TOLERANCE = 0.20

FILL_DONE = """
INSERT INTO jobtui.job (type, status, run_at, attempts, max_attempts, locked_by, lease_token,
                        heartbeat_at, created_at, started_at, finished_at)
SELECT 'type_' || (i %% 8), 'done', f - interval '2 seconds', 1, 25, 'worker-' || (i %% 16), 1,
       f - interval '1 second', f - interval '3 seconds', f - interval '1 second', f
FROM (SELECT i, now() - (i * interval '604800 seconds') / %(n)s AS f
      FROM generate_series(1, %(n)s) AS i) AS s
"""


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def claim_latency(dsn: str, claims: int = 200) -> list[float]:
    """Milliseconds per claim of 10, each batch completed before the next claim."""
    times = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in ("enable_bitmapscan", "enable_seqscan"):  # as the worker's claim connection
            conn.execute(f"SET {setting} = off")
        for _ in range(claims):
            start = time.perf_counter()
            jobs = run(conn, claim_call([JOB_TYPE], worker="bench-latency", limit=10))
            times.append((time.perf_counter() - start) * 1000)
            run(conn, complete_call([j.lease for j in jobs]))
    return times


def drain(dsn: str, workers: int, concurrency: int, first_id: int) -> float:
    """Drain the ready jobs with worker processes; jobs per second from the rows' timestamps."""
    with tempfile.TemporaryFile() as log, psycopg.connect(dsn, autocommit=True) as conn:
        procs = spawn_workers(dsn, SCHEMA, workers, concurrency, log)
        try:
            deadline = time.monotonic() + 600
            while queue_busy(conn, SCHEMA):
                if any(p.poll() is not None for p in procs):
                    log.seek(0)
                    raise SystemExit("a worker exited: " + log.read().decode(errors="replace")[-500:])
                if time.monotonic() > deadline:
                    raise SystemExit("the jobs were not drained within 10 minutes")
                time.sleep(0.2)
        finally:
            stop_workers(procs)
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) FROM jobtui.job WHERE id >= %s",
            (first_id,),
        ).fetchone()
        assert row is not None
        return float(row[0]) / float(row[1])


def settle(conn: psycopg.Connection[Any], longest: float = 300.0) -> None:
    """Start from the same state every time: no autovacuum worker busy anywhere on the server
    (a 5,000,000-row fill sets one off that runs for minutes, beside whatever size is being
    measured), and a checkpoint behind us, so no drain pays for another's dirty pages."""
    deadline = time.monotonic() + longest
    while time.monotonic() < deadline:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'").fetchone()
        if row is not None and row[0] == 0:
            break
        time.sleep(1)
    conn.execute("CHECKPOINT")


def one_round(dsn: str, jobs: int, workers: int, concurrency: int) -> tuple[list[float], float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM jobtui.job").fetchone()
        first_id = int(row[0]) if row else 1
    with Queue(dsn) as queue:
        for start in range(0, jobs, 10_000):
            queue.enqueue_many([NewJob(JOB_TYPE) for _ in range(min(10_000, jobs - start))])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobtui.job")
        settle(conn)
    latency = claim_latency(dsn)
    rate = drain(dsn, workers, concurrency, first_id)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM jobtui.job WHERE id >= %s", (first_id,))
        conn.execute("VACUUM ANALYZE jobtui.job")
    return latency, rate


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--sizes", default="10000,1000000,5000000")
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        version = admin.execute("SHOW server_version").fetchone()
        print(f"PostgreSQL {version[0] if version else '?'}, {os.cpu_count()} CPUs, sizes {sizes}")
    figures: dict[int, dict[str, list[float]]] = {s: {"p50": [], "p99": [], "drain": []} for s in sizes}
    databases = {size: f"{BENCH_DB}_{size}" for size in sizes}
    try:
        for size, name in databases.items():
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            dsn = with_dbname(args.dsn, name)
            start = time.perf_counter()
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrate(conn, SCHEMA)
                conn.execute(FILL_DONE, {"n": size})
                conn.execute("VACUUM ANALYZE jobtui.job")
                row = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('jobtui.job'))").fetchone()
            print(f"{size:>9,} done rows: filled in {time.perf_counter() - start:.0f}s, {row[0] if row else '?'}")
        for r in range(args.rounds):
            order = sizes[r % len(sizes) :] + sizes[: r % len(sizes)]
            for size in order:
                latency, rate = one_round(with_dbname(args.dsn, databases[size]), args.jobs, args.workers,
                                          args.concurrency)  # fmt: skip
                figures[size]["p50"].append(statistics.median(latency))
                figures[size]["p99"].append(p99(latency))
                figures[size]["drain"].append(rate)
                load = os.getloadavg()[0]
                print(f"round {r + 1} {size:>9,} done rows: claim of 10 p50 {statistics.median(latency):.2f} ms "
                      f"p99 {p99(latency):.2f} ms, drain {rate:,.0f} jobs/s (load {load:.1f})", flush=True)  # fmt: skip
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            for name in databases.values():
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    base = sizes[0]
    med: dict[int, dict[str, Any]] = {s: {k: statistics.median(v) for k, v in figures[s].items()} for s in sizes}
    print()
    print(f"{'done rows':>10} | {'claim p50 ms':>12} | {'claim p99 ms':>12} | {'drain jobs/s':>12} | vs {base:,}")
    ok = True
    for s in sizes:
        claim_ratio = med[s]["p50"] / med[base]["p50"]
        drain_ratio = med[s]["drain"] / med[base]["drain"]
        ok &= abs(claim_ratio - 1) <= TOLERANCE and abs(drain_ratio - 1) <= TOLERANCE
        print(f"{s:>10,} | {med[s]['p50']:>12.2f} | {med[s]['p99']:>12.2f} | {med[s]['drain']:>12,.0f} | "
              f"claim {claim_ratio:.2f}x, drain {drain_ratio:.2f}x")  # fmt: skip
    print(f"within {TOLERANCE:.0%} of each other: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
