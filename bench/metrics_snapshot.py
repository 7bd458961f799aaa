"""Benchmark of `jobtui.reads.metrics.snapshot()` on a queue table of a million rows.

    .venv/bin/python bench/metrics_snapshot.py [--dsn DSN] [--runs 30] [--warmup 5] [--keep]

A benchmark, not a test: it creates its own database (jobtui_bench_metrics) on the server
of --dsn, migrates it with jobtui.kernel.migrate.migrate, fills it with INSERT ... SELECT
generate_series, measures, and drops the database again (unless --keep). Nothing else on
the server is touched.

The table, like a queue a day into production:

    900,000 done     finished_at spread evenly over the last 24 hours (so ~37,500 in the
                     last hour), attempts mostly 1, some 2-5, over 8 types
     90,000 ready    over 6 types; 10% delayed into the next hour, the rest due up to an hour late
     10,000 dead     varied errors (numbers, hex ids, UUIDs) that group into ~12 fingerprints
        200 running  (besides the million) over 4 workers, 20 of them past their lease
      5,000 lease expiries over the last 24 hours, 24 summarised hours, 20 schedules

then VACUUM ANALYZE. Measured:

1. The whole snapshot, on one autocommit connection, as `jobtui stats` and the Prometheus
   collector take it: median, p95 and min over --runs runs after --warmup runs.
2. Each named statement of the snapshot on its own, run through jobtui.kernel.db.run with a
   Call (median over --runs), so the slow one shows.
3. EXPLAIN (ANALYZE, BUFFERS) of each statement that reads the job table: no Seq Scan on
   job (every one reads a partial index), and the done-last-hour statement reads only the
   last hour's index entries (its index scan returns as many rows as there are done jobs of
   the last hour, with no heap fetches).

The target is a median snapshot of at most 50 ms; the exit status is 1 when it is missed
or when a plan check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.core.maintenance import summarise_hours
from jobtui.kernel.db import Call, run, statements
from jobtui.kernel.donehistory import DoneHistory
from jobtui.kernel.migrate import migrate
from jobtui.reads.metrics import snapshot
from jobtui.tui.data import DataSource

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_DB = "jobtui_bench_metrics"
SCHEMA = "jobtui"
TARGET_MS = 50.0
COLD = "snapshot, a reader's first"
WARM = "snapshot, a reader's next (DoneHistory)"
CONSOLE = "console refresh (DataSource.fetch)"

DONE, READY, DEAD, RUNNING, EXPIRIES, SCHEDULES = 900_000, 90_000, 10_000, 200, 5_000, 20
SIZES = {
    name: sql.Literal(n)
    for name, n in (
        ("done", DONE),
        ("ready", READY),
        ("dead", DEAD),
        ("running", RUNNING),
        ("expiries", EXPIRIES),
        ("schedules", SCHEDULES),
    )
}

# The statements snapshot() runs, in its order, with the parameters it gives them.
SNAPSHOT_QUERIES: list[tuple[str, dict[str, Any]]] = [
    ("metrics_lock_timeout", {"timeout": "2000ms"}),
    ("server_now", {}),
    ("metrics_ready", {"cap": 1000}),
    ("metrics_running", {}),
    ("metrics_dead", {}),
    ("metrics_done_minutes", {"since": None}),
    ("metrics_dead_attempts", {}),
    ("metrics_day", {}),
    ("metrics_lease_expiries", {}),
    ("metrics_lease_expiry_total", {}),
    ("metrics_recent_expiries", {"limit": 50}),
    ("metrics_schedules", {}),
    ("metrics_tables", {"schema_name": SCHEMA}),
    ("metrics_lock_waits", {"schema_name": SCHEMA}),
    ("metrics_oldest_xact", {}),
]
JOB_QUERIES = ["metrics_ready", "metrics_running", "metrics_dead", "metrics_done_minutes", "metrics_dead_attempts"]
CONSOLE_TARGET_MS = 100.0

FILL = [
    # Done: finished_at evenly over the last 24 hours, newest first by id.
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, max_attempts, locked_by, lease_token,
                           heartbeat_at, created_at, started_at, finished_at)
SELECT 'type_' || (i % 8), 'done', f - interval '2 seconds',
       CASE WHEN i % 20 = 0 THEN 2 + i % 4 ELSE 1 END, 25, 'worker-' || (i % 16), 1,
       f - interval '1 second', f - interval '3 seconds', f - interval '1 second', f
FROM (SELECT i, now() - (i * interval '86400 seconds') / {done} AS f
      FROM generate_series(1, {done}) AS i) AS s
""",
    # Ready: 10% delayed (up to an hour ahead), the rest due (up to an hour late).
    """
INSERT INTO {schema}.job (type, status, run_at, attempts)
SELECT 'type_' || (i % 6),
       'ready',
       CASE WHEN i % 10 = 0 THEN now() + (i * interval '3600 seconds') / {ready}
            ELSE now() - (i * interval '3600 seconds') / {ready} END,
       CASE WHEN i % 7 = 0 THEN 1 ELSE 0 END
FROM generate_series(1, {ready}) AS i
""",
    # Dead: errors with numbers, hex ids and UUIDs in them, finished over the last 7 days.
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, max_attempts, locked_by, last_error,
                           created_at, finished_at)
