"""Benchmark of the console at incident scale: its refresh, its CPU share, and key-to-screen.

    .venv/bin/python bench/console_refresh.py [--dsn DSN] [--sizes big,small] [--seconds 20]
                                              [--presses 40] [--keep] [--reuse]

A benchmark, not a test. It creates its own database (jobtui_bench_console) on the server
of --dsn, with one schema per size, fills it with INSERT ... SELECT generate_series, writes
the archiver's minute row (as a worker would, once a minute), VACUUM ANALYZEs, and measures:

1. the console's refresh (`DataSource.fetch`: the snapshot and the running page), median and
   p95 over --runs refreshes;
2. the console process's CPU share: the real console (JobtuiApp, headless under Textual's
   pilot, refreshing every second) left alone for --seconds, as process CPU time over wall
   time, so 10 % is a tenth of one core;
3. key-to-screen: --presses key presses (pane switches 1/2/3, and `s` sorting the Running
   pane), each timed from the press to the first frame the console hands its terminal
   driver that shows the new state (App._display, recorded with the pane and the Running
   table's sort at that moment); p50 and p90.

Sizes:

    big    5,000,000 ready (10% delayed) + 1,000,000 done (over 24 h) + 10,000 dead + 2,000 running
    small      9,000 ready + 900 done + 100 dead + 20 running (10,020 rows)

Loading the big size takes a few minutes; --keep leaves the database, and --reuse measures
a schema left by an earlier --keep run without filling it again. Targets: median refresh
<= 50 ms, console <= 10 % of a core, key-to-screen p90 <= 100 ms, at both sizes; the exit
status is 1 when one is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.backlog import record_minute
from jobtui.migrate import migrate
from jobtui.tui.app import JobtuiApp
from jobtui.tui.data import DataSource
from jobtui.tui.widgets import KeyedTable

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_DB = "jobtui_bench_console"
REFRESH_MS, CPU_SHARE, KEY_P90_MS = 50.0, 0.10, 100.0
SIZES = {
    "big": {"ready": 5_000_000, "done": 1_000_000, "dead": 10_000, "running": 2_000},
    "small": {"ready": 9_000, "done": 900, "dead": 100, "running": 20},
}

FILL = [
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, max_attempts, locked_by, lease_token,
                           heartbeat_at, created_at, started_at, finished_at)
SELECT 'type_' || (i % 8), 'done', f - interval '2 seconds', 1, 25, 'worker-' || (i % 16), 1,
       f - interval '1 second', f - interval '3 seconds', f - interval '1 second', f
FROM (SELECT i, now() - (i * interval '86400 seconds') / {done} AS f
      FROM generate_series(1, {done}) AS i) AS s
""",
    """
INSERT INTO {schema}.job (type, status, run_at, attempts)
SELECT 'type_' || (i % 6), 'ready',
       CASE WHEN i % 10 = 0 THEN now() + (i * interval '3600 seconds') / {ready}
            ELSE now() - (i * interval '3600 seconds') / {ready} END, 0
FROM generate_series(1, {ready}) AS i
""",
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, max_attempts, locked_by, last_error,
                           created_at, finished_at)
SELECT 'type_' || (i % 5), 'dead', now() - interval '8 days', 25, 25, 'worker-' || (i % 16),
       format('KeyError: ''user %s''', i % 12) || E'\\nTraceback (most recent call last):\\n  File "x.py", line 1',
       now() - interval '8 days', now() - (i * interval '604800 seconds') / {dead}
FROM generate_series(1, {dead}) AS i
""",
    # Long leases: the running jobs stay running while the benchmark measures.
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, locked_by, locked_until, lease_token,
                           heartbeat_at, started_at)
SELECT 'type_' || (i % 6), 'running', now() - interval '1 minute', 1, 'worker-' || (i % 4),
       now() + interval '1 day' + i * interval '1 second', 1, now(), now() - interval '30 seconds'
FROM generate_series(1, {running}) AS i
""",
]


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def prepare(admin_dsn: str, sizes: list[str], reuse: bool) -> str:
    """The benchmark database, with a filled schema per size."""
    dsn = with_dbname(admin_dsn, BENCH_DB)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (BENCH_DB,)).fetchone()
        if not (reuse and exists):
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for size in sizes:
            present = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{size}.job",)).fetchone()
            migrate(conn, size)
            if reuse and present and present[0]:
                print(f"{size}: reusing the filled schema")
            else:
                start = time.perf_counter()
                for text in FILL:
                    literals = {k: sql.Literal(v) for k, v in SIZES[size].items()}
                    conn.execute(sql.SQL(text).format(schema=sql.Identifier(size), **literals))  # type: ignore[arg-type]
                conn.execute(sql.SQL("VACUUM ANALYZE {}.job").format(sql.Identifier(size)))
                print(f"{size}: filled in {time.perf_counter() - start:.0f}s")
            start = time.perf_counter()
            record_minute(conn, size)  # what the archiver does once a minute
            print(f"{size}: the archiver's minute row took {time.perf_counter() - start:.2f}s to write")
    return dsn


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def refreshes(dsn: str, schema: str, runs: int) -> list[float]:
    source = DataSource(dsn, schema)
    try:
        for _ in range(3):
            source.fetch()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            source.fetch()
            times.append((time.perf_counter() - start) * 1000)
        return times
    finally:
        source.close()


