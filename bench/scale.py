"""Does the queue slow down as history piles up? Claims, drains and archiving beside archives
of 0, 10,000,000 and 50,000,000 rows, and pruning 10,000,000 archived rows: by DELETE, as
the archiver did before the archive was partitioned, against dropping their day.

    .venv/bin/python bench/scale.py [--dsn DSN] [--sizes 0,10000000,50000000] [--jobs 50000]
                                    [--rounds 3] [--workers 2] [--concurrency 100]
                                    [--prune-rows 10000000] [--prune-cap 1800] [--skip-prune]

A benchmark, not a test. Each size gets a database of its own (jobtui_bench_scale_<size>,
dropped at the end) on the server of --dsn, migrated, whose job_archive holds that many
archived no-op jobs spread over the last 30 days, in their days' partitions, as the archiver
leaves them; then VACUUM ANALYZE. Per round, the sizes taking turns:

1. enqueue --jobs no-op jobs, VACUUM ANALYZE, wait until no autovacuum worker runs on the
   server, CHECKPOINT;
2. claim latency: 200 claims of 10, each completed before the next, on one connection set up
   as a worker's claim connection; p50 and p99;
3. drain: --workers `jobtui worker` processes (--concurrency each, done rows kept) drain the
   jobs; jobs / (last finished_at - first started_at), on the database's clock;
4. archive: the archiver's sweep moves the round's done jobs into the big archive; jobs/s;
5. the previous release's prune (its archiver's DELETE by archived_at, which a worker of that
   release still runs against the partitioned archive): one batch of up to 5,000 rows of the
   oldest day that are past 30 days, in ms.

Then, unless --skip-prune, in two more databases of --prune-rows archived rows each, all past
the archive's retention (30 days):

- DELETE: the previous release's schema (migrations before 0014: one unpartitioned
  job_archive) and its archiver's statement, in batches of 5,000, each its own transaction,
  until no row is left or --prune-cap seconds have passed (the rate then gives the time);
- DROP: the current schema, the rows in one day's partition, and the archiver's prune: one
  DROP TABLE.

It prints the medians of the rounds, and each size against the smallest as the ratio of the
medians and as the median of the ratios paired by round (the sizes ran minutes apart within a
round, rounds further apart on a machine whose speed drifts). The exit status is 1 when a
size's paired claim or drain ratio is more than 10 % from 1, or the DROP took a second or
more. The largest size needs about 10 GB of disk while
it runs: watch `df -h`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui import Client, NewJob
from jobtui.cli.bench import NOOP as JOB_TYPE
from jobtui.cli.bench import spawn_workers, stop_workers
from jobtui.core.bench import queue_busy
from jobtui.core.claims import claim_call, complete_call
from jobtui.core.maintenance import Retention, prune_archive, sweep
from jobtui.kernel import migrate as migrations
from jobtui.kernel.db import run, statements

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DB = "jobtui_bench_scale"
SCHEMA = "jobtui"
TOLERANCE = 0.10
DAYS = 30
FILL_CHUNK = 1_000_000

# Archived rows of one UTC day (%(day)s days before today), %(n)s of them, as archive_done
# writes them: spread over the day, ids from %(first)s.
FILL_DAY = """
INSERT INTO jobtui.job_archive (id, type, payload, status, run_at, attempts, max_attempts, locked_by,
                                lease_token, heartbeat_at, errors, created_at, started_at, finished_at,
                                archived_at, queue)
SELECT %(first)s + i, 'type_' || (i %% 8), '{}', 'done', a - interval '1 day 3 seconds', 1, 25,
       'worker-' || (i %% 16), 1, a - interval '1 day 1 second', '[]', a - interval '1 day 3 seconds',
       a - interval '1 day 1 second', a - interval '1 day', a, 'default'
FROM (SELECT i, (((now() AT TIME ZONE 'UTC')::date - %(day)s)::timestamp AT TIME ZONE 'UTC')
                + (i * interval '86399 seconds') / %(n)s AS a
      FROM generate_series(1, %(n)s) AS i) AS s