SELECT 'type_' || (i % 5), 'dead', now() - interval '8 days', 25, 25, 'worker-' || (i % 16),
       CASE i % 6
           WHEN 0 THEN format('KeyError: ''user %s''', i) || E'\\nTraceback (most recent call last): ...'
           WHEN 1 THEN format('TimeoutError: upstream %s took %sms', i % 9, 1000 + i)
           WHEN 2 THEN 'ValueError: no order ' || md5(i::text)::uuid::text
           WHEN 3 THEN 'ConnectionError: session ' || substr(md5(i::text), 1, 20) || ' reset'
           WHEN 4 THEN format('RuntimeError: handle 0x%s closed', to_hex(i * 7919))
           ELSE format('lease expired: worker w%s stopped heartbeating during attempt 25 of 25', i % 16)
       END,
       now() - interval '8 days', now() - (i * interval '604800 seconds') / {dead}
FROM generate_series(1, {dead}) AS i
""",
    # Running: 4 workers; every tenth lease expired and not reaped yet.
    """
INSERT INTO {schema}.job (type, status, run_at, attempts, locked_by, locked_until, lease_token,
                           heartbeat_at, started_at)
SELECT 'type_' || (i % 6), 'running', now() - interval '1 minute', 1, 'worker-' || (i % 4),
       CASE WHEN i % 10 = 0 THEN now() - interval '5 seconds' ELSE now() + interval '25 seconds' END,
       1, now() - (i % 30) * interval '1 second', now() - interval '30 seconds'
FROM generate_series(1, {running}) AS i
""",
    """
INSERT INTO {schema}.lease_expiry (job_id, job_type, worker, attempt, expired_at, reaped_at, outcome)
SELECT i, 'type_' || (i % 6), 'worker-' || (i % 4), 1 + i % 3,
       now() - (i * interval '86400 seconds') / {expiries} - interval '10 seconds',
       now() - (i * interval '86400 seconds') / {expiries}, CASE WHEN i % 50 = 0 THEN 'dead' ELSE 'ready' END
FROM generate_series(1, {expiries}) AS i
""",
    """
INSERT INTO {schema}.schedule (name, job_type, cron, next_run_at, last_slot, missed_count, missed_slots)
SELECT 'schedule-' || i, 'type_' || (i % 6), '*/5 * * * *', date_trunc('hour', now()) + interval '1 hour',
       date_trunc('hour', now()), i % 3, '[]'::jsonb
