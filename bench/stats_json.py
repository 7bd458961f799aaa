"""Benchmark of `jobtui stats --json` on a big ready backlog beside an empty queue.

    .venv/bin/python bench/stats_json.py [--dsn DSN] [--ready 1000000] [--runs 7] [--dbname NAME]
                                         [--max-extra-ms 100] [--keep] [--reuse]

A benchmark, not a test. It creates its own database (--dbname, jobtui_bench_stats by
default) with two schemas: `backlog`, --ready ready jobs in three queues (98 % default, 1 %
reports with a limit, 1 % emails paused; 10 % delayed; run_at scattered over the table's
order, not in claim order) and the archiver's minute row, and
`empty`, a migrated schema with no job. Then it runs the real command, `python -m jobtui.cli
--schema S stats --json`, --runs times on each, taking turns, and prints the median wall time
of each and what the backlog adds. A command's start (Python, imports, connecting) is the same
on both, so the difference is what the backlog costs the figures. The exit status is 1 when the
backlog adds more than --max-extra-ms to the median.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.core.history import record_minute
from jobtui.kernel.migrate import migrate

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_DB = "jobtui_bench_stats"
FILL = [
    # run_at scattered over the table's order (i * 7919 mod n visits every slot once, out of
    # order), as delays, retries and bursts make it: in claim order each next job sits on
    # another page.
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, queue)
SELECT 'type_' || (i % 6), 'ready',
       CASE WHEN i % 10 = 0 THEN now() + ((i::bigint * 7919) % {ready}) * interval '3600 seconds' / {ready}
            ELSE now() - ((i::bigint * 7919) % {ready}) * interval '3600 seconds' / {ready} END, 0,
       CASE WHEN i % 100 = 1 THEN 'reports' WHEN i % 100 = 2 THEN 'emails' ELSE 'default' END
FROM generate_series(1, {ready}) AS i
""",
    """
INSERT INTO {schema}.queue_control (kind, name, max_running, paused_at, paused_by, changed_by)
VALUES ('queue', 'reports', 3, NULL, NULL, 'bench'), ('queue', 'emails', NULL, now(), 'bench', 'bench')
""",
]


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def prepare(admin_dsn: str, dbname: str, ready: int, reuse: bool) -> str:
    dsn = with_dbname(admin_dsn, dbname)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if reuse and exists:
            print(f"reusing {dbname}")
            return dsn
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, "empty")
        migrate(conn, "backlog")
        start = time.perf_counter()
        for text in FILL:
            conn.execute(sql.SQL(text).format(schema=sql.Identifier("backlog"), ready=sql.Literal(ready)))  # type: ignore[arg-type]
        for schema in ("backlog", "empty"):
            conn.execute(sql.SQL("VACUUM ANALYZE {}.job").format(sql.Identifier(schema)))
            record_minute(conn, schema)  # what the archiver writes once a minute
        print(f"backlog: {ready:,} ready jobs filled in {time.perf_counter() - start:.0f}s")
    return dsn


def stats_json(dsn: str, schema: str) -> float:
    """Milliseconds of one `jobtui stats --json`, start to exit."""
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "--schema", schema, "stats", "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        raise SystemExit(f"stats --json on {schema} failed: {done.stderr.strip()}")
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--ready", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--dbname", default=BENCH_DB, help=f"the bench database, dropped at the end ({BENCH_DB})")
    parser.add_argument("--max-extra-ms", type=float, default=100.0)
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    parser.add_argument("--reuse", action="store_true", help="measure the database an earlier --keep left")
    args = parser.parse_args(argv)
    if not args.dbname.startswith("jobtui_bench"):
        parser.error("--dbname must start with jobtui_bench (the database is dropped at the end)")
    print(f"python {platform.python_version()}, psycopg {psycopg.__version__}, {os.cpu_count()} CPUs")
    dsn = prepare(args.dsn, args.dbname, args.ready, args.reuse)
    try:
        stats_json(dsn, "empty")  # warm the server's caches and the interpreter's files
        stats_json(dsn, "backlog")
        times: dict[str, list[float]] = {"backlog": [], "empty": []}
        for i in range(args.runs):
            for schema in ("backlog", "empty") if i % 2 == 0 else ("empty", "backlog"):
                times[schema].append(stats_json(dsn, schema))
        medians = {schema: statistics.median(t) for schema, t in times.items()}
        for schema, t in times.items():
            print(f"{schema}: median {medians[schema]:.0f} ms ({', '.join(f'{x:.0f}' for x in t)})")
        extra = medians["backlog"] - medians["empty"]
        print(f"{args.ready:,} ready jobs add {extra:+.0f} ms to stats --json (medians of {args.runs} runs, in turns)")
        met = extra <= args.max_extra_ms
        print(f"  target at most +{args.max_extra_ms:.0f} ms: {'met' if met else 'MISSED'}")
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
