"""A bulk requeue of a million dead jobs while two workers drain another queue: how long it
takes, whether it holds locks long, what it costs the other queue, and that a run killed
half-way and run again requeues every job once.

    .venv/bin/python bench/bulk_requeue.py [--dsn DSN] [--dead 1000000] [--live 3000000]
                                           [--batch 1000] [--dbname bench_i28b]

A benchmark, not a test: it creates its own database (--dbname), fills it with --dead dead
jobs (queue `dead`, type bench.dead, which no worker runs) and --live ready no-op jobs
(queue `live`), starts two `jobtui worker --queues live=50` processes, and measures:

1. the live queue's drain rate over --baseline seconds before the bulk action;
2. `jobtui bulk requeue --queue dead --yes`, killed (SIGKILL) once half the jobs are
   requeued, then the same command again, which resumes it: the time of each part;
3. meanwhile, every 50 ms, from pg_stat_activity and pg_locks: the longest a transaction of
   the bulk command stayed open (it holds the row locks of its batch), the longest any
   session waited for a lock on the job table, and the live queue's drain rate during it;
4. at the end, that every dead job was requeued exactly once (its history holds one
   `requeued` entry) and none is dead any more.
"""

from __future__ import annotations

import argparse
import os
import signal
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

from jobtui.core.bulk import Bulk
from jobtui.kernel.jobfilter import JobFilter
from jobtui.kernel.migrate import migrate

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def with_dbname(dsn: str, name: str) -> str:
    params: dict[str, Any] = {**conninfo_to_dict(dsn), "dbname": name}
    return make_conninfo("", **params)


def one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def fill(dsn: str, dead: int, live: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, dead, 500_000):
            conn.execute(
                "INSERT INTO jobtui.job (type, queue, payload, status, finished_at, attempts, max_attempts, last_error)"
                " SELECT 'bench.dead', 'dead', jsonb_build_object('n', i), 'dead', now() - interval '1 hour', 3, 3,"
                " 'ConnectionError: the provider was down' FROM generate_series(%s::bigint, %s::bigint) AS i",
                (start + 1, min(dead, start + 500_000)),
            )
        for start in range(0, live, 500_000):
            conn.execute(
                "INSERT INTO jobtui.job (type, queue, payload, run_at) SELECT 'bench.noop', 'live', '{}',"
                " now() - interval '2 hours' FROM generate_series(%s::bigint, %s::bigint)",
                (start + 1, min(live, start + 500_000)),
            )
        conn.execute("VACUUM ANALYZE jobtui.job")


