"""An index migration on a large job table while the queue works: `jobtui migrate` building
migration 0015's index CONCURRENTLY, beside the plain CREATE INDEX that 0015 ran before, in
turns, on a --rows job table while two workers of the previous release drain it and an
enqueuer runs.

    .venv/bin/python bench/migrate_online.py [--dsn DSN] [--rows 5000000] [--ready 1000000]
                                             [--rounds 2] [--dbname bench_migrate]

A benchmark, not a test: it creates its own database (--dbname) on the server of --dsn and
drops it at the end. The table: every migration of this tree but 0015 applied (so that 0015
is the one pending, as on an install upgrading from 0.2.0), then --rows jobs, --ready of them
ready no-op jobs due at times scattered over the last hour in an order unrelated to their
ids, the rest done within the last 20 hours (the workers' archiver leaves them), all with a
small payload. Two `jobtui worker` processes of release 0.2.0 (tests/releases/, the release
an install upgrades from; a worker of this tree would refuse the schema while 0015 is
pending) drain the ready jobs; an enqueuer adds one job every 10 ms and times each.

Each round runs both forms, in an order that alternates:

    online  `jobtui migrate` of this tree: the index built CONCURRENTLY, outside a transaction;
    plain   what migration 0015 ran before this change: CREATE INDEX inside the migration's
            transaction, under the same advisory lock and --lock-timeout (5 s) and its tries
            as the runner of then.

Meanwhile, every 50 ms, pg_locks: every lock wait of a client session other than the
migration's (which waits, CONCURRENTLY, for the transactions older than its build), with
when it began, so that each wait's length is known to 50 ms: the longest wait of an enqueue
(the enqueuer's session) and of a claim or an outcome (the workers'). Printed: the
migration's wall time, the longest waits, the enqueues slower than 1 s and the enqueuer's
slowest, and the jobs the workers finished meanwhile. Between rounds the index is dropped and
0015 forgotten, the ready jobs topped up to --ready.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.core.jobs import enqueue, enqueue_call
from jobtui.kernel.migrate import migrate

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
PREVIOUS = ROOT / "tests" / "releases" / "v0.2.0" / "jobtui-0.1.0-py3-none-any.whl"
INDEX = "job_builtin_ready_idx"
MIGRATOR, ENQUEUER = "bench-migrate", "bench-enqueue"
# What migration 0015 ran before it was an online migration, as the runner of then ran it.
PLAIN = """
import sys, time, psycopg
from psycopg import sql
from jobtui.kernel.migrate import _lock_key
build = ("CREATE INDEX IF NOT EXISTS job_builtin_ready_idx ON jobtui.job (run_at, id)"
         " WHERE status = 'ready' AND queue = 'jobtui.builtin'")
with psycopg.connect(sys.argv[1], autocommit=True, application_name=sys.argv[2]) as conn:
    for attempt in range(1, 61):
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SELECT pg_advisory_xact_lock({})").format(sql.Literal(_lock_key("jobtui"))))
                conn.execute("SELECT set_config('lock_timeout', '5000ms', true)")
                conn.execute(build)
                conn.execute("INSERT INTO jobtui.migration (version, name) VALUES (15, 'builtin_ready_index')")
            break
        except psycopg.errors.LockNotAvailable:
            print("lock not granted in 5s, trying again", flush=True)
            time.sleep(min(10.0, float(attempt)))
