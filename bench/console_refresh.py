"""Benchmark of the console at incident scale: its refresh, its CPU share and its database
backend's, and key-to-screen.

    .venv/bin/python bench/console_refresh.py [--dsn DSN] [--sizes big,small] [--panes ready,queues]
                                              [--seconds 20] [--presses 40] [--dbname NAME]
                                              [--fleet 1000] [--keep] [--reuse]

A benchmark, not a test. It creates its own database (--dbname, jobtui_bench_console by
default) on the server of --dsn, with one schema per size, fills it with INSERT ... SELECT
generate_series, writes the archiver's minute row (as a worker would, once a minute),
VACUUM ANALYZEs (with --no-vacuum: ANALYZEs only, autovacuum off for the table, as a backlog
that grew faster than autovacuum), and measures:

1. the console's refresh (`DataSource.fetch`: the snapshot, the running page and the queues
   and types), median and p95 over --runs refreshes;
2. for each pane of --panes shown, the console left alone for --seconds (the real console,
   JobtuiApp, headless under Textual's pilot, refreshing every second): its process's CPU
   time over wall time, so 10 % is a tenth of one core, and the same for the database
   backend that serves its reads (from /proc: the server must run on this machine);
3. key-to-screen: --presses key presses (pane switches 1/2/3/7, and `s` sorting the Running
   pane), each timed from the press to the first frame the console hands its terminal
   driver that shows the new state (App._display, recorded with the pane and the Running
   table's sort at that moment); p50 and p90.

With --fleet N, each schema also holds a fleet of N processes on N/20 hosts, one in ten lost
(migration 0016), which every refresh reads (the Workers pane, the header's findings); the
line `fleet_list` then says what that read costs alone: its median and the pages it touches.

Sizes (ready jobs in three queues: default, reports with a limit, emails paused; their run_at
scattered over the table's order, as delays, retries and bursts make it, so in claim order
each next job sits on another page; the dead jobs of five types that have no ready job):

    big    5,000,000 ready (10% delayed) + 1,000,000 done (over 24 h) + 10,000 dead + 2,000 running
    small      9,000 ready + 900 done + 100 dead + 20 running (10,020 rows)

Loading the big size takes a few minutes; --keep leaves the database, and --reuse measures
a schema left by an earlier --keep run without filling it again. Targets: median refresh
<= 50 ms, console <= 10 % of a core, key-to-screen p90 <= 100 ms, at both sizes and with
every pane; the exit status is 1 when one is missed. The backend's share is printed beside
the console's: it is what an open console costs the database.
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

from jobtui.core.history import record_minute
from jobtui.kernel.migrate import migrate
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
INSERT INTO {schema}.job (type, status, run_at, attempts, queue)
SELECT 'type_' || (i % 6), 'ready',
       CASE WHEN i % 10 = 0 THEN now() + ((i::bigint * 7919) % {ready}) * interval '3600 seconds' / {ready}
            ELSE now() - ((i::bigint * 7919) % {ready}) * interval '7200 seconds' / {ready} END, 0,
       CASE WHEN i % 50 = 1 THEN 'reports' WHEN i % 50 = 2 THEN 'emails' ELSE 'default' END
FROM generate_series(1, {ready}) AS i
""",
    # The levers of an incident: a limit on one queue, another paused.
    """
INSERT INTO {schema}.queue_control (kind, name, max_running, paused_at, paused_by, changed_by)
VALUES ('queue', 'reports', 3, NULL, NULL, 'bench'), ('queue', 'emails', NULL, now(), 'bench', 'bench')
""",
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, max_attempts, locked_by, last_error,
                           created_at, finished_at)
SELECT 'gone_' || (i % 5), 'dead', now() - interval '8 days', 25, 25, 'worker-' || (i % 16),
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