"""

# The archiver's prune before migration 0014 (the previous release's queries.sql).
DELETE_ARCHIVE_BEFORE = """
WITH gone AS (
    DELETE FROM jobtui.job_archive
    WHERE id IN (SELECT id FROM jobtui.job_archive
                 WHERE archived_at < now() - make_interval(secs => %(retention)s)
                 LIMIT %(limit)s)
    RETURNING 1
)
SELECT count(*) FROM gone
"""


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def create(admin_dsn: str, name: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_dbname(admin_dsn, name)


def drop(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def make_day(conn: psycopg.Connection[Any], day: int) -> None:
    """The partition of the UTC day `day` days before today, as archive_partitions_add names it."""
    row = conn.execute(
        "SELECT (now() AT TIME ZONE 'UTC')::date - %s, (now() AT TIME ZONE 'UTC')::date - %s + 1", (day, day)
    ).fetchone()
    assert row is not None
    name = f"job_archive_{row[0]:%Y%m%d}"
    if conn.execute("SELECT to_regclass(%s)", (f"jobtui.{name}",)).fetchone() == (None,):
        conn.execute(
            sql.SQL("CREATE TABLE jobtui.{} PARTITION OF jobtui.job_archive FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(name),
                sql.Literal(f"{row[0]:%Y-%m-%d} 00:00+00"),
                sql.Literal(f"{row[1]:%Y-%m-%d} 00:00+00"),
            )
        )


def fill_archive(conn: psycopg.Connection[Any], rows: int, days: list[int], first_id: int = 10**12) -> None:
    """`rows` archived rows spread evenly over `days` (days before today), in chunks."""
    per_day, extra = divmod(rows, len(days))
    next_id = first_id
    for k, day in enumerate(days):
        n = per_day + (1 if k < extra else 0)
        for start in range(0, n, FILL_CHUNK):
            chunk = min(FILL_CHUNK, n - start)
            conn.execute(FILL_DAY, {"first": next_id, "n": chunk, "day": day})
            next_id += chunk


LATENCY_WORKER = "bench-latency"


def claim_latency(dsn: str, claims: int = 200) -> list[float]:
    """Milliseconds per claim of 10, each batch completed before the next claim."""
    times = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Set up as the worker's claim connection, JIT off included: with JIT the planner's
        # guess of every ready row made each claim of 10 compile for a third of a second.
        conn.execute(statements()["claim_session"])
        for _ in range(claims):
            start = time.perf_counter()
            jobs = run(conn, claim_call([JOB_TYPE], worker=LATENCY_WORKER, limit=10))
            times.append((time.perf_counter() - start) * 1000)
            run(conn, complete_call([j.lease for j in jobs]))
    return times


def drain(dsn: str, workers: int, concurrency: int, first_id: int) -> float:
    """Drain the ready jobs with worker processes; jobs per second from the rows' timestamps."""
    with tempfile.TemporaryFile() as log, psycopg.connect(dsn, autocommit=True) as conn:
        procs = spawn_workers(dsn, SCHEMA, workers, concurrency, log)
        try:
            deadline = time.monotonic() + 600
            while queue_busy(conn, SCHEMA):
                if any(p.poll() is not None for p in procs):
                    log.seek(0)
                    raise SystemExit("a worker exited: " + log.read().decode(errors="replace")[-500:])
                if time.monotonic() > deadline:
                    raise SystemExit("the jobs were not drained within 10 minutes")
                time.sleep(0.2)
        finally:
            stop_workers(procs)
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) FROM jobtui.job"
            " WHERE id >= %s AND type = %s AND locked_by <> %s",  # not the latency's claims before it
            (first_id, JOB_TYPE, LATENCY_WORKER),
        ).fetchone()
        assert row is not None
        return float(row[0]) / float(row[1])


def settle(conn: psycopg.Connection[Any], longest: float = 600.0) -> None:
    """Start from the same state every time: no autovacuum worker busy anywhere on the server
    (a big fill sets them off for minutes, beside whatever size is being measured), and a
    checkpoint behind us, so no drain pays for another's dirty pages."""
    deadline = time.monotonic() + longest
    while time.monotonic() < deadline:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'").fetchone()
        if row is not None and row[0] == 0:
            break
        time.sleep(1)
    conn.execute("CHECKPOINT")


