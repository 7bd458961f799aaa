"""The client's CPU per execution of the worker's statements: as sent, against their text in
the files of jobtui/kernel/sql/ with its comments.

    .venv/bin/python bench/statement_cpu.py [--dsn DSN] [--runs 2000] [--rounds 5]

A benchmark, not a test. In its own database (jobtui_bench_statement_cpu, dropped
afterwards), each round executes the claim (of one job of an empty queue: no row found) and
the complete (of a lease that matches nothing) --runs times in each form, the forms taking
turns, on one connection set up as a worker's claim connection. It prints the process's CPU
time per execution, the medians of the rounds: what the client pays to send a statement and
read its answer, the server's work apart. psycopg parses the placeholders of a statement up
to 4 kB long once and caches them; a longer text is parsed again at every execution.
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
from psycopg.conninfo import make_conninfo

from jobtui.cli.bench import NOOP
from jobtui.core.claims import claim_call, complete_call
from jobtui.kernel.db import Call, _query_texts, statements
from jobtui.kernel.domain import Lease
from jobtui.kernel.migrate import migrate

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "jobtui_bench_statement_cpu"
SCHEMA = "jobtui"


def per_execution(conn: psycopg.Connection[Any], query: sql.SQL, call: Call[Any], runs: int) -> float:
    """CPU microseconds of this process per execution of `query` with `call`'s parameters."""
    start = time.process_time()
    for _ in range(runs):
        with conn.cursor(binary=call.binary) as cur:
            cur.execute(query, call.params)
            if cur.pgresult is not None and cur.pgresult.nfields:
                cur.fetchall()
    return (time.process_time() - start) / runs * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    dsn = make_conninfo(args.dsn, dbname=BENCH_DB)
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(BENCH_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn, SCHEMA)
            conn.execute(statements(SCHEMA)["claim_session"])
            calls: dict[str, Call[Any]] = {
                "claim": claim_call([NOOP], worker="bench", limit=1),
                "complete": complete_call([Lease(-1, 1)]),
            }
            forms: dict[str, dict[str, sql.SQL]] = {
                "as sent": {name: statements(SCHEMA)[name] for name in calls},
                "with comments": {
                    name: sql.SQL(
                        sql.SQL(_query_texts()[name])  # type: ignore[arg-type,unused-ignore]
                        .format(schema=sql.Identifier(SCHEMA), channel=sql.Identifier(f"{SCHEMA}.job"))
                        .as_string(None)
                    )
                    for name in calls
                },
            }
            for form, queries in forms.items():
                sizes = ", ".join(f"{n} {len(q.as_string(None).encode()):,} bytes" for n, q in queries.items())
                print(f"{form:>13}: {sizes}")
            figures: dict[tuple[str, str], list[float]] = {(f, n): [] for f in forms for n in calls}
            for name, call in calls.items():  # warm up: psycopg prepares a statement after 5 runs
                for queries in forms.values():
                    per_execution(conn, queries[name], call, 10)
            for r in range(args.rounds):
                order = list(forms) if r % 2 == 0 else list(reversed(forms))
                for form in order:
                    for name, call in calls.items():
                        figures[(form, name)].append(per_execution(conn, forms[form][name], call, args.runs))
                line = ", ".join(f"{f} {n} {v[-1]:.0f} us" for (f, n), v in figures.items())
                print(f"round {r + 1}: {line} (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(BENCH_DB)))

    print()
    print(f"{'statement':>9} | {'as sent us':>10} | {'with comments us':>16} | as sent / with comments")
    for name in calls:
        sent = statistics.median(figures[("as sent", name)])
        full = statistics.median(figures[("with comments", name)])
        print(f"{name:>9} | {sent:>10.1f} | {full:>16.1f} | {sent / full:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
