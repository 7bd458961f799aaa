"""Benchmark of what the diagnosis of a backlog costs (`jobtui why`, the console's Why pane) on
a big, scattered backlog: the pages and time of each statement it sends, and the console's
refresh with the diagnosis beside the refresh without it, taking turns.

    .venv/bin/python bench/why_bound.py [--dsn DSN] [--ready 5000000] [--rounds 7] [--dbname NAME]
                                        [--keep] [--reuse]

A benchmark, not a test. It creates its own database (--dbname, jobtui_bench_why by default)
on the server of --dsn and fills it with INSERT ... SELECT generate_series:

    ready    --ready jobs in 4 queues and 8 types, run_at scattered over the last two hours
             at random (the table's order is not the claim order), 10 % delayed up to an
             hour ahead, 5 % retrying after a failed attempt; one queue paused, one limited,
             one type rated
    done     200,000 over the last hour, with their run times
    running  2,000 on 40 workers; 500 lease expiries over the last 15 minutes; a fleet of 50

then VACUUM ANALYZEs and writes the archiver's minute row and two flow spans, as a worker
would. It measures:

1. every statement the refresh with the Why pane open sends (the snapshot, the queue
   overview, the fleet and the six `why_*`), run again under EXPLAIN (ANALYZE, BUFFERS):
   the pages it touched (as tests/integration/test_timer_guard.py counts them, against its
   bound of 2,000) and its median time over --rounds;
2. the console's refresh (`DataSource.fetch`) without the diagnosis and with it, taking
   turns, --rounds each: medians and their ratio;
3. `jobtui why --json` beside `jobtui stats --json`, as commands, taking turns: median wall
   times and their ratio.

The exit status is 1 when a statement touches more than the guard's bound.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any, ClassVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.core.history import record_flow, record_minute
from jobtui.kernel import db
from jobtui.kernel.migrate import migrate
from jobtui.tui import data

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_DB = "jobtui_bench_why"
PAGE_BOUND = 2_000  # as tests/integration/test_timer_guard.py
SCHEMA = "jobtui"

FILL = [
    # The backlog, scattered: each row's run_at is drawn at random, so the heap's order is not
    # the claim order (delays, retries and bursts scatter a real table the same way).
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, queue, last_error)
SELECT 'type_' || (i % 8), 'ready',
       CASE WHEN i % 20 = 0 THEN now() + random() * interval '10 minutes'
            WHEN i % 10 = 0 THEN now() + random() * interval '1 hour'
            ELSE now() - random() * interval '2 hours' END,
       CASE WHEN i % 20 = 0 THEN 1 + i % 3 ELSE 0 END,
       (ARRAY['default', 'reports', 'emails', 'imports'])[1 + i % 4],
       CASE WHEN i % 20 = 0 THEN 'ValueError: try again' END
FROM generate_series(1, {ready}) AS i
""",
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, max_attempts, locked_by, lease_token,
                           queue, created_at, started_at, finished_at)
SELECT 'type_' || (i % 8), 'done', f - interval '3 seconds', 1, 25, 'worker-' || (i % 40), 1,
       (ARRAY['default', 'reports', 'emails', 'imports'])[1 + i % 4], f - interval '3 seconds',
       f - (0.1 + random() * 2) * interval '1 second', f
FROM (SELECT i, now() - random() * interval '1 hour' AS f FROM generate_series(1, 200000) AS i) AS s
""",
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, locked_by, locked_until, lease_token,
                           heartbeat_at, started_at, queue)
SELECT 'type_' || (i % 8), 'running', now() - interval '1 minute', 1, 'worker-' || (i % 40),
       now() + interval '1 day' + i * interval '1 second', 1, now(), now() - random() * interval '30 seconds',
       (ARRAY['default', 'reports', 'emails', 'imports'])[1 + i % 4]
FROM generate_series(1, 2000) AS i
""",
    """
INSERT INTO {schema}.lease_expiry (job_id, job_type, worker, attempt, expired_at, reaped_at, outcome)
SELECT i % 50, 'type_' || (i % 3), 'worker-' || (i % 7), 1, now() - i * interval '1 second',
       now() - i * interval '1 second', 'ready'
FROM generate_series(1, 500) AS i
""",
    """
INSERT INTO {schema}.queue_control (kind, name, max_running, paused_at, paused_by, rate_per_second, changed_by)
VALUES ('queue', 'reports', 3, NULL, NULL, NULL, 'bench'), ('queue', 'emails', NULL, now(), 'bench', NULL, 'bench'),
       ('type', 'type_7', NULL, NULL, NULL, 20, 'bench')
""",
    """
INSERT INTO {schema}.fleet (name, kind, host, pid, version, lost_after, queues, every_queue, types, executor,
                            in_flight, poll, claimed_at)
SELECT 'worker-' || i, 'worker', 'host-' || (i % 10), 1000 + i, '0.3.0', 30,
       CASE WHEN i % 2 = 0 THEN '{{"default": 10, "imports": 5}}'::jsonb ELSE '{{}}'::jsonb END,
       CASE WHEN i % 2 = 1 THEN 20 END,
       ARRAY['type_0', 'type_1', 'type_2', 'type_3', 'type_4', 'type_5', 'type_6', 'type_7'], 'thread', 10, 1.0, now()
FROM generate_series(1, 50) AS i
""",
]