FLEET = """
INSERT INTO {schema}.fleet (name, kind, host, pid, version, lost_after, queues, every_queue, types,
                            executor, scheduler, in_flight, rss_bytes, state, seen_at)
SELECT 'worker-' || i, 'worker', 'host-' || (i % greatest(1, {fleet} / 20)), 10000 + i, '0.3.0', 30,
       CASE WHEN i % 3 = 0 THEN '{{"reports": 2}}'::jsonb ELSE '{{}}'::jsonb END,
       CASE WHEN i % 3 = 0 THEN NULL ELSE 10 END, ARRAY['type_0', 'type_1', 'type_2', 'type_3', 'type_4', 'type_5'],
       'thread', true, i % 10, 100000000, 'running',
       CASE WHEN i % 10 = 0 THEN now() - interval '5 minutes' ELSE now() + interval '1 day' END
FROM generate_series(1, {fleet}) AS i
"""


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def prepare(admin_dsn: str, dbname: str, sizes: list[str], reuse: bool, fleet: int = 0, vacuum: bool = True) -> str:
    """The benchmark database, with a filled schema per size; without `vacuum`, its job tables
    only ANALYZEd, autovacuum off for them (the visibility map marks no page all-visible)."""
    dsn = with_dbname(admin_dsn, dbname)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if not (reuse and exists):
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for size in sizes:
            present = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{size}.job",)).fetchone()
            migrate(conn, size)
            if reuse and present and present[0]:
                print(f"{size}: reusing the filled schema")
            else:
                start = time.perf_counter()
                job = sql.SQL("{}.job").format(sql.Identifier(size))
                if not vacuum:
                    conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(job))
                for text in FILL:
                    literals = {k: sql.Literal(v) for k, v in SIZES[size].items()}
                    conn.execute(sql.SQL(text).format(schema=sql.Identifier(size), **literals))  # type: ignore[arg-type]
                conn.execute(sql.SQL("VACUUM ANALYZE {}" if vacuum else "ANALYZE {}").format(job))
                print(f"{size}: filled in {time.perf_counter() - start:.0f}s")
            conn.execute(sql.SQL("DELETE FROM {}.fleet").format(sql.Identifier(size)))
            if fleet:
                conn.execute(sql.SQL(FLEET).format(schema=sql.Identifier(size), fleet=sql.Literal(fleet)))
            start = time.perf_counter()
            record_minute(conn, size)  # what the archiver does once a minute
            print(f"{size}: the archiver's minute row took {time.perf_counter() - start:.2f}s to write")
    return dsn


def fleet_read(dsn: str, schema: str, runs: int) -> tuple[float, int]:
    """The fleet's read alone: its median time (ms) and the pages it touches."""
    from jobtui.kernel.db import statements
    from jobtui.reads.fleet import FLEET_LIMIT, read_fleet

    with psycopg.connect(dsn, autocommit=True) as conn:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            read_fleet(conn, schema)
            times.append((time.perf_counter() - start) * 1000)
        text = statements(schema)["fleet_list"].as_string(conn)
        row = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + sql.SQL(text),  # type: ignore[arg-type]
            {"limit": FLEET_LIMIT},
        ).fetchone()
    plan = row[0][0]["Plan"] if row else {}
    pages = int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
    return statistics.median(times), pages


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