class TimedApp(JobtuiApp):
    """The console, noting when each frame goes to the terminal and what it shows."""

    frames: list[tuple[float, str, tuple[int | None, bool]]]

    def _display(self, screen: Any, renderable: Any) -> None:
        if renderable is not None and self.is_running:
            with contextlib.suppress(Exception):  # before the panes exist
                table = self.query_one("#table-running", KeyedTable)
                self.frames.append((time.perf_counter(), self.pane, (table.sort_column, table.sort_reverse)))
        super()._display(screen, renderable)


async def console(dsn: str, schema: str, seconds: float, presses: int) -> tuple[float, list[float], dict[str, Any]]:
    """The console's CPU share while left alone, and its key-to-screen times."""
    app = TimedApp(dsn, schema=schema, read_only=True, refresh_interval=1.0)
    app.frames = []
    async with app.run_test(size=(120, 36)) as pilot:
        while app.latest is None:
            await pilot.pause(0.05)
        await pilot.pause(1.0)
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        share = (time.process_time() - cpu) / (time.perf_counter() - wall)
        times: list[float] = []
        table = app.query_one("#table-running", KeyedTable)
        for i in range(presses):
            key, pane = [("2", "running"), ("s", "running"), ("3", "dead"), ("1", "ready")][i % 4]
            sort = (table.sort_column, table.sort_reverse)
            start = time.perf_counter()
            await pilot.press(key)
            while True:
                shown = [t for t, p, s in app.frames if t > start and p == pane and (key != "s" or s != sort)]
                if shown:
                    break
                await asyncio.sleep(0.002)
            times.append((shown[0] - start) * 1000)
            await pilot.pause(0.2)
        snap = app.latest.snapshot if app.latest else None
        seen = {
            "ready": snap.ready if snap else 0,
            "exact": snap.ready_estimate is None if snap else True,
            "running shown": len(app.latest.running) if app.latest else 0,
        }
        await app.action_quit()
    return share, times, seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--sizes", default="big,small")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--keep", action="store_true", help=f"keep the {BENCH_DB} database afterwards")
    parser.add_argument("--reuse", action="store_true", help="measure the schemas an earlier --keep left")
    args = parser.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    print(f"python {platform.python_version()}, psycopg {psycopg.__version__}, {os.cpu_count()} CPUs")
    dsn = prepare(args.dsn, sizes, args.reuse)
    met = True
    try:
        for size in sizes:
            times = refreshes(dsn, size, args.runs)
            share, keys, seen = asyncio.run(console(dsn, size, args.seconds, args.presses))
            refresh = statistics.median(times)
            p90 = percentile(keys, 0.9)
            print(
                f"{size}: refresh median {refresh:.1f} ms, p95 {percentile(times, 0.95):.1f} ms; "
                f"console CPU {share * 100:.1f} % of a core over {args.seconds:g}s; "
                f"key-to-screen p50 {percentile(keys, 0.5):.1f} ms, p90 {p90:.1f} ms; seen {seen}"
            )
            for name, ok in (
                (f"refresh median <= {REFRESH_MS:.0f} ms", refresh <= REFRESH_MS),
                (f"console <= {CPU_SHARE * 100:.0f} % of a core", share <= CPU_SHARE),
                (f"key-to-screen p90 <= {KEY_P90_MS:.0f} ms", p90 <= KEY_P90_MS),
            ):
                print(f"  target {name}: {'met' if ok else 'MISSED'}")
                met = met and ok
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
            print(f"dropped {BENCH_DB}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the end: {load}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
