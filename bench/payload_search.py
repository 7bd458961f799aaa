"""Finding jobs by payload at scale: the search's first page, its progress and its cancel
without an index, the same with the payload's GIN index, and what the index costs enqueues.

    .venv/bin/python bench/payload_search.py [--dsn DSN] [--jobs 5000000] [--dbname bench_i28]

A benchmark, not a test: it creates its own database (--dbname), fills it with --jobs jobs
(ready, done and dead, in the proportions of a backlog during an incident, each with a
payload naming one of 100,000 accounts, and one account, `acme`, with a thousandth of the
jobs), measures, prints and drops the database. Measured:

1. without an index: the first page (50 jobs) of a common account (acme) and of a rare one
   (10 jobs), how many windows the search read (each one a progress step), and how long a
   cancel takes to end a search that reads (from `conn.cancel_safe()`, as the console does,
   to the error in the searching thread);
2. the index built with `jobtui index payload` (CREATE INDEX CONCURRENTLY): time, size;
3. with the index: the same first pages;
4. bulk enqueue (`enqueue_many`, COPY) of 50,000 jobs with and without the index, in turns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui import Client, JobFilter, NewJob, SearchCancelled
from jobtui.kernel.migrate import migrate
from jobtui.reads.jobquery import search

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
SEARCHES = (("common (acme, 1 in 1,000)", {"account": "acme"}), ("rare (1 in 500,000)", {"rare": "needle"}))


def with_dbname(dsn: str, name: str) -> str:
    params: dict[str, Any] = {**conninfo_to_dict(dsn), "dbname": name}
    return make_conninfo("", **params)


def fill(dsn: str, jobs: int) -> None:
    """--jobs rows in one INSERT per million: 70 % done, 25 % ready, 5 % dead."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, jobs, 1_000_000):
            n = min(1_000_000, jobs - start)
            conn.execute(
                """
                INSERT INTO jobtui.job (type, payload, status, finished_at, attempts, max_attempts, last_error,
                                        locked_until)
                SELECT 'sync.account',
                       jsonb_build_object(
                           'account', CASE WHEN i %% 1000 = 7 THEN 'acme' ELSE 'acct-' || (i %% 100000) END,
                           'rare', CASE WHEN i %% 500000 = 11 THEN 'needle' END, 'n', i),
                       CASE WHEN i %% 20 = 0 THEN 'dead' WHEN i %% 4 = 1 THEN 'ready' ELSE 'done' END,
                       CASE WHEN i %% 20 = 0 OR i %% 4 <> 1 THEN now() - interval '30 minutes' END,
                       1, 3, CASE WHEN i %% 20 = 0 THEN 'TimeoutError: the provider did not answer' END, NULL
                FROM generate_series(%s::bigint, %s::bigint) AS i
                """,
                (start + 1, start + n),
            )
            print(f"  filled {start + n:,} jobs", file=sys.stderr, flush=True)
        conn.execute("VACUUM ANALYZE jobtui.job")


def _recorder(into: list[float]) -> Any:
    return lambda done, found: into.append(done)


def first_page(dsn: str, payload: dict[str, Any], runs: int = 3) -> tuple[float, int, int, bool]:
    """Median seconds of the first page of 50; windows read; jobs on it; index used."""
    times, steps, found, indexed = [], 0, 0, False
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(runs):
            windows: list[float] = []
            started = time.perf_counter()
            page = search(conn, JobFilter(payload=payload), limit=50, progress=_recorder(windows))
            times.append(time.perf_counter() - started)
            steps, found, indexed = len(windows), len(page.jobs), page.indexed
    return statistics.median(times), steps, found, indexed


def cancel_latency(dsn: str, after: float = 0.5) -> float:
    """Seconds from cancel_safe() to SearchCancelled in the searching thread."""
    conn = psycopg.connect(dsn, autocommit=True)
    stop = threading.Event()
    ended: list[float] = []

    def searching() -> None:
        try:
            search(conn, JobFilter(payload={"account": "nobody"}), stop=stop)
        except (SearchCancelled, psycopg.errors.QueryCanceled):
            ended.append(time.perf_counter())

    thread = threading.Thread(target=searching)
    thread.start()
    time.sleep(after)
    asked = time.perf_counter()
    stop.set()
    conn.cancel_safe(timeout=1.0)
    thread.join(30)
    conn.close()
    return ended[0] - asked if ended else float("nan")


def enqueue_time(dsn: str, n: int) -> float:
    with Client(dsn) as q:
        started = time.perf_counter()
        for start in range(0, n, 10_000):
            q.enqueue_many([NewJob("bench.enqueue", {"account": f"acct-{i}"}) for i in range(start, start + 10_000)])
        return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    p.add_argument("--jobs", type=int, default=5_000_000)
    p.add_argument("--dbname", default="bench_i28")
    p.add_argument("--keep", action="store_true", help="keep the database (to run it again with --reuse)")
    p.add_argument("--reuse", action="store_true", help="use the database a --keep run left")
    args = p.parse_args(argv)
    admin = with_dbname(args.dsn, "postgres")
    dsn = with_dbname(args.dsn, args.dbname)
    if not args.reuse:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(args.dbname)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        fill(dsn, args.jobs)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP INDEX IF EXISTS jobtui.job_payload_idx")
            size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('jobtui.job'))").fetchone()
        print(f"{args.jobs:,} jobs ({size[0] if size else '?'}); first page of 50, median of 3")
        print("| search | index | seconds | windows read | jobs on the page |\n| --- | --- | ---: | ---: | ---: |")
        for label, payload in (
            ("common (acme, 1 in 1,000)", {"account": "acme"}),
            ("rare (10 jobs)", {"rare": "needle"}),
        ):
            t, steps, found, _ = first_page(dsn, payload)
            print(f"| {label} | none | {t:.3f} | {steps} | {found} |", flush=True)
        print(f"\ncancel, from cancel_safe() to the error in the searching thread: {cancel_latency(dsn):.3f} s")
        started = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "index", "payload"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        print(f"`jobtui index payload`: {time.perf_counter() - started:.1f} s: {out}\n")
        print("| search | index | seconds | windows read | jobs on the page |\n| --- | --- | ---: | ---: | ---: |")
        for label, payload in (
            ("common (acme, 1 in 1,000)", {"account": "acme"}),
            ("rare (10 jobs)", {"rare": "needle"}),
        ):
            t, steps, found, indexed = first_page(dsn, payload)
            print(f"| {label} | {'GIN' if indexed else 'none'} | {t:.3f} | {steps} | {found} |", flush=True)
        with_index, without = [], []
        for _ in range(3):
            with_index.append(enqueue_time(dsn, 50_000))
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DROP INDEX jobtui.job_payload_idx")
            without.append(enqueue_time(dsn, 50_000))
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE INDEX job_payload_idx ON jobtui.job USING gin (payload jsonb_path_ops)")
        a, b = statistics.median(without), statistics.median(with_index)
        print(f"\nenqueue_many of 50,000 jobs, median of 3 in turns: {50_000 / a:,.0f} jobs/s without the index,"
              f" {50_000 / b:,.0f} with it ({b / a - 1:+.0%} time)")  # fmt: skip
    finally:
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
