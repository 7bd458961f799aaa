"""The job query API as done rows pile up: `Client.jobs` pages and `Client.counts`.

    .venv/bin/python bench/query_api.py [--dsn DSN] [--sizes 10000,1000000] [--runs 15]

A benchmark, not a test. For each size it creates a database of its own (jobtui_bench_query)
on the server of --dsn, migrates it, fills it with that many done jobs plus 1,000 ready and
20 dead ones, runs VACUUM ANALYZE, and times each call (median and max over --runs, after
3 warm-up runs) through a real `jobtui.Client`. Then it drops the database.

The counts of ready, dead and failed jobs read their partial indexes, so they should not
grow with the done rows; counting every status does, since the done rows are counted too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import jobtui

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB = "jobtui_bench_query"
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "jobs(status=dead, limit=50)": ("jobs", {"status": "dead", "limit": 50}),
    "jobs(status=ready, limit=50)": ("jobs", {"status": "ready", "limit": 50}),
    "jobs(limit=50)": ("jobs", {"limit": 50}),
    "jobs(status=dead, error=550)": ("jobs", {"status": "dead", "error": "550"}),
    "count(status=ready)": ("count", {"status": "ready"}),
    "count(status=[dead, failed])": ("count", {"status": ["dead", "failed"]}),
    "counts() (every status)": ("counts", {}),
}


def _fill(dsn: str, done: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobtui.kernel.migrate.migrate(conn)
        conn.execute(
            "INSERT INTO jobtui.job (type, status, attempts, max_attempts, created_at, run_at, started_at, finished_at)"
            " SELECT 'email.send', 'done', 1, 25, t, t, t, t"
            " FROM (SELECT now() - g * interval '50 ms' AS t FROM generate_series(1, %s) g) s",
            (done,),
        )
        conn.execute("INSERT INTO jobtui.job (type, status, attempts, max_attempts, finished_at, last_error)"
                     " SELECT 'email.send', 'dead', 25, 25, now(), 'smtp 550' FROM generate_series(1, 20)")  # fmt: skip
        conn.execute("INSERT INTO jobtui.job (type) SELECT 'email.send' FROM generate_series(1, 1000)")
        conn.execute("VACUUM ANALYZE jobtui.job")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    dsn = make_conninfo("", **{**conninfo_to_dict(args.dsn), "dbname": DB})
    for size in [int(s) for s in args.sizes.split(",")]:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB)))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))
        try:
            _fill(dsn, size)
            print(f"{size:,} done rows, 1,000 ready, 20 dead")
            with jobtui.Client(dsn) as client:
                for label, (method, kwargs) in CALLS.items():
                    times = []
                    for i in range(args.runs + 3):
                        started = time.perf_counter()
                        getattr(client, method)(**kwargs)
                        if i >= 3:
                            times.append(time.perf_counter() - started)
                    print(f"  {label:<30} median {statistics.median(times) * 1000:7.1f} ms"
                          f"   max {max(times) * 1000:7.1f} ms")  # fmt: skip
        finally:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB)))


if __name__ == "__main__":
    main()