FROM generate_series(1, {schedules}) AS i
""",
]


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def create_database(admin_dsn: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    dsn = with_dbname(admin_dsn, BENCH_DB)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, SCHEMA)
    return dsn


def drop_database(admin_dsn: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))


def fill(dsn: str) -> dict[str, float]:
    """Fill the tables; the seconds each step took."""
    took = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, text in enumerate(FILL):
            start = time.perf_counter()
            conn.execute(sql.SQL(text).format(schema=sql.Identifier(SCHEMA), **SIZES))  # type: ignore[arg-type]
            took[f"fill {i + 1}"] = time.perf_counter() - start
        start = time.perf_counter()
        # The archiver's hourly summaries, as a day of running it leaves them.
        summarise_hours(conn, SCHEMA)
        took["summarise_hours (24 h)"] = time.perf_counter() - start
        start = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        took["vacuum analyze"] = time.perf_counter() - start
    return took


@dataclass
class Timing:
    """Wall-clock milliseconds of each run, and CPU per run: the database backend's time on a
    CPU and waiting for one (from /proc/PID/schedstat; the server is on this machine), and
    this process's. On a shared machine the CPU figures stay put when the wall clock does not:
    wall ~= server CPU + server wait + client CPU + round trips."""

    wall: list[float]
    server_cpu: float | None
    server_wait: float | None
    client_cpu: float

    @property
    def median(self) -> float:
        return statistics.median(self.wall)


def schedstat(pid: int) -> tuple[int, int] | None:
    """Nanoseconds `pid` has run on a CPU and waited for one, or None off Linux / remote."""
    try:
        run_ns, wait_ns, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return None
    return int(run_ns), int(wait_ns)


def timed(fn: Callable[[], Any], runs: int, warmup: int, backend_pid: int) -> Timing:
    for _ in range(warmup):
        fn()
    times = []
    before, client = schedstat(backend_pid), time.thread_time()
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    after, client = schedstat(backend_pid), time.thread_time() - client
    if before is None or after is None:
        return Timing(times, None, None, client * 1000 / runs)
    return Timing(times, (after[0] - before[0]) / 1e6 / runs, (after[1] - before[1]) / 1e6 / runs, client * 1000 / runs)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


@dataclass
class PlanCheck:
    name: str
    execution_ms: float
    scans: list[str]  # one line per node that reads the job table
    problems: list[str]


def done_entries(conn: psycopg.Connection[Any], since: datetime | None) -> int:
    """How many done jobs metrics_done_minutes should read from the index for `since`."""
    query = sql.SQL(
        "SELECT count(*) FROM {}.job WHERE status = 'done' AND finished_at >= greatest(%s::timestamptz, "
        "date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00') - interval '59 minutes')"
    ).format(sql.Identifier(SCHEMA))
    row = conn.execute(query, (since,)).fetchone()
    return int(row[0]) if row else 0


def explain(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> PlanCheck:
    statement = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + statements(SCHEMA)[name]
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    data = row[0] if isinstance(row[0], list) else json.loads(row[0])
    root = data[0]["Plan"]
    scans, problems = [], []
    for node in plan_nodes(root):
        index = node.get("Index Name")
        relation = node.get("Relation Name")
        if relation != "job" and not (index or "").startswith("job_"):
            continue
        blocks = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        line = f"{node['Node Type']}"
        if index:
            line += f" using {index}"
        if relation:
            line += f" on {relation}"
        line += f": {node.get('Actual Rows', 0) * node.get('Actual Loops', 1)} rows, {blocks} buffers"
        if "Heap Fetches" in node:
            line += f", {node['Heap Fetches']} heap fetches"
        if node.get("Rows Removed by Filter"):
            line += f", {node['Rows Removed by Filter']} removed by filter"
        scans.append(line)
        if node["Node Type"] == "Seq Scan":
            problems.append(f"{name}: Seq Scan on job")
        if name == "metrics_done_minutes" and node["Node Type"] in ("Index Only Scan", "Index Scan"):
            if index != "job_finished_idx":
                problems.append(f"{name}: reads {index}, not job_finished_idx")
            read = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
            expected = done_entries(conn, params["since"])
            if abs(read - expected) > max(2, expected // 100):  # jobs age out while we measure
                problems.append(f"{name}: read {read} index entries for {expected} done jobs since {params['since']}")
            if node.get("Heap Fetches", 0):
                problems.append(f"{name}: {node['Heap Fetches']} heap fetches (visibility map not set?)")
    label = f"{name} (since {params['since']:%H:%M})" if params.get("since") else name
    return PlanCheck(label, float(data[0]["Execution Time"]), scans, problems)


def side_by_side(fns: dict[str, tuple[Callable[[], Any], int]], runs: int, warmup: int) -> dict[str, Timing]:
    """Time each function (with the pid of the backend it uses) `runs` times, taking turns,
    so the machine's noise falls on all alike."""
    for _ in range(warmup):
        for fn, _pid in fns.values():
            fn()
    wall: dict[str, list[float]] = {name: [] for name in fns}
    server = {name: [0, 0] for name in fns}
    client = dict.fromkeys(fns, 0.0)
    for _ in range(runs):
        for name, (fn, pid) in fns.items():
            before, cpu = schedstat(pid), time.thread_time()
            start = time.perf_counter()
            fn()
            wall[name].append((time.perf_counter() - start) * 1000)
            client[name] += time.thread_time() - cpu
            after = schedstat(pid)
            if before is not None and after is not None:
                server[name][0] += after[0] - before[0]
                server[name][1] += after[1] - before[1]
    known = all(schedstat(pid) is not None for _fn, pid in fns.values())
    return {
        name: Timing(
            wall[name],
            server[name][0] / 1e6 / runs if known else None,
            server[name][1] / 1e6 / runs if known else None,
            client[name] * 1000 / runs,
        )
        for name in fns
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help=f"keep the {BENCH_DB} database afterwards")
    args = parser.parse_args(argv)

    print(f"python {platform.python_version()}, psycopg {psycopg.__version__}, {os.cpu_count()} CPUs")
    dsn = create_database(args.dsn)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            print(f"PostgreSQL {row[0] if row else '?'}, database {BENCH_DB}")
        start = time.perf_counter()
        took = fill(dsn)
        print(f"filled in {time.perf_counter() - start:.1f}s: " + ", ".join(f"{k} {v:.1f}s" for k, v in took.items()))
        with psycopg.connect(dsn, autocommit=True) as conn:
            job = sql.SQL("{}.job").format(sql.Identifier(SCHEMA))
            counts = dict(
                conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(job)).fetchall()
            )
            size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size(%s))", (f"{SCHEMA}.job",)).fetchone()
            last_hour = conn.execute(
                sql.SQL(
                    "SELECT count(*) FROM {} WHERE status = 'done' AND finished_at > now() - interval '1 hour'"
                ).format(job)
            ).fetchone()
            done_last_hour = int(last_hour[0]) if last_hour else 0
            print(
                f"job table: {counts}, {size[0] if size else '?'} with indexes; done in the last hour: {done_last_hour}"
            )

            snap = snapshot(conn, SCHEMA)
            print(
                f"snapshot: ready {snap.ready} ({snap.ready_due} due), running {snap.running_count} "
                f"({snap.expired_leases} expired), dead {snap.dead_count} in {len(snap.dead)} groups, "
                f"done last hour {sum(snap.attempts_last_hour['done'].values())}, "
                f"done estimate {snap.done_estimate}, lease expiries 24h {sum(snap.lease_expiries_per_hour)}"
            )

            pid = conn.info.backend_pid
            history = DoneHistory()
            source = DataSource(dsn, SCHEMA)
            source.fetch()
            source_pid = source.backend_pid()
            whole = side_by_side(
                {
                    COLD: (lambda: snapshot(conn, SCHEMA), pid),
                    WARM: (lambda: snapshot(conn, SCHEMA, history=history), pid),
                    CONSOLE: (source.fetch, source_pid),
                },
                args.runs,
                args.warmup,
            )
            source.close()
            per_query = {}
            warm_since = history.read_from
            queries = [*SNAPSHOT_QUERIES, ("metrics_done_minutes", {"since": warm_since})]
            for i, (name, params) in enumerate(queries):
                call = Call(name, params, lambda rows: rows)
                label = f"{name} (warm)" if i == len(SNAPSHOT_QUERIES) else name
                per_query[label] = timed(lambda call=call: run(conn, call, SCHEMA), args.runs, 2, pid)  # type: ignore[misc]
            checks = [explain(conn, name, dict(SNAPSHOT_QUERIES)[name]) for name in JOB_QUERIES]
            checks.append(explain(conn, "metrics_done_minutes", {"since": warm_since}))
    finally:
        if not args.keep:
            drop_database(args.dsn)

    print()
    print(f"{args.runs} runs each, taking turns:")
    for name, timing in whole.items():
        print(
            f"  {name:<40} median {timing.median:6.1f} ms, p95 {p95(timing.wall):6.1f} ms,"
            f" min {min(timing.wall):5.1f} ms;"
            f" server CPU {fmt(timing.server_cpu)} ms, waiting for a CPU {fmt(timing.server_wait)} ms,"
            f" client CPU {timing.client_cpu:.2f} ms"
        )
    print()
    print(f"{'statement':<34} {'median ms':>10} {'p95 ms':>8} {'server CPU ms':>14}")
    for name, timing in per_query.items():
        print(f"{name:<34} {timing.median:>10.2f} {p95(timing.wall):>8.2f} {fmt(timing.server_cpu):>14}")
    cold = [t for n, t in per_query.items() if not n.endswith("(warm)")]
    total, cpu = sum(t.median for t in cold), sum(t.server_cpu or 0.0 for t in cold)
    print(f"{'sum (first snapshot)':<34} {total:>10.2f} {'':>8} {cpu:>14.2f}")
    print()
    problems = []
    for check in checks:
        print(f"EXPLAIN ANALYZE {check.name}: {check.execution_ms:.2f} ms")
        for line in check.scans:
            print(f"    {line}")
        problems += check.problems
    print()
    for problem in problems:
        print(f"PLAN PROBLEM: {problem}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the end: {load} on {os.cpu_count()} CPUs")
    verdicts = []
    for name, target in ((COLD, TARGET_MS), (WARM, TARGET_MS), (CONSOLE, CONSOLE_TARGET_MS)):
        median = whole[name].median
        verdicts.append(median <= target)
        print(f"target: {name} median <= {target:.0f} ms: {'met' if median <= target else 'MISSED'} ({median:.1f} ms)")
    print(f"plan checks: {'all pass' if not problems else f'{len(problems)} problem(s)'}")
    if not args.keep:
        print(f"dropped {BENCH_DB}")
    return 0 if all(verdicts) and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