class Recording(psycopg.Cursor[Any]):
    sent: ClassVar[list[tuple[str, Any]]] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.as_string(self.connection) if isinstance(query, sql.Composable) else str(query)
        Recording.sent.append((text.strip(), params))
        return super().execute(query, params, **kwargs)


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def prepare(admin_dsn: str, dbname: str, ready: int, reuse: bool) -> str:
    dsn = with_dbname(admin_dsn, dbname)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if reuse and exists:
            return dsn
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, SCHEMA)
        for text in FILL:
            conn.execute(sql.SQL(text).format(schema=sql.Identifier(SCHEMA), ready=sql.Literal(ready)))
        conn.execute(sql.SQL("VACUUM ANALYZE {}.job").format(sql.Identifier(SCHEMA)))
        record_minute(conn, SCHEMA)
        moment = conn.execute("SELECT now()").fetchone()
        assert moment is not None
        record_flow(conn, SCHEMA, until=moment[0] - timedelta(minutes=2))
        record_flow(conn, SCHEMA, until=moment[0])
    print(f"filled {ready:,} ready jobs in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return dsn


def touched(node: dict[str, Any]) -> int:
    own = sum(
        int(node.get(f"{kind} {what} Blocks", 0))
        for kind in ("Shared", "Local", "Temp")
        for what in ("Hit", "Read")
        if not (kind == "Temp" and what == "Hit")
    )
    return max([own, *(touched(child) for child in node.get("Plans", []))])


def explain(conn: psycopg.Connection[Any], text: str, params: Any) -> tuple[int, float]:
    """Pages touched (the guard's count) and execution time in ms."""
    with conn.transaction(force_rollback=True):
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text, params).fetchone()
    assert row is not None
    plan = row[0][0] if isinstance(row[0], list) else json.loads(row[0])[0]
    return touched(plan["Plan"]), float(plan["Execution Time"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_TEST_DSN", DEFAULT_DSN))
    parser.add_argument("--dbname", default=BENCH_DB)
    parser.add_argument("--ready", type=int, default=5_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="leave the database")
    parser.add_argument("--reuse", action="store_true", help="measure a database left by --keep")
    args = parser.parse_args()
    dsn = prepare(args.dsn, args.dbname, args.ready, args.reuse)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f}, {args.ready:,} ready jobs")
    names = {db.statements(SCHEMA)[n].as_string(None).strip(): n for n in db.query_names()}
    source = data.DataSource(dsn, SCHEMA)
    real = data.connect

    def recording(*a: Any, **k: Any) -> psycopg.Connection[Any]:
        conn = real(*a, **k)
        conn.cursor_factory = Recording
        return conn

    data.connect = recording  # type: ignore[assignment]
    failed = False
    try:
        Recording.sent = []
        source.why_open = True
        source.fetch()
        sent = {names.get(text, text[:40]): (text, params) for text, params in Recording.sent}
        print(f"{'statement':<28} {'pages':>7} {'ms (median)':>12}")
        with psycopg.connect(dsn) as conn:
            for name, (text, params) in sorted(sent.items()):
                runs = [explain(conn, text, params) for _ in range(args.rounds)]
                pages = max(p for p, _ in runs)
                failed |= pages > PAGE_BOUND
                flag = "  OVER THE BOUND" if pages > PAGE_BOUND else ""
                print(f"{name:<28} {pages:>7,} {statistics.median(t for _, t in runs):>12.1f}{flag}")
        # The refresh without the diagnosis and with it, taking turns.
        without, with_why = [], []
        for _ in range(args.rounds):
            for wanted, into in ((False, without), (True, with_why)):
                source.why_open = wanted
                started = time.perf_counter()
                source.fetch()
                into.append((time.perf_counter() - started) * 1000)
        a, b = statistics.median(without), statistics.median(with_why)
        print(f"refresh without the diagnosis: median {a:.0f} ms; with it: {b:.0f} ms ({b / a:.2f}x)")
    finally:
        data.connect = real  # type: ignore[assignment]
        source.close()
    # The commands, taking turns: `stats --json` reads the snapshot alone.
    walls: dict[str, list[float]] = {"stats": [], "why": []}
    for _ in range(max(3, args.rounds // 2)):
        for what in walls:
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, what, "--json"], capture_output=True, check=False
            )
            walls[what].append(time.perf_counter() - started)
            assert done.returncode in (0, 1), done.stderr
    a, b = statistics.median(walls["stats"]), statistics.median(walls["why"])
    print(
        f"jobtui stats --json: median {a:.2f} s wall; jobtui why --json: {b:.2f} s ({b / a:.2f}x; the"
        " interpreter's start included)"
    )
    if not args.keep:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