def one_round(dsn: str, jobs: int, workers: int, concurrency: int) -> tuple[list[float], float, float, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM jobtui.job").fetchone()
        first_id = int(row[0]) if row else 1
    with Client(dsn) as client:
        for start in range(0, jobs, 10_000):
            client.enqueue_many([NewJob(JOB_TYPE) for _ in range(min(10_000, jobs - start))])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobtui.job")
        settle(conn)
    latency = claim_latency(dsn)
    rate = drain(dsn, workers, concurrency, first_id)
    with psycopg.connect(dsn, autocommit=True) as conn:
        began = time.perf_counter()
        archived = sweep(conn, Retention(done=0.0, archive=None)).archived
        archive_rate = archived / (time.perf_counter() - began)
        conn.execute("VACUUM ANALYZE jobtui.job")
        began = time.perf_counter()
        conn.execute(DELETE_ARCHIVE_BEFORE, {"retention": DAYS * 86400.0, "limit": 5000})
        old_prune = (time.perf_counter() - began) * 1000
    return latency, rate, archive_rate, old_prune


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def paired(values: list[float], base: list[float]) -> float:
    """The median of the rounds' ratios: each round's figure over the base size's in the same
    round, so that the machine's drift between rounds cancels out."""
    return statistics.median(v / b for v, b in zip(values, base, strict=True))


def size_of(conn: psycopg.Connection[Any], table: str) -> str:
    row = conn.execute(
        "SELECT pg_size_pretty(coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%s)),"
        " pg_total_relation_size(%s)))",
        (table, table),
    ).fetchone()
    return str(row[0]) if row else "?"


def prune_by_delete(admin_dsn: str, rows: int, cap: float) -> tuple[float, int, bool]:
    """(seconds, rows deleted, all gone) of the previous release's DELETE of `rows` archived rows."""
    name = f"{BENCH_DB}_prune_delete"
    dsn = create(admin_dsn, name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA jobtui")
            conn.execute("CREATE TABLE jobtui.migration (version integer PRIMARY KEY, name text NOT NULL,"
                         " applied_at timestamptz NOT NULL DEFAULT now())")  # fmt: skip
            for m in migrations.available():
                if m.name == "archive_partitions":
                    break
                conn.execute(m.text(SCHEMA).encode())
                conn.execute("INSERT INTO jobtui.migration (version, name) VALUES (%s, %s)", (m.version, m.name))
            started = time.perf_counter()
            fill_archive(conn, rows, [DAYS + 10])
            conn.execute("VACUUM ANALYZE jobtui.job_archive")
            print(f"prune by DELETE: {rows:,} rows filled in {time.perf_counter() - started:.0f}s, "
                  f"{size_of(conn, 'jobtui.job_archive')}", flush=True)  # fmt: skip
            settle(conn)
            deleted = 0
            started = time.perf_counter()
            while time.perf_counter() - started < cap:
                row = conn.execute(DELETE_ARCHIVE_BEFORE, {"retention": DAYS * 86400.0, "limit": 5000}).fetchone()
                n = int(row[0]) if row else 0
                deleted += n
                if n < 5000:
                    break
            return time.perf_counter() - started, deleted, deleted == rows
    finally:
        drop(admin_dsn, name)


def prune_by_drop(admin_dsn: str, rows: int) -> float:
    """Seconds the archiver's prune takes to drop a day of `rows` archived rows."""
    name = f"{BENCH_DB}_prune_drop"
    dsn = create(admin_dsn, name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrations.migrate(conn, SCHEMA)
            make_day(conn, DAYS + 10)
            started = time.perf_counter()
            fill_archive(conn, rows, [DAYS + 10])
            conn.execute("VACUUM ANALYZE jobtui.job_archive")
            print(f"prune by DROP: {rows:,} rows filled in {time.perf_counter() - started:.0f}s, "
                  f"{size_of(conn, 'jobtui.job_archive')}", flush=True)  # fmt: skip
            settle(conn)
            started = time.perf_counter()
            dropped, deleted = prune_archive(conn, DAYS * 86400.0, SCHEMA)
            took = time.perf_counter() - started
            left = conn.execute("SELECT count(*) FROM jobtui.job_archive").fetchone()
            if (dropped, deleted, left) != (1, 0, (0,)):
                raise SystemExit(f"the prune dropped {dropped} day(s), deleted {deleted} row(s), left {left}")
            return took
    finally:
        drop(admin_dsn, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--sizes", default="0,10000000,50000000", help="archived rows, comma-separated")
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--prune-rows", type=int, default=10_000_000)
    parser.add_argument("--prune-cap", type=float, default=1800.0, help="seconds the DELETE may run at most")
    parser.add_argument("--skip-prune", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    with psycopg.connect(args.dsn, autocommit=True) as admin:
        version = admin.execute("SHOW server_version").fetchone()
        print(f"PostgreSQL {version[0] if version else '?'}, {os.cpu_count()} CPUs, archived rows {sizes}")
    figures: dict[int, dict[str, list[float]]] = {
        s: {"p50": [], "p99": [], "drain": [], "archive": [], "old_prune": []} for s in sizes
    }
    databases = {size: f"{BENCH_DB}_{size}" for size in sizes}
    ok = True
    try:
        for size, name in databases.items():
            dsn = create(args.dsn, name)
            start = time.perf_counter()
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrations.migrate(conn, SCHEMA)
                days = list(range(1, DAYS + 1))
                for day in days:
                    make_day(conn, day)
                if size:
                    fill_archive(conn, size, days)
                conn.execute("VACUUM ANALYZE jobtui.job_archive")
                print(f"{size:>11,} archived rows: filled in {time.perf_counter() - start:.0f}s, "
                      f"{size_of(conn, 'jobtui.job_archive')}", flush=True)  # fmt: skip
        for r in range(args.rounds):
            order = sizes[r % len(sizes) :] + sizes[: r % len(sizes)]
            for size in order:
                latency, rate, archive_rate, old_prune = one_round(with_dbname(args.dsn, databases[size]), args.jobs,
                                                        args.workers, args.concurrency)  # fmt: skip
                figures[size]["p50"].append(statistics.median(latency))
                figures[size]["p99"].append(p99(latency))
                figures[size]["drain"].append(rate)
                figures[size]["archive"].append(archive_rate)
                figures[size]["old_prune"].append(old_prune)
                print(f"round {r + 1} {size:>11,} archived rows: claim of 10 p50 {statistics.median(latency):.2f} ms "
                      f"p99 {p99(latency):.2f} ms, drain {rate:,.0f} jobs/s, archived at {archive_rate:,.0f} jobs/s, "
                      f"previous release's prune batch {old_prune:,.0f} ms "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    finally:
        for name in databases.values():
            drop(args.dsn, name)

    base = sizes[0]
    med: dict[int, dict[str, Any]] = {s: {k: statistics.median(v) for k, v in figures[s].items()} for s in sizes}
    print()
    print(f"{'archived rows':>13} | {'claim p50 ms':>12} | {'claim p99 ms':>12} | {'drain jobs/s':>12} | "
          f"{'archive jobs/s':>14} | {'old prune ms':>12} | vs {base:,}: medians | paired by round")  # fmt: skip
    for s in sizes:
        claim_ratio = med[s]["p50"] / med[base]["p50"]
        drain_ratio = med[s]["drain"] / med[base]["drain"]
        claim_paired = paired(figures[s]["p50"], figures[base]["p50"])
        drain_paired = paired(figures[s]["drain"], figures[base]["drain"])
        ok &= abs(claim_paired - 1) <= TOLERANCE and abs(drain_paired - 1) <= TOLERANCE
        print(f"{s:>13,} | {med[s]['p50']:>12.2f} | {med[s]['p99']:>12.2f} | {med[s]['drain']:>12,.0f} | "
              f"{med[s]['archive']:>14,.0f} | {med[s]['old_prune']:>12,.0f} | "
              f"claim {claim_ratio:.2f}x, drain {drain_ratio:.2f}x | "
              f"claim {claim_paired:.2f}x, drain {drain_paired:.2f}x")  # fmt: skip
    print(f"claims and drains within {TOLERANCE:.0%} of each other: {'yes' if ok else 'NO'}")

    if not args.skip_prune:
        took, deleted, all_gone = prune_by_delete(args.dsn, args.prune_rows, args.prune_cap)
        if all_gone:
            print(f"prune {args.prune_rows:,} archived rows by DELETE (before 0014): {took:,.1f} s")
        else:
            per_s = deleted / took
            print(f"prune by DELETE (before 0014): {deleted:,} of {args.prune_rows:,} rows in {took:,.0f} s "
                  f"({per_s:,.0f} rows/s; all of them: about {args.prune_rows / per_s:,.0f} s)")  # fmt: skip
        dropped = prune_by_drop(args.dsn, args.prune_rows)
        print(f"prune a day of {args.prune_rows:,} archived rows by DROP: {dropped:.3f} s")
        ok &= dropped < 1.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
