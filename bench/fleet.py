"""What the fleet's registry costs the database: a fleet of N processes refreshing their rows,
and the read of the whole fleet that every console refresh and scrape makes.

    .venv/bin/python bench/fleet.py [--dsn DSN] [--processes 1000] [--rounds 20] [--dbname NAME]

A benchmark, not a test. In its own database (jobtui_bench_fleet, dropped afterwards) it
registers --processes rows with the statement a process registers with (core/members.py), then
runs --rounds rounds in which every row is refreshed once (fleet_refresh, as each process
does every third of its lease, 10 s at most, past its first minutes), and reads:

- a refresh's round trip, median and p95 (what one process spends per interval);
- the refreshes the database could serve per second of the server's CPU, from the backend's
  CPU time in /proc (the server must run on this machine): a fleet of N processes refreshing
  every 10 s sends N/10 a second;
- how many of the refreshes were HOT updates (no index touched), and the table's size in
  pages afterwards, against its size right after registering (what the refreshes bloat);
- the whole fleet read (fleet_list, reads/fleet.py): its median time in this client,
  decoded, and the pages it touches (EXPLAIN ANALYZE, BUFFERS).

A thousand processes refreshing every 10 s is 100 small UPDATEs a second; the figures say
what share of a core that is, and whether the table stays small.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.core.members import Member, Status, refresh_call, register_call
from jobtui.kernel.db import run, statements
from jobtui.kernel.migrate import migrate
from jobtui.reads.fleet import FLEET_LIMIT, read_fleet

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "jobtui_bench_fleet"
TYPES = [f"type_{i}" for i in range(12)] + ["jobtui.archive"]


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def backend_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pages(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_relation_size('jobtui.fleet') / current_setting('block_size')::int").fetchone()
    return int(row[0]) if row else 0


def register(conn: psycopg.Connection[Any], n: int) -> list[int]:
    rows = []
    for i in range(n):
        member = Member(
            f"worker-{i}",
            "worker",
            10.0,
            queues={"reports": 2, "jobtui.builtin": 1} if i % 3 == 0 else {},
            every_queue=None if i % 3 == 0 else 10,
            types=TYPES,
            executor="thread",
            scheduler=True,
            host=f"host-{i % max(1, n // 20)}",
            pid=10_000 + i,
        )
        row, _ = run(conn, register_call(member, Status("running", 3, None, 100_000_000)))
        rows.append(row)
    return rows


def fleet_read(conn: psycopg.Connection[Any], runs: int) -> tuple[float, int]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        read_fleet(conn)
        times.append((time.perf_counter() - start) * 1000)
    text = statements()["fleet_list"].as_string(conn)
    row = conn.execute(
        sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + sql.SQL(text),  # type: ignore[arg-type]
        {"limit": FLEET_LIMIT},
    ).fetchone()
    plan = row[0][0]["Plan"] if row else {}
    return statistics.median(times), int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--processes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dbname", default=BENCH_DB)
    args = parser.parse_args(argv)
    if not args.dbname.startswith("jobtui_bench"):
        parser.error("--dbname must start with jobtui_bench (the database is dropped at the end)")
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
    dsn = with_dbname(args.dsn, args.dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            rows = register(conn, args.processes)
            conn.execute("VACUUM ANALYZE jobtui.fleet")
            before = pages(conn)
            pid = conn.info.backend_pid
            times = []
            cpu = backend_cpu(pid)
            for round_ in range(args.rounds):
                for i, row in enumerate(rows):
                    start = time.perf_counter()
                    run(conn, refresh_call(row, Status("running", (i + round_) % 10, None, 100_000_000), False))
                    times.append((time.perf_counter() - start) * 1000)
            used = backend_cpu(pid) - cpu
            refreshes = len(times)
            time.sleep(0.6)  # the statistics reach pg_stat_user_tables a moment after the transactions
            stats = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'jobtui.fleet'::regclass"
            ).fetchone()
            after = pages(conn)
            read_ms, read_pages = fleet_read(conn, 20)
        ordered = sorted(times)
        print(f"{args.processes} processes, {args.rounds} rounds: {refreshes} refreshes")
        trip = f"median {statistics.median(times):.3f} ms, p95 {ordered[int(0.95 * len(ordered))]:.3f} ms"
        cost = f"; the server's CPU {used / refreshes * 1e6:.0f} us per refresh" if used > 0 else ""
        print(f"refresh round trip: {trip}{cost}")
        if stats is not None and stats[0]:
            print(f"HOT updates: {stats[1]:,} of {stats[0]:,} ({stats[1] / stats[0]:.0%})")
        print(f"table pages: {before} after registering, {after} after the refreshes")
        print(f"fleet_list of {args.processes}: median {read_ms:.2f} ms in this client, {read_pages} pages")
        per_second = args.processes / 10
        if used > 0:
            print(f"a fleet of {args.processes} refreshing every 10 s: {per_second:.0f} refreshes/s,"
                  f" {per_second * used / refreshes:.1%} of one server core")  # fmt: skip
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the end: {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
