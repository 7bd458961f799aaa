"""Drain rate through PgBouncer in transaction mode beside the direct one.

    .venv/bin/python bench/pooler.py [--dsn DSN] [--jobs 20000] [--workers 2] [--concurrency 50]
                                     [--pool-size 4] [--rounds 1]

A benchmark, not a test. Each round, for each way in (direct, then through PgBouncer), it
makes a database of its own (jobtui_bench_pooler) on the server of --dsn and migrates it,
enqueues --jobs no-op jobs (through the pooler, for the pooled way), and drains them with
--workers `jobtui worker` processes (each with its scheduler, a tick every second) while a
thread refreshes the console's data (tui.data.DataSource) every second. Through the pooler
every process runs with JOBTUI_POOLER=transaction and no LISTEN (the workers poll every
0.2 s; the direct workers poll as often, and also LISTEN). PgBouncer (Debian's package) is
started by tests/topology.py in front of the server, pool_mode = transaction with
--pool-size server connections, and stopped at the end.

It checks that every job is done, that no worker logged an ERROR and that every console
refresh succeeded, and prints a table: the drain rate (jobs / (last finished - first
started), by the rows' timestamps), the bulk enqueue time, and the refreshes. Exit code 1
when a check failed. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from jobtui import Client, NewJob, migrate  # noqa: E402
from jobtui.tui.data import DataSource  # noqa: E402
from tests.topology import PgBouncer  # noqa: E402
from tests.workers import WorkerProcess  # noqa: E402

DEFAULT_DSN = os.environ.get("JOBTUI_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
BENCH_DB = "jobtui_bench_pooler"
APP = "tests.apps.topology_app:jobs"


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def recreate(admin_dsn: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    direct = with_dbname(admin_dsn, BENCH_DB)
    with psycopg.connect(direct, autocommit=True) as conn:
        migrate.migrate(conn)
    return direct


class Refresher(threading.Thread):
    """The console's refresh, once a second, counting successes and failures."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.source = DataSource(dsn, "jobtui")
        self.done = threading.Event()
        self.ok = 0
        self.failed: list[str] = []

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                self.source.fetch()
                self.ok += 1
            except Exception as exc:  # counted and shown: the benchmark fails on any
                self.failed.append(f"{type(exc).__name__}: {exc}")
        self.source.close()


def one_way(direct: str, dsn: str, pooled: bool, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    pooler = "transaction" if pooled else "none"
    os.environ["JOBTUI_POOLER"] = pooler  # for the console's refresh, as `jobtui --pooler` sets it
    started = time.perf_counter()
    with Client(dsn, pooler=pooler) as client:
        for i in range(0, args.jobs, 10_000):
            client.enqueue_many([NewJob("topo.noop", {"n": n}) for n in range(i, min(args.jobs, i + 10_000))])
    enqueue = time.perf_counter() - started
    env = {**os.environ, "JOBTUI_DSN": dsn, "JOBTUI_POOLER": pooler, "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    way = "pgbouncer" if pooled else "direct"
    workers = [
        WorkerProcess(
            f"{way}-{i}",
            ["--concurrency", str(args.concurrency), "--poll", "0.2s"],
            env,
            logs / f"{way}-{i}.log",
            app=APP,
        )
        for i in range(args.workers)
    ]
    refresher = Refresher(dsn)
    refresher.start()
    try:
        with psycopg.connect(direct, autocommit=True) as conn:
            deadline = time.monotonic() + 900
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FROM jobtui.job WHERE type = 'topo.noop'"
                ).fetchone()
                assert row is not None
                if row[0] == args.jobs:
                    break
                if any(w.proc.poll() is not None for w in workers) or time.monotonic() > deadline:
                    raise SystemExit("a worker exited or the drain took too long:\n" + workers[0].log()[-3000:])
                time.sleep(0.2)
            span = conn.execute(
                "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8,"
                " count(*) FILTER (WHERE attempts > 1)"
                " FROM jobtui.job WHERE type = 'topo.noop'"
            ).fetchone()
            ticks = conn.execute("SELECT count(*) FROM jobtui.job WHERE type = 'topo.tick'").fetchone()
    finally:
        refresher.done.set()
        refresher.join(10)
        for w in workers:
            w.kill()
    assert span is not None and ticks is not None
    errors = [ln for w in workers for ln in w.log().splitlines() if " ERROR " in ln]
    return {
        "way": way,
        "jobs": int(span[0]),
        "rate": float(span[0]) / float(span[1]),
        "enqueue": enqueue,
        "retried": int(span[2]),
        "ticks": int(ticks[0]),
        "refreshes": refresher.ok,
        "refresh_failures": refresher.failed,
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    # SIGTERM ends the run through the finally blocks: workers, PgBouncer and the database go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a server to make the benchmark's database on")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--pool-size", type=int, default=4, help="PgBouncer's server connections (default 4)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    params = conninfo_to_dict(args.dsn)
    host, port = str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="jobtui-bench-pooler-") as tmp,
        PgBouncer.start(upstream_host=host, upstream_port=port, pool_size=args.pool_size) as bouncer,
    ):
        try:
            for _ in range(args.rounds):
                for pooled in (False, True):
                    direct = recreate(args.dsn)
                    dsn = bouncer.dsn(BENCH_DB) if pooled else direct
                    results.append(one_way(direct, dsn, pooled, args, Path(tmp)))
        finally:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
    print(
        f"{args.jobs} no-op jobs, {args.workers} workers x {args.concurrency}, PgBouncer pool_mode = transaction"
        f" with {args.pool_size} server connections"
    )
    print(f"{'way':<10} {'drain jobs/s':>12} {'enqueue s':>10} {'retried':>8} {'ticks':>6} {'refreshes':>10} errors")
    failed = False
    for r in results:
        bad = r["jobs"] != args.jobs or r["errors"] or r["refresh_failures"]
        failed = failed or bool(bad)
        print(
            f"{r['way']:<10} {r['rate']:>12,.0f} {r['enqueue']:>10.2f} {r['retried']:>8} {r['ticks']:>6}"
            f" {r['refreshes']:>10} {len(r['errors']) + len(r['refresh_failures'])}"
        )
        for line in (r["errors"] + r["refresh_failures"])[:5]:
            print("   ", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