class Sampler:
    """Every 50 ms: the bulk command's open transaction, lock waits, the live queue's done jobs."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop = threading.Event()
        self.longest_bulk_xact = 0.0
        self.longest_wait = 0.0
        self.samples = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.05):
                row = conn.execute(
                    """
                    SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start))
                                    FILTER (WHERE query LIKE '%%A batch of a bulk%%' AND xact_start IS NOT NULL), 0),
                           coalesce((SELECT max(extract(epoch FROM clock_timestamp() - l.waitstart))
                                     FROM pg_locks l WHERE NOT l.granted AND l.waitstart IS NOT NULL), 0)
                    FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
                    """
                ).fetchone()
                assert row is not None
                self.longest_bulk_xact = max(self.longest_bulk_xact, float(row[0]))
                self.longest_wait = max(self.longest_wait, float(row[1]))
                self.samples += 1


def live_rate(conn: psycopg.Connection[Any], seconds: float) -> float:
    before = one(conn, "SELECT count(*) FROM jobtui.job WHERE queue = 'live' AND status = 'done'")
    time.sleep(seconds)
    after = one(conn, "SELECT count(*) FROM jobtui.job WHERE queue = 'live' AND status = 'done'")
    return float(after - before) / seconds


def bulk_command(dsn: str, batch: int, rest: float) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    return subprocess.Popen(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "bulk", "requeue", "--queue", "dead", "--yes",
         "--batch", str(batch), "--rest", str(rest)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    p.add_argument("--dead", type=int, default=1_000_000)
    p.add_argument("--live", type=int, default=3_000_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rest", type=float, default=1.0, help="the bulk command's --rest (default 1)")
    p.add_argument("--window", type=float, default=10.0, help="seconds of each turn of the drain comparison")
    p.add_argument("--turns", type=int, default=4, help="turns with the bulk action held, and as many running")
    p.add_argument("--dbname", default="bench_i28b")
    args = p.parse_args(argv)
    admin = with_dbname(args.dsn, "postgres")
    dsn = with_dbname(args.dsn, args.dbname)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(args.dbname)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        fill(dsn, args.dead, args.live)
        env = {**os.environ, "JOBTUI_DSN": dsn}
        for name in ("A", "B"):
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "jobtui.cli", "worker", "--app", "jobtui.cli.bench:jobs", "--queues", "live=50",
                 "--no-scheduler", "--id", name],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))  # fmt: skip
        conn = psycopg.connect(dsn, autocommit=True)
        time.sleep(5)  # the workers start and settle
        print(f"{args.dead:,} dead jobs, {args.live:,} live ones; batches of {args.batch:,}, --rest {args.rest:g}")
        sampler = Sampler(dsn)
        sampler.thread.start()
        # 1. The live queue's drain with the bulk action running and held, in turns of
        # --window seconds (held between two batches: it holds no lock then).
        on = threading.Event()
        stop = threading.Event()
        on.set()

        def between_batches(done: float, changed: int) -> None:
            while not on.is_set() and not stop.is_set():
                on.wait(0.05)

        bulk_conn = psycopg.connect(dsn, autocommit=True)
        job = Bulk(bulk_conn, "requeue", JobFilter(queue="dead"), actor="bench", batch=args.batch, rest=args.rest)
        thread = threading.Thread(target=lambda: job.run(job.start(), progress=between_batches, stop=stop))
        running: list[float] = []
        held: list[float] = []
        on.clear()
        thread.start()
        for turn in range(2 * args.turns):
            if turn % 2:
                on.set()
                running.append(live_rate(conn, args.window))
            else:
                on.clear()
                held.append(live_rate(conn, args.window))
        stop.set()
        on.set()
        thread.join()
        bulk_conn.close()
        first_part = one(conn, "SELECT changed FROM jobtui.bulk_run ORDER BY id DESC LIMIT 1")
        a, b = statistics.median(held), statistics.median(running)
        print(f"live queue, {args.turns} turns of {args.window:g}s each: {a:,.0f} jobs/s with the bulk action held,"
              f" {b:,.0f} with it running ({b / a - 1:+.0%}); it requeued {first_part:,} meanwhile")  # fmt: skip
        # 2. The same command from the shell resumes it; killed at three quarters, and again.
        started = time.monotonic()
        first = bulk_command(dsn, args.batch, args.rest)
        while (one(conn, "SELECT changed FROM jobtui.bulk_run ORDER BY id DESC LIMIT 1") or 0) < args.dead * 3 // 4:
            time.sleep(0.2)
            if first.poll() is not None:
                break
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
        then = one(conn, "SELECT changed FROM jobtui.bulk_run ORDER BY id DESC LIMIT 1")
        second = bulk_command(dsn, args.batch, args.rest)
        out, _ = second.communicate()
        ended = time.monotonic()
        sampler.stop.set()
        sampler.thread.join()
        print(
            f"`jobtui bulk requeue` resumed it: {then - first_part:,} more in {killed_at - started:.1f}s, then killed"
        )
        print(f"and again: {out.strip()} in {ended - killed_at:.1f}s")
        print(f"longest open transaction of the bulk action: {sampler.longest_bulk_xact:.3f}s;")
        print(f"longest lock wait of any session: {sampler.longest_wait:.3f}s ({sampler.samples:,} samples)")
        times = one(
            conn,
            "SELECT count(*) FILTER (WHERE n <> 1) FROM (SELECT (SELECT count(*) FROM jsonb_array_elements(errors) e"
            " WHERE e ->> 'kind' = 'requeued') AS n FROM jobtui.job WHERE queue = 'dead') AS x",
        )
        still_dead = one(conn, "SELECT count(*) FROM jobtui.job WHERE queue = 'dead' AND status = 'dead'")
        print(f"jobs not requeued exactly once: {times}; still dead: {still_dead}")
        conn.close()
    finally:
        for w in workers:
            w.send_signal(signal.SIGKILL)
            w.wait()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