"""


def with_dbname(dsn: str, name: str) -> str:
    params: dict[str, Any] = {**conninfo_to_dict(dsn), "dbname": name}
    return make_conninfo("", **params)


def one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def prepare(dsn: str, rows: int, ready: int) -> None:
    """Every migration but 0015, then the table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)  # on an empty table, 0015 is built in the transaction: undone below
        forget(conn)
        done = rows - ready
        for start in range(0, done, 500_000):
            conn.execute(
                "INSERT INTO jobtui.job (type, payload, status, attempts, run_at, started_at, finished_at)"
                " SELECT 'bench.noop', jsonb_build_object('n', i), 'done', 1, t - interval '1 s', t - interval '1 s', t"
                " FROM (SELECT i, now() - random() * interval '20 hours' AS t"
                "       FROM generate_series(%s::bigint, %s::bigint) AS i) AS g",
                (start + 1, min(done, start + 500_000)),
            )
            print(f"  {min(done, start + 500_000):,} done jobs", flush=True)
        top_up(conn, ready)
        conn.execute("VACUUM ANALYZE jobtui.job")


def top_up(conn: psycopg.Connection[Any], ready: int) -> None:
    """Ready jobs up to `ready`, due at times scattered over the last hour."""
    missing = ready - int(one(conn, "SELECT count(*) FROM jobtui.job WHERE status = 'ready'"))
    for start in range(0, max(0, missing), 500_000):
        conn.execute(
            "INSERT INTO jobtui.job (type, payload, run_at) SELECT 'bench.noop', jsonb_build_object('n', i),"
            " now() - random() * interval '1 hour' FROM generate_series(1, %s) AS i",
            (min(missing - start, 500_000),),
        )


def forget(conn: psycopg.Connection[Any]) -> None:
    """As before 0015: no index, no record of it."""
    conn.execute(sql.SQL("DROP INDEX IF EXISTS jobtui.{}").format(sql.Identifier(INDEX)))
    conn.execute("DELETE FROM jobtui.migration WHERE version = 15")


class Sampler:
    """Every 50 ms, the lock waits of client sessions other than the migration's, each by
    pid and start: its length so far. Kept: the longest of the enqueuer's and the rest's."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop = threading.Event()
        self.longest = {"enqueue": 0.0, "claims and outcomes": 0.0}
        self.samples = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, application_name="bench-sampler") as conn:
            while not self.stop.wait(0.05):
                rows = conn.execute(
                    "SELECT a.application_name, max(extract(epoch FROM clock_timestamp() - l.waitstart))"
                    " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE NOT l.granted AND l.waitstart IS NOT NULL AND a.datname = current_database()"
                    " AND a.backend_type = 'client backend' AND a.application_name NOT IN (%s, 'bench-sampler')"
                    " GROUP BY 1",
                    (MIGRATOR,),
                ).fetchall()
                for app, wait in rows:
                    kind = "enqueue" if app == ENQUEUER else "claims and outcomes"
                    self.longest[kind] = max(self.longest[kind], float(wait))
                self.samples += 1


class Enqueuer:
    """One job every 10 ms, each enqueue timed."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop = threading.Event()
        self.times: list[float] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, application_name=ENQUEUER) as conn:
            while not self.stop.wait(0.01):
                started = time.perf_counter()
                enqueue(conn, enqueue_call("bench.enqueued", {}))
                self.times.append(time.perf_counter() - started)


def run_migration(dsn: str, form: str) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    env["PGAPPNAME"] = MIGRATOR
    if form == "online":
        command = [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "migrate"]
    else:
        command = [sys.executable, "-c", PLAIN, dsn, MIGRATOR]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{form} migration failed: {done.stdout}{done.stderr}")
    return took, done.stdout.strip().replace("\n", "; ")


