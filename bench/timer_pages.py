"""The pages each statement on a timer touches, on a database an earlier benchmark left.

    .venv/bin/python bench/timer_pages.py --dbname jobtui_bench_console --schema big [--dsn DSN]

A benchmark, not a test: it runs the paths of the timer guard (tests/integration/
test_timer_guard.py: the console's refresh, drill-downs and Why pane, `why --json`, `stats
--json`, `queue list --json`, a Prometheus scrape and a worker's slot for jobtui's own jobs)
on a schema already filled, say by `bench/console_refresh.py --keep` (5,000,000 ready jobs
whose run_at is scattered over the table's order), then each statement they sent again under
EXPLAIN (ANALYZE, BUFFERS), and prints the most pages each statement touched on any path,
largest first. Nothing is written to the database. The exit status is 1 when a statement
touched more than the guard's bound.
"""

from __future__ import annotations

import argparse
import os
import sys

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.integration.test_timer_guard import PAGE_BOUND, pages, run_paths

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--dbname", required=True)
    parser.add_argument("--schema", required=True)
    args = parser.parse_args(argv)
    params = conninfo_to_dict(args.dsn)
    params["dbname"] = args.dbname
    dsn = make_conninfo("", **params)
    most: dict[str, tuple[int, str]] = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        sent = run_paths(dsn, args.schema, monkeypatch)
    with psycopg.connect(dsn) as conn:
        for path, statements in sent.items():
            for statement in statements:
                touched = pages(conn, statement)
                if touched > most.get(statement.name, (-1, ""))[0]:
                    most[statement.name] = (touched, path)
    width = max(len(name) for name in most)
    for name, (touched, path) in sorted(most.items(), key=lambda kv: -kv[1][0]):
        flag = "  OVER THE BOUND" if touched > PAGE_BOUND else ""
        print(f"{name:<{width}}  {touched:>7,} pages  ({path}){flag}")
    return 1 if any(touched > PAGE_BOUND for touched, _ in most.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
