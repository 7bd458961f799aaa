"""`jobtui stats --json` in one process: what the backlog adds without the command's start.

    .venv/bin/python bench/stats_inprocess.py [--dsn DSN] [--dbname jobtui_bench_stats] [--runs 15]
                                              [--backlog backlog] [--empty empty]

A benchmark, not a test. On the database `bench/stats_json.py --keep` leaves (schemas
`backlog` and `empty`; or another filled schema, say `--backlog big` of
`bench/console_refresh.py --keep`, beside an `--empty` schema it migrates when missing), it
runs `jobtui stats --json` through `jobtui.cli.main` in this process, --runs times on each
schema in turns after two runs of warm-up, and prints both medians and their difference. On
a loaded machine the start of a fresh Python process (imports, connecting) varies by seconds
between runs and hides a difference of tens of milliseconds; here it is paid once. Run it
from two checkouts in turns to compare them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import jobtui
from jobtui.cli import main as cli
from jobtui.kernel.migrate import migrate

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--dbname", default="jobtui_bench_stats")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--backlog", default="backlog", help="the filled schema")
    parser.add_argument("--empty", default="empty", help="the empty schema (migrated when missing)")
    args = parser.parse_args(argv)
    params = conninfo_to_dict(args.dsn)
    params["dbname"] = args.dbname
    dsn = make_conninfo("", **params)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, args.empty)
    times: dict[str, list[float]] = {args.backlog: [], args.empty: []}
    for i in range(args.runs + 2):
        for schema in times:
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                cli.main(["--dsn", dsn, "--schema", schema, "stats", "--json"])
            if i >= 2:
                times[schema].append((time.perf_counter() - start) * 1000)
    backlog, empty = statistics.median(times[args.backlog]), statistics.median(times[args.empty])
    print(
        f"{os.path.dirname(jobtui.__file__)}: backlog {backlog:.1f} ms, empty {empty:.1f} ms,"
        f" the backlog adds {backlog - empty:+.1f} ms (medians of {args.runs}, in turns)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