def one_run(dsn: str, form: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        finished_before = int(one(conn, "SELECT count(*) FROM jobtui.job WHERE status = 'done'"))
        sampler, enqueuer = Sampler(dsn), Enqueuer(dsn)
        sampler.thread.start()
        enqueuer.thread.start()
        time.sleep(2.0)  # the enqueuer and the sampler settle
        took, said = run_migration(dsn, form)
        time.sleep(1.0)
        sampler.stop.set()
        enqueuer.stop.set()
        sampler.thread.join()
        enqueuer.thread.join()
        finished = int(one(conn, "SELECT count(*) FROM jobtui.job WHERE status = 'done'")) - finished_before
        valid = one(
            conn,
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
            f"jobtui.{INDEX}",
        )
        recorded = one(conn, "SELECT count(*) FROM jobtui.migration WHERE version = 15")
    assert valid and recorded == 1, (valid, recorded, said)
    times = sorted(enqueuer.times)
    return {
        "form": form,
        "wall": took,
        "enqueue_wait": sampler.longest["enqueue"],
        "worker_wait": sampler.longest["claims and outcomes"],
        "enqueues": len(times),
        "over_1s": sum(t > 1.0 for t in times),
        "slowest": times[-1] if times else 0.0,
        "p99": times[int(len(times) * 0.99)] if times else 0.0,
        "finished": finished,
        "samples": sampler.samples,
        "said": said,
    }


def start_workers(dsn: str, folder: Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "JOBTUI_DSN": dsn, "PYTHONPATH": str(folder)}
    env.pop("DATABASE_URL", None)
    workers = []
    for name in ("A", "B"):
        command = [sys.executable, "-m", "jobtui.cli", "worker", "--app", "jobtui.sizing:jobs", "--id", f"old-{name}",
                   "--concurrency", "10", "--no-scheduler"]  # fmt: skip
        workers.append(subprocess.Popen(command, cwd=folder, env=env, stdout=DEVNULL, stderr=DEVNULL))
    return workers


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--ready", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dbname", default="bench_migrate")
    args = p.parse_args(argv)
    admin = with_dbname(args.dsn, "postgres")
    dsn = with_dbname(args.dsn, args.dbname)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args.dbname)))
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-migrate-") as tmp:
            folder = Path(tmp)
            with zipfile.ZipFile(PREVIOUS) as wheel:
                wheel.extractall(folder)
            print(f"filling {args.rows:,} jobs ({args.ready:,} ready)", flush=True)
            started = time.monotonic()
            prepare(dsn, args.rows, args.ready)
            with psycopg.connect(dsn, autocommit=True) as conn:
                size = one(conn, "SELECT pg_size_pretty(pg_relation_size('jobtui.job'))")
            print(f"  filled in {time.monotonic() - started:.0f}s; the job table: {size}", flush=True)
            workers = start_workers(dsn, folder)
            time.sleep(5)  # the workers start and settle
            runs = []
            for r in range(args.rounds):
                for form in ("online", "plain") if r % 2 == 0 else ("plain", "online"):
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        forget(conn)
                        top_up(conn, args.ready)
                    load = os.getloadavg()[0]
                    result = one_run(dsn, form)
                    runs.append(result)
                    print(
                        f"round {r + 1} {form:6}: migration {result['wall']:.1f}s; longest lock wait of an enqueue"
                        f" {result['enqueue_wait']:.2f}s, of a claim or an outcome {result['worker_wait']:.2f}s;"
                        f" {result['enqueues']} enqueues, {result['over_1s']} over 1 s, slowest"
                        f" {result['slowest']:.2f}s, p99 {result['p99'] * 1000:.0f} ms; {result['finished']:,} jobs"
                        f" finished meanwhile; 1-min load {load:.1f} ({result['said']})",
                        flush=True,
                    )
            print(f"\nmedians of {args.rounds} rounds, {args.rows:,} jobs ({size})")
            print("| form | migration s | longest enqueue wait s | longest claim/outcome wait s |"
                  " enqueues over 1 s | slowest enqueue s |")  # fmt: skip
            print("| --- | ---: | ---: | ---: | ---: | ---: |")
            for form in ("online", "plain"):
                mine = [x for x in runs if x["form"] == form]

                def med(key: str, rows: list[dict[str, Any]] = mine) -> float:
                    return float(statistics.median(x[key] for x in rows))

                print(
                    f"| {form} | {med('wall'):.1f} | {med('enqueue_wait'):.2f} | {med('worker_wait'):.2f} |"
                    f" {med('over_1s'):.0f} | {med('slowest'):.2f} |"
                )
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.dbname)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