def backend_cpu(pid: int) -> float | None:
    """Seconds of CPU the server process `pid` has used (None when /proc cannot tell)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


KEYS = {"ready": "1", "running": "2", "dead": "3", "queues": "7", "workers": "9"}


async def console(
    dsn: str, schema: str, seconds: float, presses: int, panes: list[str]
) -> tuple[dict[str, tuple[float, float | None]], list[float], dict[str, Any]]:
    """For each pane shown: the console's CPU share and its backend's while left alone; then
    its key-to-screen times."""
    app = TimedApp(dsn, schema=schema, read_only=True, refresh_interval=1.0)
    app.frames = []
    shares: dict[str, tuple[float, float | None]] = {}
    async with app.run_test(size=(120, 36)) as pilot:
        while app.latest is None:
            await pilot.pause(0.05)
        pid = app.source.backend_pid()
        for pane in panes:
            await pilot.press(KEYS[pane])
            await pilot.pause(1.0)
            cpu, wall, server = time.process_time(), time.perf_counter(), backend_cpu(pid)
            await asyncio.sleep(seconds)
            elapsed = time.perf_counter() - wall
            after = backend_cpu(pid)
            served = None if server is None or after is None else (after - server) / elapsed
            shares[pane] = ((time.process_time() - cpu) / elapsed, served)
        times: list[float] = []
        table = app.query_one("#table-running", KeyedTable)
        cycle = [("2", "running"), ("s", "running"), ("3", "dead"), ("7", "queues"), ("1", "ready")]
        for i in range(presses):
            key, pane = cycle[i % len(cycle)]
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
            # A type with dead jobs only (gone_*) must not be given a ready backlog.
            "types with ready": sorted(t.type for t in snap.by_type if t.ready) if snap else [],
            "oldest by type": {t.type: round(t.oldest_ready_age) for t in snap.by_type if t.oldest_ready_age}
            if snap
            else {},
            "oldest by queue": {
                q.name: round(q.oldest_age) for q in app.latest.queues if q.kind == "queue" and q.oldest_age
            }
            if app.latest
            else {},
        }
        await app.action_quit()
    return shares, times, seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--sizes", default="big,small")
    parser.add_argument("--panes", default="ready,queues", help=f"panes shown while idle, of {','.join(KEYS)}")
    parser.add_argument("--dbname", default=BENCH_DB, help=f"the bench database, dropped at the end ({BENCH_DB})")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--fleet", type=int, default=1000, help="processes in the fleet of each schema (1000)")
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    parser.add_argument("--reuse", action="store_true", help="measure the schemas an earlier --keep left")
    parser.add_argument(
        "--no-vacuum", action="store_true", help="fill without VACUUM, autovacuum off: as before any vacuum reached it"
    )
    args = parser.parse_args(argv)
    if not args.dbname.startswith("jobtui_bench"):
        parser.error("--dbname must start with jobtui_bench (the database is dropped at the end)")
    sizes = [s for s in args.sizes.split(",") if s]
    panes = [p for p in args.panes.split(",") if p]
    if not set(panes) <= set(KEYS):
        parser.error(f"--panes: choose among {', '.join(KEYS)}")
    print(f"python {platform.python_version()}, psycopg {psycopg.__version__}, {os.cpu_count()} CPUs")
    dsn = prepare(args.dsn, args.dbname, sizes, args.reuse, args.fleet, vacuum=not args.no_vacuum)
    met = True
    try:
        for size in sizes:
            times = refreshes(dsn, size, args.runs)
            shares, keys, seen = asyncio.run(console(dsn, size, args.seconds, args.presses, panes))
            refresh = statistics.median(times)
            p90 = percentile(keys, 0.9)
            print(f"{size}: refresh median {refresh:.1f} ms, p95 {percentile(times, 0.95):.1f} ms; seen {seen}")
            alone, pages = fleet_read(dsn, size, args.runs)
            print(f"{size}: fleet_list of {args.fleet} processes alone: median {alone:.2f} ms, {pages} pages")
            for pane, (share, served) in shares.items():
                backend = "unknown" if served is None else f"{served * 100:.1f} %"
                print(
                    f"{size}, {pane} pane shown for {args.seconds:g}s: console CPU {share * 100:.1f} % of a core,"
                    f" its database backend {backend}"
                )
            print(f"{size}: key-to-screen p50 {percentile(keys, 0.5):.1f} ms, p90 {p90:.1f} ms")
            worst = max(share for share, _ in shares.values())
            for name, ok in (
                (f"refresh median <= {REFRESH_MS:.0f} ms", refresh <= REFRESH_MS),
                (f"console <= {CPU_SHARE * 100:.0f} % of a core, every pane", worst <= CPU_SHARE),
                (f"key-to-screen p90 <= {KEY_P90_MS:.0f} ms", p90 <= KEY_P90_MS),
            ):
                print(f"  target {name}: {'met' if ok else 'MISSED'}")
                met = met and ok
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
            print(f"dropped {args.dbname}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the end: {load}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
