"""Benchmark of the queue core: bulk enqueue, and claim+complete through jobtui against raw psycopg.

    .venv/bin/python bench/core.py [--dsn DSN] [--jobs N] [--rounds 3]

A benchmark, not a test: it creates its own database (jobtui_bench_core) on the server of
--dsn, migrates it with jobtui.kernel.migrate.migrate, measures, prints a table of medians over
the rounds and drops the database again. Nothing else on the server is touched.

Measured in one run, side by side:

1. Bulk enqueue through `jobtui.Client(dsn).enqueue_many`, in calls of --enqueue-batch jobs:
   without keys (the COPY path, taken at >= 1000 jobs without keys or delays) and, for
   information, with idempotency keys (the INSERT ... unnest path). Next to them, as the
   reference of what the machine allows at that moment, a raw COPY of the same rows with
   psycopg (ids from the sequence, no validation), a transaction per call like the pool's.
   The three run in turn, their order rotating every round.
2. Claim(batch) + complete(batch), single process, at each --claim-batches size, by three
   loops, each completing --prefill jobs:
     raw    handwritten SQL strings executed with psycopg on one autocommit connection;
     core   the Call layer on one autocommit connection:
            run(conn, claim_call(...)) then run(conn, complete_call(leases));
     client Client.claim / Client.complete, which check out a pool connection per call
            (and so run each statement in its own transaction: BEGIN ... COMMIT).
   Every round fills one table with the jobs of all three, and the loops drain it taking
   turns of --slice jobs (the order of the turns rotating), each loop's clock running only
   in its own turns: noise on the shared machine falls on all of them alike. Connections
   and the pool are opened before the clock starts.
   Ratios are against raw: the median of the per-round ratios, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import queue
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.numeric import Int8

from jobtui import Client, NewJob
from jobtui.cli.run import WORKER_GC_THRESHOLD
from jobtui.core.claims import claim_call, complete_call
from jobtui.kernel.db import run, statements
from jobtui.kernel.domain import DEFAULT_MAX_ATTEMPTS
from jobtui.kernel.migrate import migrate

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_DB = "jobtui_bench_core"
JOB_TYPE = "bench.core"
WORKER = "bench-worker"
LEASE_SECONDS = 30.0
TARGET_ENQUEUE = 100_000.0
TARGET_RATIO = 0.70

# The minimal raw loop's claim: what a developer would write by hand for a claim with no levers
# (no pauses, limits or rates, no queue filter, 9 columns back), with positional parameters.
# It isolates the cost of the lever work in jobtui's claim. The exact raw loop (RawLoop with
# exact=True) sends jobtui's own claim and complete text instead, read from sql/claims.sql,
# which isolates the cost of jobtui's Python.
RAW_CLAIM_MINIMAL = """
UPDATE jobtui.job AS j
SET status = 'running', attempts = j.attempts + 1, lease_token = j.lease_token + 1,
    max_attempts = coalesce(j.max_attempts, (%s::int[])[array_position(%s::text[], j.type)], %s),
    locked_by = %s, locked_until = now() + make_interval(secs => %s),
    heartbeat_at = now(), started_at = now()
WHERE j.id = ANY(ARRAY(
        SELECT id FROM jobtui.job
        WHERE status = 'ready' AND run_at <= now() AND type = ANY(%s::text[])
        ORDER BY run_at, id
        LIMIT %s
        FOR UPDATE SKIP LOCKED))
  AND j.status = 'ready'
RETURNING j.id, j.type, j.payload, j.attempts, j.max_attempts, j.lease_token,
          j.locked_until, j.created_at, j.run_at
"""

RAW_COMPLETE = """
UPDATE jobtui.job AS j
SET status = 'done', locked_until = NULL, finished_at = now()
WHERE j.id = ANY(%b::bigint[]) AND j.status = 'running'
  AND j.lease_token = (%s::jsonb ->> j.id::text)::bigint
RETURNING j.id
"""

# As jobtui's complete_deleting (workers started with --delete-on-complete).
RAW_COMPLETE_DELETING = """
WITH gone AS (
    DELETE FROM jobtui.job AS j
    WHERE j.id = ANY(%b::bigint[]) AND j.status = 'running' AND j.idempotency_key IS NULL
      AND j.lease_token = (%s::jsonb ->> j.id::text)::bigint
    RETURNING j.id, j.type, j.attempts, j.locked_by, j.started_at
), counted AS (
    INSERT INTO jobtui.done_tally AS t (minute, type, attempts, worker, jobs, first_started_at, last_finished_at)
    SELECT date_bin('1 minute', now(), timestamptz '2000-01-01 00:00:00+00'), type, attempts,
           coalesce(locked_by, ''), count(*), min(started_at), now()
    FROM gone GROUP BY type, attempts, locked_by
    ON CONFLICT (minute, type, attempts, worker) DO UPDATE
    SET jobs = t.jobs + excluded.jobs,
        first_started_at = least(t.first_started_at, excluded.first_started_at),
        last_finished_at = greatest(t.last_finished_at, excluded.last_finished_at)
)
SELECT id FROM gone
"""

RAW_RESERVE = "SELECT nextval('jobtui.job_id_seq') FROM generate_series(1, %s)"
RAW_COPY = "COPY jobtui.job (id, type, payload, max_attempts) FROM STDIN"


# -- database -----------------------------------------------------------------------------


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def create_database(admin_dsn: str, name: str, synchronous_commit: str) -> str:
    """A fresh, migrated database `name` on the server of `admin_dsn`; its DSN.

    synchronous_commit "server" keeps the server's setting; "on"/"off" set it for every
    connection to this database (off: commits do not wait for the WAL flush, which leaves
    the client's own costs more visible).
    """
    ident = sql.Identifier(name)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(ident))
        if synchronous_commit != "server":
            admin.execute(
                sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(ident, sql.Literal(synchronous_commit))
            )
    dsn = with_dbname(admin_dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
    return dsn


def drop_database(admin_dsn: str, name: str, attempts: int = 10) -> None:
    """Drop the bench database, waiting a little for a server that is restarting."""
    for attempt in range(attempts):
        try:
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            return
        except psycopg.OperationalError as exc:
            if attempt == attempts - 1:
                log(f"could not drop {name} ({str(exc).strip().splitlines()[0]}); drop it by hand")
                return
            time.sleep(3)


def reset(dsn: str) -> None:
    """Empty the queue, so every measured run starts from the same table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobtui.job, jobtui.lease_expiry, jobtui.effect RESTART IDENTITY CASCADE")
        # No run pays for the dirty pages of the one before (needs pg_checkpoint or superuser).
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")


def settle(dsn: str) -> None:
    """Fresh statistics and visibility map after a fill (autovacuum may be off)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobtui.job")


def count_status(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM jobtui.job GROUP BY status").fetchall()
    return {str(s): int(n) for s, n in rows}


# -- workloads ----------------------------------------------------------------------------


def new_jobs(n: int, *, keyed: bool, offset: int = 0) -> list[NewJob]:
    if keyed:
        return [NewJob(JOB_TYPE, {"n": offset + i}, key=f"bench:{offset + i}") for i in range(n)]
    return [NewJob(JOB_TYPE, {"n": offset + i}) for i in range(n)]


def batches(jobs: Sequence[NewJob], size: int) -> list[Sequence[NewJob]]:
    return [jobs[i : i + size] for i in range(0, len(jobs), size)]


def enqueue_raw(conn: psycopg.Connection[Any], chunk: Sequence[NewJob]) -> list[int]:
    """The reference for the COPY path: ids from the sequence, then COPY, no validation."""
    with conn.cursor() as cur:
        cur.execute(RAW_RESERVE, (len(chunk),))
        ids = [r[0] for r in cur.fetchall()]
        with cur.copy(RAW_COPY) as copy:
            for job_id, job in zip(ids, chunk, strict=True):
                copy.write_row((job_id, job.type, json.dumps(job.payload), job.max_attempts))
    conn.commit()
    return ids


def enqueue_run(dsn: str, total: int, batch: int, kind: str) -> float:
    """Jobs/s of one bulk enqueue of `total` jobs in calls of `batch`.

    kind "copy" and "unnest": Client.enqueue_many without and with keys; "raw": enqueue_raw,
    a transaction per call like the Client's pool. The NewJob objects are built before the
    clock starts (they are the caller's data); connections and the pool are opened before
    it too.
    """
    reset(dsn)
    calls = batches(new_jobs(total, keyed=kind == "unnest"), batch)
    with Client(dsn) as q, psycopg.connect(dsn) as conn:
        q.get(0)  # open the pool and its first connection
        conn.rollback()
        t0 = time.perf_counter()
        for chunk in calls:
            ids = enqueue_raw(conn, chunk) if kind == "raw" else q.enqueue_many(chunk)
            if len(ids) != len(chunk):
                raise RuntimeError(f"enqueue returned {len(ids)} ids for {len(chunk)} jobs")
        elapsed = time.perf_counter() - t0
    counts = count_status(dsn)
    if counts.get("ready") != total:
        raise RuntimeError(f"expected {total} ready jobs after enqueue, found {counts}")
    return total / elapsed


def prefill(dsn: str, n: int) -> None:
    reset(dsn)
    with Client(dsn) as q:
        for chunk in batches(new_jobs(n, keyed=False), 10_000):
            q.enqueue_many(chunk)
    settle(dsn)


class RawLoop:
    """Handwritten psycopg on one autocommit connection and one cursor: the minimal claim
    (RAW_CLAIM_MINIMAL), or with `exact` jobtui's own claim and complete statements as
    jobtui sends them (their text read from sql/claims.sql, so it cannot drift)."""

    label = "raw psycopg, one conn"

    def __init__(
        self,
        dsn: str,
        job_type: str = JOB_TYPE,
        worker: str = WORKER,
        delete: bool = False,
        exact: bool = False,
        overlap: bool = False,
    ) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        # As the worker reads its claims: rows in binary, timestamps in UTC (cheapest to load).
        self.conn.execute("SET TimeZone = 'UTC'")
        # With `overlap`, the completions' own connection (drain_overlapped), open from the start
        # as a worker's is, so that its backend's CPU is read from before the drain.
        self.completing: psycopg.Connection[Any] | None = None
        if overlap:
            self.completing = psycopg.connect(dsn, autocommit=True)
            self.completing.execute("SET TimeZone = 'UTC'")
        self.cur = self.conn.cursor(binary=True)
        self.exact = exact
        self.delete = delete
        if exact:
            self.claim: Any = statements()["claim_take"]
            self.complete: Any = statements()["claim_complete_deleting" if delete else "claim_complete"]
            self.complete_kept: Any = statements()["claim_complete"]
        else:
            self.claim = RAW_CLAIM_MINIMAL
            self.complete = RAW_COMPLETE_DELETING if delete else RAW_COMPLETE
        self.types = [job_type]
        self.worker = worker
        self.limits: list[int | None] = [None]  # no per-type limit, as claim_call without max_attempts

    def cycle(self, batch: int) -> int:
        """Claim up to `batch` jobs and complete them; how many were completed."""
        cur = self.cur
        types = self.types
        if self.exact:
            params: Any = {
                "types": types, "max_attempts": self.limits, "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
                "worker": self.worker, "limit": batch, "lease": LEASE_SECONDS, "queue": None,
            }  # fmt: skip
        else:
            params = (self.limits, types, DEFAULT_MAX_ATTEMPTS, self.worker, LEASE_SECONDS, types, batch)
        cur.execute(self.claim, params)
        rows = cur.fetchall()
        if not rows:
            return 0
        # bigint[] in binary, as jobtui sends them (a smallint[] or int[] would be cast per row)
        ids = [Int8(r[0]) for r in rows]
        leases = "{" + ",".join([f'"{r[0]}":{r[5]}' for r in rows]) + "}"  # id -> token, as jobtui's
        if not self.exact:
            cur.execute(self.complete, (ids, leases))
            return len(cur.fetchall())
        cur.execute(self.complete, {"ids": ids, "leases": leases})
        n = len(cur.fetchall())
        if self.delete and n < len(ids):
            # Keyed jobs are not deleted: completed as jobtui's outcome writer completes them.
            cur.execute(self.complete_kept, {"ids": ids, "leases": leases})
            n += len(cur.fetchall())
        return n

    def drain(self, batch: int) -> None:
        """Claim and complete until a claim finds nothing, in a process of its own: with the
        collector threshold of a `jobtui worker` process."""
        gc.set_threshold(WORKER_GC_THRESHOLD, *gc.get_threshold()[1:])
        while self.cycle(batch):
            pass

    def drain_overlapped(self, batch: int) -> None:
        """As drain, with the completions on the second connection (`overlap`), written by a
        thread while the next claim runs, as a worker's producer and completer do: at most two
        claims' jobs are held, claimed and not yet completed (a worker holds at most twice its
        slots), and what was claimed while a completion was written joins the next one."""
        gc.set_threshold(WORKER_GC_THRESHOLD, *gc.get_threshold()[1:])
        assert self.completing is not None, "RawLoop(overlap=True) opens the completing connection"
        cur = self.completing.cursor(binary=True)
        claimed: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
        room = threading.Semaphore(2)
        failed: list[BaseException] = []

        def complete() -> None:
            ended = False
            try:
                while not ended:
                    rows = claimed.get()
                    if rows is None:
                        break
                    batches = 1
                    while True:  # what else was claimed meanwhile joins this write
                        try:
                            more = claimed.get_nowait()
                        except queue.Empty:
                            break
                        if more is None:
                            ended = True
                            break
                        rows += more
                        batches += 1
                    ids = [Int8(r[0]) for r in rows]
                    leases = "{" + ",".join([f'"{r[0]}":{r[5]}' for r in rows]) + "}"
                    cur.execute(self.complete, {"ids": ids, "leases": leases})
                    if len(cur.fetchall()) < len(ids):
                        cur.execute(self.complete_kept, {"ids": ids, "leases": leases})
                        cur.fetchall()
                    for _ in range(batches):
                        room.release()
            except BaseException as exc:  # reported by the claiming thread
                failed.append(exc)
                room.release()

        completer = threading.Thread(target=complete)
        completer.start()
        params = {
            "types": self.types, "max_attempts": self.limits, "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
            "worker": self.worker, "limit": batch, "lease": LEASE_SECONDS, "queue": None,
        }  # fmt: skip
        try:
            while not failed:
                room.acquire()
                if failed:
                    break
                self.cur.execute(self.claim, params)
                rows = self.cur.fetchall()
                if not rows:
                    break
                claimed.put(rows)
        finally:
            claimed.put(None)
            completer.join()
        if failed:
            raise failed[0]

    def close(self) -> None:
        self.conn.close()
        if self.completing is not None:
            self.completing.close()


class CoreLoop:
    """jobtui's Call layer on one autocommit connection: run(conn, claim_call / complete_call)."""

    label = "core Call layer, one conn"

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.types = [JOB_TYPE]

    def cycle(self, batch: int) -> int:
        jobs = run(self.conn, claim_call(self.types, worker=WORKER, limit=batch, lease=LEASE_SECONDS))
        if not jobs:
            return 0
        return len(run(self.conn, complete_call([j.lease for j in jobs])))

    def close(self) -> None:
        self.conn.close()


class ClientLoop:
    """Client.claim / Client.complete: a pool connection and a transaction per call."""

    label = "Client.claim/complete (pool)"

    def __init__(self, dsn: str) -> None:
        self.client = Client(dsn)
        self.client.get(0)  # open the pool and its first connection before the clock runs
        self.types = [JOB_TYPE]

    def cycle(self, batch: int) -> int:
        jobs = self.client.claim(self.types, worker=WORKER, limit=batch, lease=LEASE_SECONDS)
        if not jobs:
            return 0
        return len(self.client.complete([j.lease for j in jobs]))

    def close(self) -> None:
        self.client.close()


LOOPS: dict[str, type[RawLoop | CoreLoop | ClientLoop]] = {"raw": RawLoop, "core": CoreLoop, "client": ClientLoop}


def claim_round(dsn: str, batch: int, quota: int, slice_jobs: int) -> dict[str, float]:
    """Jobs/s of each loop, draining one shared table in alternating slices.

    The table is filled with `quota` jobs per loop. The loops then take turns, each running
    `slice_jobs` jobs' worth of claim+complete cycles on its own connection, the order of the
    turns rotating, until each has completed exactly `quota` jobs. Each loop's clock runs
    only during its own slices, so a burst of noise on the shared machine falls on all of
    them alike, and all of them see the table at the same stages of its draining.
    """
    names = list(LOOPS)
    prefill(dsn, quota * len(names))
    loops = {name: LOOPS[name](dsn) for name in names}
    try:
        elapsed = dict.fromkeys(names, 0.0)
        done = dict.fromkeys(names, 0)
        cycles = max(1, slice_jobs // batch)
        turn = 0
        while any(done[n] < quota for n in names):
            if turn > 10 * len(names) * (quota // batch + 1):
                raise RuntimeError(f"claim loops did not finish: {done}")
            order = names[turn % len(names) :] + names[: turn % len(names)]
            turn += 1
            for name in order:
                loop = loops[name]
                todo = min(cycles, (quota - done[name]) // batch)
                if todo <= 0:
                    continue
                n = 0
                t0 = time.perf_counter()
                for _ in range(todo):
                    n += loop.cycle(batch)
                elapsed[name] += time.perf_counter() - t0
                if n != todo * batch:
                    raise RuntimeError(f"{name} completed {n} jobs in {todo} cycles of {batch}")
                done[name] += n
    finally:
        for loop in loops.values():
            loop.close()
    left = count_status(dsn)
    if left.get("done") != quota * len(names) or len(left) != 1:
        raise RuntimeError(f"expected {quota * len(names)} done jobs, found {left}")
    return {name: done[name] / elapsed[name] for name in names}


# -- report -------------------------------------------------------------------------------


@dataclass
class Results:
    command: str
    settings: dict[str, Any]
    enqueue: dict[str, list[float]] = field(default_factory=dict)
    claim: dict[int, dict[str, list[float]]] = field(default_factory=dict)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    return median([a / b for a, b in zip(num, den, strict=True)])


def fmt_rate(x: float) -> str:
    return f"{x:>10,.0f}"


def fmt_rounds(xs: Sequence[float]) -> str:
    return " ".join(f"{x / 1000:.1f}k" for x in xs)


def verdict(ok: bool) -> str:
    return "meets target" if ok else "BELOW TARGET"


def report(res: Results) -> str:
    s = res.settings
    out = [
        "jobtui core benchmark",
        f"command:  {res.command}",
        f"machine:  {s['machine']}",
        f"versions: {s['versions']}",
        f"settings: {s['rounds']} rounds; enqueue {s['jobs']:,} jobs in calls of {s['enqueue_batch']:,}; "
        f"each claim loop drains {s['prefill']:,} jobs of a shared table in alternating slices of "
        f"{s['slice']:,}; synchronous_commit={s['synchronous_commit']}",
        f"load:     1-min load average {s['load_before']:.1f} at the start, {load_average():.1f} at the end",
        "",
    ]
    if res.enqueue:
        out.append(
            "Bulk enqueue: Client.enqueue_many                 median jobs/s   per round"
            "                 vs raw (paired / of medians)"
        )
    labels = {
        "raw": "raw COPY, no validation (reference)",
        "copy": "COPY path (no keys)",
        "unnest": "unnest path (idempotency keys, info)",
    }
    for name in ("raw", "copy", "unnest"):
        rates = res.enqueue.get(name)
        if not rates:
            continue
        line = f"  {labels[name]:<45}{fmt_rate(median(rates))}   {fmt_rounds(rates):<24}"
        if name != "raw" and res.enqueue.get("raw"):
            raw = res.enqueue["raw"]
            line += f" {paired_ratio(rates, raw):6.0%} / {median(rates) / median(raw):4.0%}"
        if name == "copy":
            line += f"   target >= {TARGET_ENQUEUE:,.0f}: {verdict(median(rates) >= TARGET_ENQUEUE)}"
        out.append(line)
    if res.claim:
        out += [
            *([""] if res.enqueue else []),
            "Claim(batch) + complete(batch), single process  median jobs/s   per round"
            "                 vs raw (paired / of medians)",
        ]
    for batch, by_variant in res.claim.items():
        raw = by_variant["raw"]
        for variant in ("raw", "core", "client"):
            rates = by_variant[variant]
            line = f"  batch {batch:<4} {LOOPS[variant].label:<34}{fmt_rate(median(rates))}   {fmt_rounds(rates):<24}"
            if variant != "raw":
                paired = paired_ratio(rates, raw)
                line += f" {paired:6.0%} / {median(rates) / median(raw):4.0%}"
                if variant == "core":
                    line += f"   target >= {TARGET_RATIO:.0%}: {verdict(paired >= TARGET_RATIO)}"
            out.append(line)
    return "\n".join(out)


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def machine_note(dsn: str) -> tuple[str, str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version'), current_setting('synchronous_commit')").fetchone()
        assert row is not None
        host = conninfo_to_dict(dsn).get("host", "local socket")
    cpus = os.cpu_count()
    machine = f"{cpus} CPUs ({platform.processor() or platform.machine()}), shared with PostgreSQL at {host}"
    versions = (
        f"PostgreSQL {row[0]}, Python {platform.python_version()}, "
        f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), jobtui {version('jobtui')}"
    )
    return machine, versions, str(row[1])


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--dsn",
        default=os.environ.get("JOBTUI_BENCH_DSN") or os.environ.get("JOBTUI_TEST_DSN") or DEFAULT_DSN,
        help=f"a server to create the bench database on (default: $JOBTUI_BENCH_DSN, $JOBTUI_TEST_DSN, {DEFAULT_DSN})",
    )
    p.add_argument("--jobs", type=int, default=200_000, help="jobs per bulk-enqueue run (default 200,000)")
    p.add_argument("--enqueue-batch", type=int, default=10_000, help="jobs per enqueue_many call (default 10,000)")
    p.add_argument("--prefill", type=int, default=50_000, help="jobs drained by each claim loop (default 50,000)")
    p.add_argument(
        "--slice", type=int, default=1000, help="jobs a claim loop runs before the next takes its turn (default 1000)"
    )
    p.add_argument("--claim-batches", default="10,100", help="claim sizes, comma-separated (default 10,100)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported (default 3)")
    p.add_argument("--dbname", default=BENCH_DB, help=f"the bench database, dropped at the end (default {BENCH_DB})")
    p.add_argument(
        "--synchronous-commit",
        choices=["server", "on", "off"],
        default="server",
        help="synchronous_commit for the bench database (default: the server's own)",
    )
    p.add_argument("--skip-enqueue", action="store_true", help="measure the claim loops only")
    p.add_argument("--skip-claim", action="store_true", help="measure bulk enqueue only")
    p.add_argument("--json", type=Path, help="also write the raw figures to this file (e.g. bench/results/core.json)")
    args = p.parse_args(argv)
    if not args.dbname.startswith("jobtui_bench"):
        p.error("--dbname must start with jobtui_bench (the database is dropped at the end)")
    if min(args.jobs, args.enqueue_batch, args.prefill, args.rounds, args.slice) < 1:
        p.error("--jobs, --enqueue-batch, --prefill, --slice and --rounds must be positive")
    args.claim_batch_list = [int(b) for b in args.claim_batches.split(",") if b.strip()]
    if any(b < 1 or args.prefill % b for b in args.claim_batch_list):
        p.error("--prefill must be a multiple of every claim batch size")
    return args


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = shlex.join([".venv/bin/python", "bench/core.py", *(sys.argv[1:] if argv is None else argv)])
    dsn = create_database(args.dsn, args.dbname, args.synchronous_commit)
    try:
        machine, versions, sync_commit = machine_note(dsn)
        res = Results(
            command,
            {
                "machine": machine,
                "versions": versions,
                "synchronous_commit": sync_commit,
                "rounds": args.rounds,
                "jobs": args.jobs,
                "enqueue_batch": args.enqueue_batch,
                "prefill": args.prefill,
                "slice": args.slice,
                "load_before": load_average(),
            },
        )
        if not args.skip_enqueue:
            kinds = ["copy", "raw", "unnest"]
            res.enqueue = {k: [] for k in kinds}
            for r in range(args.rounds):
                # Rotate the order each round: no kind always runs first or last.
                for name in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                    rate = enqueue_run(dsn, args.jobs, args.enqueue_batch, name)
                    res.enqueue[name].append(rate)
                    log(f"round {r + 1} enqueue {name:<6} {rate:>10,.0f} jobs/s")
        if not args.skip_claim:
            for batch in args.claim_batch_list:
                res.claim[batch] = {v: [] for v in LOOPS}
                for r in range(args.rounds):
                    rates = claim_round(dsn, batch, args.prefill, args.slice)
                    for variant, rate in rates.items():
                        res.claim[batch][variant].append(rate)
                    log(f"round {r + 1} batch {batch:<4} " + "  ".join(f"{v} {x:,.0f}" for v, x in rates.items()))
        print()
        print(report(res))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(res.__dict__, indent=2, default=str) + "\n", encoding="utf-8")
    finally:
        drop_database(args.dsn, args.dbname)
    return 0


if __name__ == "__main__":
    sys.exit(main())
