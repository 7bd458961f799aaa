"""jobtui beside its peers, PgQueuer, procrastinate and graphile-worker, on the same PostgreSQL.

    .venv/bin/python bench/peers.py [--dsn URL] [--jobs 50000] [--rounds 3] [--only KEY,...]

A benchmark, not a test. It installs the latest PgQueuer and procrastinate from PyPI into
a virtual environment of their own (bench/.peers-venv, never the project's), and runs
every peer's code in subprocesses of that environment, so no dependency of theirs mixes
with ours. graphile-worker (Node.js) is pinned in bench/graphile/package-lock.json and
installed by `npm ci` into bench/graphile/node_modules; without node and npm on PATH its
configurations are skipped. Each configuration gets a database of its own on the server
of --dsn (created and dropped by the run; nothing else on the server is touched), in which it:

1. installs its schema and enqueues --jobs no-op jobs with its own bulk API, then
   VACUUM ANALYZE, so every library starts from the same fresh statistics;
2. drains them with its worker processes, started after the jobs are in. The drain rate is
   jobs / (last finish - first start), both read from the database's own timestamps;
3. with the same workers now idle, enqueues --latency-jobs jobs one by one, one every
   --interval seconds on a fixed schedule (after one warm-up job and half a second), with
   the library's own single-job enqueue from a separate process, and takes each job's
   enqueue-to-start latency from the database, as start time - enqueue time.

Every time is PostgreSQL's now() in the transaction that made the transition, in the row
or the event log each library writes anyway:
    jobtui         job.started_at - job.created_at (latency jobs carry keys, so workers that
                   delete finished jobs keep them); drain: job.started_at, job.finished_at,
                   and for jobs deleted at completion done_tally's first_started_at and
                   last_finished_at (the earliest start and latest finish it counted)
    PgQueuer       pgqueuer_log.created of the job's 'picked' row - of its 'queued' row;
                   drain: first 'picked' to last 'successful' (the log row written with the
                   DELETE that finishes a job)
    procrastinate  procrastinate_events.at of the job's 'started' event - of its 'deferred'
                   event; drain: first 'started' to last 'succeeded'
    raw            the raw loops below, on jobtui's table: drain only

graphile-worker deletes each job as it completes and keeps no timestamps of it, so it
runs as bench/graphile/drain.mjs (see its README), once for the drain and once for the
latency, each in a fresh database: the drain runs from the first to the last of its
parent's 20 ms polls of the job count (on clock_timestamp()) that see jobs gone and none
left; the latency is clock_timestamp() inserted by its task (one more statement after the
claim) - the job's created_at, enqueued by its addJob.

The raw loops are the ceilings: handwritten psycopg on one autocommit connection per
process, claim(batch) then complete(batch) (at batch 200 completing by delete and tally,
as jobtui-best does), until a claim finds nothing, at batch 10 and 200 and with 1 and 2
processes, each with two claims:
    raw-exact      jobtui's own claim and complete statements, their text read from
                   jobtui/kernel/sql/claims.sql (so they cannot drift), sent as jobtui sends
                   them: what jobtui's Python costs is jobtui's gap to it;
    raw-minimal    the minimal claim of bench/core.py, with no lever work (no pause, limit
                   or rate, no queue filter): its gap to raw-exact is the server's lever work.

Over each drain it also reads CPU time (utime + stime, /proc; bench/peer_cpu.py), sampled
every 75 ms between the start of the workers and the end of the drain, and taken over the
drain's own window (its first start to its last finish, as above), per job drained:
    server         the backends connected to the configuration's database (pg_stat_activity,
                   read over a connection to another database), autovacuum workers of that
                   database included; left out are the bench's own connections to it (the
                   parent's polls, graphile's drain.mjs), named jobtui-bench-observer, and the
                   server's shared background processes (WAL writer, checkpointer). A backend
                   that connects during the drain counts from zero. Needs the server on this
                   machine (else no figure);
    worker         the worker processes and their children (graphile: drain.mjs's forked
                   workers, not drain.mjs);
    jobs/s per database core   1e6 / server microseconds per job: the rate one CPU of the
                   database would carry, with the workers on other machines.
A worker still starting while another already drains counts, as it slows that drain.

Each configuration runs --rounds times, the order of the configurations rotating from
round to round so that noise on the shared machine spreads over all of them; the table
shows medians (drain: median of the rounds' rates; latency: medians of the rounds' p50
and p99; CPU: medians of the rounds' figures, in --json under "medians" too). A
configuration still draining after --max-drain seconds is measured on the jobs it finished
by then (flagged), its backlog deleted before the latency phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from peer_cpu import OBSERVER, Sampler  # bench/ is not a package

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS_VENV = HERE / ".peers-venv"
PEERS_PYTHON = PEERS_VENV / "bin" / "python"
# Unpinned on purpose: the latest releases. asyncpg is PgQueuer's recommended driver,
# uvloop an option both peers document; psycopg is procrastinate's driver.
PEER_PACKAGES = ["pgqueuer", "procrastinate", "asyncpg", "uvloop", "psycopg[binary]", "psycopg-pool"]
PEER_DISTS = ["pgqueuer", "procrastinate", "asyncpg", "uvloop", "psycopg"]
GRAPHILE_DIR = HERE / "graphile"
GRAPHILE_STAMP = GRAPHILE_DIR / "node_modules" / ".jobtui-lock-sha256"  # the lockfile npm ci installed

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB_PREFIX = "jobtui_bench_peers"
JOB_TYPE = "bench.noop"
TARGET_PEER_RATIO = 2.0
TARGET_CEILING_SHARE = 0.50
TARGET_EXACT_SHARE = 0.90  # jobtui-best against the exact raw loop
TARGET_P50_MS = 3.0
TARGET_P99_MS = 10.0

# -- configurations -----------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One way of running one system: its worker processes and their options."""

    key: str
    system: str  # jobtui | pgqueuer | procrastinate | graphile | raw
    tier: str  # default | best | ceiling
    processes: int
    options: dict[str, Any]
    settings: str  # what the table and the README say about it

    @property
    def batch(self) -> int:
        """The largest claim one statement makes: what the raw ceiling is matched on."""
        return int(self.options.get("batch", self.options.get("concurrency", 1)))


# The two ceilings: jobtui's own claim and complete (their text read from sql/claims.sql) sent
# by handwritten psycopg, whose gap to jobtui is jobtui's Python; and the minimal claim with no
# lever work, whose gap to the exact one is the server's lever work.
CEILINGS = {
    "exact": "jobtui's exact claim and complete text",
    "minimal": "the minimal claim, no lever work",
}

CONFIGS = [
    Config(
        "jobtui-default",
        "jobtui",
        "default",
        2,
        {"concurrency": 10},
        "jobtui worker defaults: --concurrency 10 (claims up to 10 at once), --poll 1s",
    ),
    Config(
        "jobtui-best",
        "jobtui",
        "best",
        2,
        {"concurrency": 200, "delete_on_complete": True},
        "--concurrency 200 (claims up to 200 at once) --delete-on-complete (finished jobs counted, not kept), "
        "--poll 1s; 100, 500, 1000, 1 x 200 and 3 x 100 or 200 were slower",
    ),
    Config(
        "jobtui-best-keep",
        "jobtui",
        "best",
        2,
        {"concurrency": 200},
        "--concurrency 200, keeping every done row (the default): jobtui-best without --delete-on-complete",
    ),
    Config(
        "pgqueuer-default",
        "pgqueuer",
        "default",
        2,
        {"driver": "asyncpg", "batch_size": 10, "managers": 1},
        "as `pgq run`: QueueManager on one asyncpg connection, batch_size 10, "
        "max_concurrent_tasks unlimited, asyncio loop",
    ),
    Config(
        "pgqueuer-best",
        "pgqueuer",
        "best",
        2,
        {"driver": "asyncpg", "batch_size": 200, "managers": 1},
        "batch_size 200, one asyncpg connection; 100 and 500 within noise, 1000, uvloop, an asyncpg "
        "pool, 3 QueueManagers per process, 1 or 3 processes: no clear gain",
    ),
    Config(
        "procrastinate-default",
        "procrastinate",
        "default",
        2,
        {"concurrency": 1},
        "procrastinate worker defaults: concurrency 1, PsycopgConnector pool (4 connections), "
        "listen_notify on, polling 5s, jobs kept",
    ),
    Config(
        "procrastinate-best",
        "procrastinate",
        "best",
        4,
        {"concurrency": 5},
        "4 processes x concurrency 5; 2 x 10, 2 x 20 and 2 x 50 with pools of 8-10, 4 x 10 (also on "
        "uvloop), 6 x 5: within 25% of it, all slower",
    ),
    Config(
        "graphile-default",
        "graphile",
        "default",
        2,
        {"concurrency": 1},
        "graphile-worker defaults (Node.js): concurrentJobs 1, maxPoolSize 10, no localQueue, each job "
        "fetched and completed by a statement of its own, deleted at completion",
    ),
    Config(
        "graphile-best",
        "graphile",
        "best",
        2,
        {"concurrency": 24, "batched": True},
        "its performance docs' settings: 2 processes x concurrentJobs 24, maxPoolSize 26, localQueue.size 500 "
        "(fetches 500 jobs a query), completeJobBatchDelay and failJobBatchDelay 0 (batched completions)",
    ),
    *(
        Config(
            f"raw-{claim}-b{batch}-p{procs}",
            "raw",
            "ceiling",
            procs,
            {"batch": batch, "delete": batch == 200, "exact": claim == "exact"},
            f"raw psycopg loop ({CEILINGS[claim]}), batch {batch}, {procs} process(es)"
            + (", completing by delete and tally as jobtui-best" if batch == 200 else ""),
        )
        for claim in ("exact", "minimal")
        for batch in (10, 200)
        for procs in (1, 2)
    ),
]


# -- databases and SQL per system (run by the parent, in the project's venv) --------------

DRAINED_SQL = {
    "jobtui": "SELECT EXISTS (SELECT 1 FROM jobtui.job WHERE status IN ('ready', 'running'))",
    "pgqueuer": "SELECT EXISTS (SELECT 1 FROM pgqueuer)",
    "procrastinate": "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))",
}
DRAIN_SQL = {
    "pgqueuer": """
        SELECT count(*) FILTER (WHERE status = 'successful'),
               extract(epoch FROM max(created) FILTER (WHERE status = 'successful')
                                  - min(created) FILTER (WHERE status = 'picked'))
        FROM pgqueuer_log""",
    "procrastinate": """
        SELECT count(*) FILTER (WHERE type = 'succeeded'),
               extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')
                                  - min(at) FILTER (WHERE type = 'started'))
        FROM procrastinate_events""",
}
# The drain's window in epoch seconds, as DRAIN_SQL and drain_window read it: where the CPU
# readings start and end.
WINDOW_SQL = {
    "jobtui": """
        SELECT extract(epoch FROM min(first))::float8, extract(epoch FROM max(last))::float8
        FROM (SELECT min(started_at) AS first, max(finished_at) AS last FROM jobtui.job WHERE status = 'done'
              UNION ALL
              SELECT min(first_started_at), max(last_finished_at) FROM jobtui.done_tally) AS finished""",
    "pgqueuer": """
        SELECT extract(epoch FROM min(created) FILTER (WHERE status = 'picked'))::float8,
               extract(epoch FROM max(created) FILTER (WHERE status = 'successful'))::float8
        FROM pgqueuer_log""",
    "procrastinate": """
        SELECT extract(epoch FROM min(at) FILTER (WHERE type = 'started'))::float8,
               extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded'))::float8
        FROM procrastinate_events""",
}
BACKLOG_DELETE_SQL = {
    "jobtui": "DELETE FROM jobtui.job WHERE status = 'ready'",
    "pgqueuer": "DELETE FROM pgqueuer WHERE status = 'queued'",
    "procrastinate": "DELETE FROM procrastinate_jobs WHERE status = 'todo'",
}
LATENCY_SQL = {
    "jobtui": """
        SELECT extract(epoch FROM started_at - created_at) * 1000
        FROM jobtui.job WHERE id = ANY(%s) AND started_at IS NOT NULL""",
    "pgqueuer": """
        SELECT extract(epoch FROM p.created - q.created) * 1000
        FROM pgqueuer_log AS q
        JOIN pgqueuer_log AS p ON p.job_id = q.job_id AND p.status = 'picked'
        WHERE q.status = 'queued' AND q.job_id = ANY(%s)""",
    "procrastinate": """
        SELECT extract(epoch FROM s.at - d.at) * 1000
        FROM procrastinate_events AS d
        JOIN procrastinate_events AS s ON s.job_id = d.job_id AND s.type = 'started'
        WHERE d.type = 'deferred' AND d.job_id = ANY(%s)""",
}


def drained_jobs(system: str, dsn: str) -> tuple[int, float]:
    """(jobs finished, seconds from the first start to the last finish) of a drain."""
    if table_of(system) == "jobtui":
        # jobtui bench's own reading: done rows and the tallies of jobs deleted at completion.
        import psycopg

        from jobtui.core.bench import drain_window

        with psycopg.connect(dsn, application_name=OBSERVER) as conn:
            return drain_window(conn, "jobtui")
    done, span = query_one(dsn, DRAIN_SQL[system])
    return int(done or 0), float(span or 0.0)


def table_of(system: str) -> str:
    return "jobtui" if system == "raw" else system


def with_dbname(dsn: str, dbname: str) -> str:
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise SystemExit(f"--dsn must be a postgresql:// URL (asyncpg takes no other form), got {dsn!r}")
    return urlunsplit(parts._replace(path="/" + dbname))


def admin_execute(admin_dsn: str, statement: str, dbname: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(sql.Identifier(dbname)))


def create_database(admin_dsn: str, dbname: str) -> str:
    admin_execute(admin_dsn, "DROP DATABASE IF EXISTS {} WITH (FORCE)", dbname)
    admin_execute(admin_dsn, "CREATE DATABASE {}", dbname)
    return with_dbname(admin_dsn, dbname)


def drop_database(admin_dsn: str, dbname: str) -> None:
    import psycopg

    # The server may be restarting (other people's failure drills share it): keep trying.
    for attempt in range(30):
        try:
            admin_execute(admin_dsn, "DROP DATABASE IF EXISTS {} WITH (FORCE)", dbname)
            return
        except psycopg.OperationalError:
            if attempt == 29:
                raise
            time.sleep(2)


class RestartedError(RuntimeError):
    """The shared server restarted during a run (other people's failure drills use it)."""


def server_start(dsn: str) -> Any:
    return query_one(dsn, "SELECT pg_postmaster_start_time()")[0]


def server_restarted(dsn: str, started: Any) -> bool:
    """Whether the server restarted since `started` (waiting up to a minute for it to answer)."""
    import psycopg

    for _ in range(30):
        try:
            return bool(server_start(dsn) != started)
        except psycopg.OperationalError:
            time.sleep(2)
    return True


def query_one(dsn: str, statement: str, params: Any = None) -> Any:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, application_name=OBSERVER) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchone() if cur.description else None


# -- the parent: one configuration, one round ---------------------------------------------


@dataclass
class RunResult:
    drain_per_s: float
    drained: int
    capped: bool
    p50_ms: float | None
    p99_ms: float | None
    latency_samples: int
    load: tuple[float, float]
    # CPU over the drain per job drained, in microseconds (None: the server is not on this machine)
    server_us_per_job: float | None = None
    worker_us_per_job: float | None = None

    @property
    def jobs_per_db_core(self) -> float | None:
        """Jobs per second one of the server's CPUs would drain at this server CPU per job."""
        return None if not self.server_us_per_job else 1e6 / self.server_us_per_job


def helper_cmd(system: str, action: str, dsn: str, **kw: Any) -> list[str]:
    python = sys.executable if system in ("jobtui", "raw") else str(PEERS_PYTHON)
    return [python, str(Path(__file__).resolve()), "_helper", system, action, dsn, json.dumps(kw)]


def run_helper(system: str, action: str, dsn: str, timeout: float = 600, **kw: Any) -> Any:
    return run_json(helper_cmd(system, action, dsn, **kw), f"{system} {action}", timeout)


def run_json(cmd: list[str], what: str, timeout: float) -> Any:
    """Run `cmd` to its end; the JSON of its last line of output (None if it printed nothing)."""
    proc = subprocess.run(
        cmd, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False
    )
    return json_output(proc.returncode, proc.stdout, proc.stderr, what)


def json_output(returncode: int, stdout: str, stderr: str, what: str) -> Any:
    if returncode != 0:
        raise RuntimeError(f"{what} failed:\n{stderr.strip()[-3000:]}")
    lines = stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def run_json_sampled(cmd: list[str], what: str, timeout: float, admin_dsn: str, dbname: str) -> tuple[Any, Sampler]:
    """run_json, sampling the CPU of the backends of `dbname` and of the command's descendants."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        with Sampler(admin_dsn, dbname, [proc.pid], roots_count=False) as cpu:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
        out.seek(0)
        err.seek(0)
        text = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    return json_output(proc.returncode, *text, what), cpu


def worker_cmd(cfg: Config, dsn: str, index: int) -> list[str]:
    if cfg.system == "jobtui":
        # jobtui's own CLI, as `jobtui bench` starts it.
        return [
            sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "worker", "--app", "jobtui.cli.bench:jobs",
            "--types", JOB_TYPE, "--concurrency", str(cfg.options["concurrency"]), "--no-scheduler",
            "--id", f"peers-{index}", *(["--delete-on-complete"] if cfg.options.get("delete_on_complete") else []),
        ]  # fmt: skip
    return helper_cmd(cfg.system, "worker", dsn, **cfg.options, index=index)


def start_workers(cfg: Config, dsn: str, logdir: Path) -> list[tuple[subprocess.Popen[bytes], Path]]:
    procs = []
    for i in range(cfg.processes):
        log_path = logdir / f"{cfg.key}-{i}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                worker_cmd(cfg, dsn, i), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        procs.append((proc, log_path))
    return procs


def stop_workers(procs: list[tuple[subprocess.Popen[bytes], Path]], timeout: float = 20) -> None:
    for proc, _ in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc, _ in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def wait_drained(cfg: Config, dsn: str, procs: list[tuple[subprocess.Popen[bytes], Path]], max_drain: float) -> bool:
    """Wait until no job is left to run; False when --max-drain ran out first."""
    import psycopg

    drained_sql = DRAINED_SQL[table_of(cfg.system)]
    deadline = time.monotonic() + max_drain
    with psycopg.connect(dsn, autocommit=True, application_name=OBSERVER) as conn:
        while True:
            row = conn.execute(drained_sql).fetchone()
            if row is not None and not row[0]:
                return True
            if time.monotonic() > deadline:
                return False
            for proc, log in procs:
                if proc.poll() is not None and cfg.system != "raw":
                    raise RuntimeError(f"{cfg.key}: a worker exited ({proc.returncode}):\n{tail(log)}")
            if cfg.system == "raw" and all(p.poll() is not None for p, _ in procs):
                bad = [(p, log) for p, log in procs if p.returncode != 0]
                if bad:
                    raise RuntimeError(f"{cfg.key}: the raw loop failed:\n{tail(bad[0][1])}")
            time.sleep(0.25)


def measure_latency(cfg: Config, dsn: str, count: int, interval: float) -> list[float]:
    ids = run_helper(cfg.system, "paced", dsn, count=count, interval=interval)
    statement = LATENCY_SQL[cfg.system]
    import psycopg

    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True, application_name=OBSERVER) as conn:
        while True:
            rows = conn.execute(statement, (ids,)).fetchall()
            if len(rows) >= len(ids) or time.monotonic() > deadline:
                return [float(r[0]) for r in rows]
            time.sleep(0.2)


def percentiles(values: Sequence[float]) -> tuple[float | None, float | None]:
    if len(values) < 2:
        return None, None
    q = statistics.quantiles(values, n=100, method="inclusive")
    return q[49], q[98]


def run_config(cfg: Config, admin_dsn: str, args: argparse.Namespace, logdir: Path) -> RunResult:
    if cfg.system == "graphile":
        return run_graphile(cfg, admin_dsn, args)
    dbname = f"{DB_PREFIX}_{cfg.system}"
    started = server_start(admin_dsn)
    dsn = create_database(admin_dsn, dbname)
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        run_helper(cfg.system, "setup", dsn)
        if args.queue_limit is not None and cfg.system == "jobtui":
            set_queue_limit(dsn, args.queue_limit)
        run_helper(cfg.system, "bulk", dsn, count=args.jobs)
        query_one(dsn, "VACUUM ANALYZE")
        load_start = os.getloadavg()[0]
        procs = start_workers(cfg, dsn, logdir)
        with Sampler(admin_dsn, dbname, [p.pid for p, _ in procs]) as cpu:
            finished = wait_drained(cfg, dsn, procs, args.max_drain)
            if not finished:
                query_one(dsn, BACKLOG_DELETE_SQL[table_of(cfg.system)])
                wait_drained(cfg, dsn, procs, 60)
            done, span = drained_jobs(cfg.system, dsn)
            if not done or not span:
                raise RuntimeError(f"{cfg.key}: nothing was drained")
            first, last = query_one(dsn, WINDOW_SQL[table_of(cfg.system)])
        server_us, worker_us = cpu.per_job(first, last, int(done))
        latencies: list[float] = []
        if cfg.system != "raw":
            latencies = measure_latency(cfg, dsn, args.latency_jobs, args.interval)
        load_end = os.getloadavg()[0]
        if server_start(admin_dsn) != started:
            # Workers that reconnected would have counted the outage in the figures.
            raise RestartedError(f"{cfg.key}: the server restarted during the run")
    finally:
        stop_workers(procs)
        drop_database(admin_dsn, dbname)
    p50, p99 = percentiles(latencies)
    return RunResult(
        int(done) / float(span), int(done), not finished, p50, p99, len(latencies), (load_start, load_end),
        server_us, worker_us,
    )  # fmt: skip


def set_queue_limit(dsn: str, limit: int) -> None:
    """A global limit on the default queue, so that every claim counts its running jobs."""
    from jobtui.core import queues
    from jobtui.kernel.db import connect

    with connect(dsn, autocommit=True) as conn:
        queues.set_limit(conn, "default", limit, actor="bench")


def run_graphile(cfg: Config, admin_dsn: str, args: argparse.Namespace) -> RunResult:
    """graphile-worker: bench/graphile/drain.mjs in drain mode, then in latency mode, each in a
    fresh database (it installs the schema, enqueues, forks its workers and prints one JSON line)."""
    dbname = f"{DB_PREFIX}_{cfg.system}"
    base = ["node", str(GRAPHILE_DIR / "drain.mjs"), "--workers", str(cfg.processes)]
    base += ["--concurrency", str(cfg.options["concurrency"]), *(["--batch"] if cfg.options.get("batched") else [])]
    started = server_start(admin_dsn)
    load_start = os.getloadavg()[0]
    out: dict[str, Any] = {}
    cpu: Sampler | None = None
    for mode, extra in (
        ("drain", ["--jobs", str(args.jobs), "--timeout", str(args.max_drain)]),
        ("latency", ["--latency-jobs", str(args.latency_jobs), "--interval-ms", f"{args.interval * 1000:g}"]),
    ):
        dsn = create_database(admin_dsn, dbname)
        try:
            cmd = [*base, "--dsn", dsn, "--mode", mode, *extra]
            # Generous: enqueueing, VACUUM, the capped drain or the paced jobs, and stopping.
            timeout = 600 + args.max_drain
            if mode == "drain":
                out[mode], cpu = run_json_sampled(cmd, f"{cfg.key} {mode}", timeout, admin_dsn, dbname)
            else:
                out[mode] = run_json(cmd, f"{cfg.key} {mode}", timeout)
        finally:
            drop_database(admin_dsn, dbname)
    load_end = os.getloadavg()[0]
    if server_start(admin_dsn) != started:
        raise RestartedError(f"{cfg.key}: the server restarted during the run")
    drain, lat = out["drain"], out["latency"]
    assert cpu is not None
    server_us, worker_us = cpu.per_job(float(drain["first_at"]), float(drain["last_at"]), int(drain["jobs"]))
    return RunResult(
        float(drain["rate"]), int(drain["jobs"]), bool(drain["capped"]), lat["p50_ms"], lat["p99_ms"],
        int(lat["jobs"]), (load_start, load_end), server_us, worker_us,
    )  # fmt: skip


def run_with_retries(cfg: Config, args: argparse.Namespace, logdir: Path, attempts: int = 5) -> RunResult:
    """A run that a restart of the shared server broke is run again from the start."""
    import psycopg

    for attempt in range(1, attempts + 1):
        try:
            started = server_start(args.dsn)
        except psycopg.OperationalError:
            started = None
        try:
            return run_config(cfg, args.dsn, args, logdir)
        except (psycopg.OperationalError, RuntimeError) as exc:
            if attempt == attempts or not (started is None or server_restarted(args.dsn, started)):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log(f"{cfg.key}: run failed ({first}); running it again in 20 s")
            time.sleep(20)
    raise AssertionError("unreachable")


# -- peers' environment -------------------------------------------------------------------


def ensure_peers_venv(upgrade: bool) -> dict[str, str]:
    """Create bench/.peers-venv if missing and install the peers' latest releases; versions."""
    if not PEERS_PYTHON.exists():
        log(f"creating {PEERS_VENV.relative_to(ROOT)}")
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        upgrade = True
    if upgrade:
        log(f"installing the latest {', '.join(PEER_PACKAGES)} into {PEERS_VENV.relative_to(ROOT)}")
        proc = subprocess.run(
            [str(PEERS_PYTHON), "-m", "pip", "install", "--quiet", "--upgrade", "--disable-pip-version-check",
             *PEER_PACKAGES],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"pip install into {PEERS_VENV} failed:\n{proc.stderr[-3000:]}")
    code = (
        "import json, importlib.metadata as m, platform;"
        f"print(json.dumps({{d: m.version(d) for d in {PEER_DISTS!r}}} | {{'python': platform.python_version()}}))"
    )
    out = subprocess.run([str(PEERS_PYTHON), "-c", code], capture_output=True, text=True, check=True).stdout
    return dict(json.loads(out))


def ensure_graphile() -> dict[str, str] | None:
    """`npm ci` in bench/graphile unless node_modules holds its current package-lock.json (a
    hash stamp); the graphile-worker and Node versions, or None (logged) without node or npm."""
    import hashlib
    import shutil

    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        log("graphile: node and npm are not both on PATH; skipping the graphile-worker configurations")
        return None
    lock = hashlib.sha256((GRAPHILE_DIR / "package-lock.json").read_bytes()).hexdigest()
    if not GRAPHILE_STAMP.exists() or GRAPHILE_STAMP.read_text().strip() != lock:
        log(f"installing {GRAPHILE_DIR.relative_to(ROOT)}/package-lock.json with npm ci")
        proc = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=GRAPHILE_DIR, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise SystemExit(f"npm ci in {GRAPHILE_DIR} failed:\n{proc.stderr[-3000:]}")
        GRAPHILE_STAMP.write_text(lock + "\n")
    package = json.loads((GRAPHILE_DIR / "node_modules" / "graphile-worker" / "package.json").read_text())
    node_version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    return {"graphile-worker": package["version"], "node": node_version.removeprefix("v")}


# -- report -------------------------------------------------------------------------------


@dataclass
class Results:
    command: str
    machine: str
    versions: str
    configs: list[Config]
    runs: dict[str, list[RunResult]] = field(default_factory=dict)


def med(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def fmt(x: float | None, spec: str, none: str = "—") -> str:
    return none if x is None else format(x, spec)


def drain_of(res: Results, key: str) -> float | None:
    return med([r.drain_per_s for r in res.runs.get(key, [])])


def p50_of(res: Results, key: str) -> float | None:
    return med([r.p50_ms for r in res.runs.get(key, [])])


def p99_of(res: Results, key: str) -> float | None:
    return med([r.p99_ms for r in res.runs.get(key, [])])


def cpu_of(res: Results, key: str) -> dict[str, float | None]:
    """Medians over the rounds: drain rate, server and worker CPU per job, jobs/s per database core."""
    runs = res.runs.get(key, [])
    return {
        "drain_per_s": drain_of(res, key),
        "server_us_per_job": med([r.server_us_per_job for r in runs]),
        "worker_us_per_job": med([r.worker_us_per_job for r in runs]),
        "jobs_per_s_per_db_core": med([r.jobs_per_db_core for r in runs]),
    }


def cpu_table(res: Results) -> list[str]:
    out = [
        "CPU over the drain, per job drained (medians over the rounds):",
        f"{'configuration':<22} {'drain jobs/s':>12} {'server us/job':>13} {'worker us/job':>13} "
        f"{'jobs/s per db core':>18}",
    ]
    for cfg in res.configs:
        if cfg.key not in res.runs:
            continue
        c = cpu_of(res, cfg.key)
        out.append(
            f"{cfg.key:<22} {fmt(c['drain_per_s'], '12,.0f')} {fmt(c['server_us_per_job'], '13.1f'):>13} "
            f"{fmt(c['worker_us_per_job'], '13.1f'):>13} {fmt(c['jobs_per_s_per_db_core'], '18,.0f'):>18}"
        )
    return [
        *out,
        "",
        "server: CPU time (utime + stime) of the backends connected to the configuration's database,",
        "        the bench's own connections left out, over the drain's window; worker: of its worker",
        "        processes and their children; jobs/s per db core = 1e6 / server us per job, the rate",
        "        one CPU of the database would carry with the workers on other machines.",
    ]


def ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def report(res: Results) -> str:
    loads = [x for runs in res.runs.values() for r in runs for x in r.load]
    out = [
        "jobtui and its peers: drain N no-op jobs, then enqueue-to-start latency at low load",
        f"command:  {res.command}",
        f"machine:  {res.machine}",
        f"versions: {res.versions}",
        f"load:     1-min load average during the runs: min {min(loads):.2f}, median "
        f"{statistics.median(loads):.2f}, max {max(loads):.2f}"
        if loads
        else "load:     -",
        "",
        f"{'configuration':<22} {'procs':>5} {'drain jobs/s':>12}  {'per round':<26} {'vs jobtui':>12}  "
        f"{'p50 ms':>7} {'p99 ms':>7} {'p50 vs jobtui':>13}",
    ]
    for cfg in res.configs:
        runs = res.runs.get(cfg.key)
        if not runs:
            continue
        drain = drain_of(res, cfg.key)
        per_round = " ".join(f"{r.drain_per_s / 1000:.1f}k{'*' if r.capped else ''}" for r in runs)
        if cfg.system == "raw":
            ref = "jobtui-default" if cfg.batch == 10 else "jobtui-best"
            jt = drain_of(res, ref)
            vs_label = "—" if jt is None or drain is None else f"{ref[7:]} {jt / drain:.0%}"
            lat = f"{'—':>7} {'—':>7} {'':>13}"
        else:
            ref = f"jobtui-{cfg.tier}"
            vs_label = ratio(drain, drain_of(res, ref))
            lat = (
                f"{fmt(p50_of(res, cfg.key), '7.2f'):>7} {fmt(p99_of(res, cfg.key), '7.2f'):>7} "
                f"{ratio(p50_of(res, cfg.key), p50_of(res, ref)):>13}"
            )
        out.append(f"{cfg.key:<22} {cfg.processes:>5} {fmt(drain, '12,.0f')}  {per_round:<26} {vs_label:>12}  {lat}")
    out += [
        "",
        "vs jobtui: a peer's drain / jobtui's of the same tier (default vs default, best vs best);",
        "           raw rows: jobtui's drain as a share of the raw loop's at the same batch size;",
        "           raw-exact sends jobtui's own claim and complete text (the gap is jobtui's Python),",
        "           raw-minimal the minimal claim without lever work (exact vs minimal: the lever work)",
        "           (jobtui default claims up to 10 at once, jobtui best up to 200).",
        "p50 vs jobtui: a peer's p50 / jobtui's of the same tier.",
        "* = capped at --max-drain: rate over the jobs finished by then.",
        "",
        *cpu_table(res),
        "",
        "Settings:",
    ]
    out += [f"  {cfg.key:<22} {cfg.settings}" for cfg in res.configs if cfg.key in res.runs]
    out += ["", "Targets:", *targets(res)]
    return "\n".join(out)


def targets(res: Results) -> list[str]:
    lines = []
    jt = {k: drain_of(res, k) for k in ("jobtui-default", "jobtui-best")}
    jt_best = max((v for v in jt.values() if v is not None), default=None)
    peers = {c.key: drain_of(res, c.key) for c in res.configs if c.system in ("pgqueuer", "procrastinate")}
    peers = {k: v for k, v in peers.items() if v is not None}
    if jt_best is not None and peers:
        best_key = max(peers, key=lambda k: peers[k])
        r = jt_best / peers[best_key]
        lines.append(
            f"  jobtui drain >= {TARGET_PEER_RATIO:.0f}x the best Python peer: {jt_best:,.0f} vs {best_key} "
            f"{peers[best_key]:,.0f} = {r:.2f}x -> {'met' if r >= TARGET_PEER_RATIO else 'NOT MET'}"
        )
    for key, batch in (("jobtui-default", 10), ("jobtui-best", 200)):
        for procs in (2, 1):
            raw = drain_of(res, f"raw-exact-b{batch}-p{procs}")
            if jt.get(key) is None or raw is None:
                continue
            share = jt[key] / raw  # type: ignore[operator]
            goal = TARGET_EXACT_SHARE if key == "jobtui-best" else TARGET_CEILING_SHARE
            lines.append(
                f"  {key} >= {goal:.0%} of the exact raw loop, batch {batch}, {procs} process(es): "
                f"{jt[key]:,.0f} / {raw:,.0f} = {share:.0%} -> {'met' if share >= goal else 'NOT MET'}"
            )
    graphile = drain_of(res, "graphile-best")
    if jt.get("jobtui-best") is not None and graphile is not None:
        r = jt["jobtui-best"] / graphile  # type: ignore[operator]
        lines.append(
            f"  jobtui-best >= graphile-best (level with the fastest PostgreSQL queue): {jt['jobtui-best']:,.0f} "
            f"vs {graphile:,.0f} = {r:.2f}x -> {'met' if r >= 1.0 else 'NOT MET'}"
        )
    for key in ("jobtui-default", "jobtui-best"):
        p50, p99 = p50_of(res, key), p99_of(res, key)
        if p50 is None or p99 is None:
            continue
        ok = p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS
        lines.append(
            f"  {key} latency p50 <= {TARGET_P50_MS:.0f} ms and p99 <= {TARGET_P99_MS:.0f} ms: "
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms -> {'met' if ok else 'NOT MET'}"
        )
    return lines


def machine_note(
    admin_dsn: str, peer_versions: dict[str, str], node_versions: dict[str, str] | None
) -> tuple[str, str]:
    from importlib.metadata import version

    import psycopg

    row = query_one(admin_dsn, "SELECT current_setting('server_version'), current_setting('synchronous_commit')")
    host = urlsplit(admin_dsn).hostname or "local socket"
    machine = (
        f"{os.cpu_count()} CPUs ({platform.machine()}), shared with PostgreSQL at {host} and other people's "
        f"test runs; synchronous_commit={row[1]}"
    )
    versions = (
        f"PostgreSQL {row[0].split()[0]}, Python {platform.python_version()}, psycopg {psycopg.__version__}, "
        f"jobtui {version('jobtui')} ({git_state()}); peers venv: "
        + ", ".join(f"{k} {v}" for k, v in peer_versions.items() if k != "python")
    )
    if node_versions:
        versions += "; bench/graphile: graphile-worker {graphile-worker} on Node {node}".format_map(node_versions)
    return machine, versions


def git_state() -> str:
    """The commit the jobtui under test is at, and whether its code differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "jobtui", "migrations"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head}" + (" with uncommitted changes to jobtui/" if dirty else "")


# -- main ---------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def wait_for_load(threshold: float, max_wait: float) -> None:
    if threshold <= 0:
        return
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        log(f"1-min load average {os.getloadavg()[0]:.2f} >= {threshold}: waiting")
        time.sleep(30)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--dsn",
        default=os.environ.get("JOBTUI_BENCH_DSN") or DEFAULT_DSN,
        help=f"a postgresql:// URL of the server to create the bench databases on (default {DEFAULT_DSN})",
    )
    p.add_argument("--jobs", type=int, default=50_000, help="jobs drained per run (default 50,000)")
    p.add_argument("--latency-jobs", type=int, default=300, help="jobs of the latency phase (default 300)")
    p.add_argument("--interval", type=float, default=0.01, help="seconds between latency jobs (default 0.01)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration; medians shown (default 3)")
    p.add_argument("--max-drain", type=float, default=60.0, help="seconds a drain may take (default 60)")
    p.add_argument("--only", help="comma-separated configuration keys (default: all)")
    p.add_argument("--no-upgrade", action="store_true", help="use bench/.peers-venv as it is (no pip install)")
    p.add_argument("--wait-load", type=float, default=0.0, help="first wait for a 1-min load average below this")
    p.add_argument("--wait-max", type=float, default=900.0, help="longest wait for --wait-load (default 900 s)")
    p.add_argument("--json", type=Path, help="also write the raw figures to this file")
    p.add_argument(
        "--queue-limit",
        type=int,
        help="jobtui only: a global limit on the default queue (jobtui queue limit), to measure what it costs",
    )
    args = p.parse_args(argv)
    if min(args.jobs, args.latency_jobs, args.rounds) < 1 or args.interval <= 0:
        p.error("--jobs, --latency-jobs, --rounds and --interval must be positive")
    with_dbname(args.dsn, DB_PREFIX)  # a URL, or exit with a message
    keys = [c.key for c in CONFIGS]
    args.configs = CONFIGS
    if args.only:
        wanted = [k.strip() for k in args.only.split(",") if k.strip()]
        unknown = [k for k in wanted if k not in keys]
        if unknown:
            p.error(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(keys)}")
        args.configs = [c for c in CONFIGS if c.key in wanted]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_helper"]:
        return helper_main(argv[1:])
    args = parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/peers.py", *argv])
    peer_versions = ensure_peers_venv(upgrade=not args.no_upgrade)
    node_versions = None
    if any(c.system == "graphile" for c in args.configs):
        node_versions = ensure_graphile()
        if node_versions is None:
            args.configs = [c for c in args.configs if c.system != "graphile"]
            if not args.configs:
                raise SystemExit("nothing left to run")
    machine, versions = machine_note(args.dsn, peer_versions, node_versions)
    wait_for_load(args.wait_load, args.wait_max)
    res = Results(command, machine, versions, args.configs)
    with tempfile.TemporaryDirectory(prefix="jobtui-peers-") as tmp:
        for rnd in range(args.rounds):
            order = args.configs[rnd % len(args.configs) :] + args.configs[: rnd % len(args.configs)]
            for cfg in order:
                r = run_with_retries(cfg, args, Path(tmp))
                res.runs.setdefault(cfg.key, []).append(r)
                log(
                    f"round {rnd + 1} {cfg.key:<22} drain {r.drain_per_s:>9,.0f}/s"
                    f"{' (capped, ' + str(r.drained) + ' jobs)' if r.capped else ''}  "
                    f"p50 {fmt(r.p50_ms, '.2f')} p99 {fmt(r.p99_ms, '.2f')} ms  load {r.load[0]:.2f}-{r.load[1]:.2f}  "
                    f"server {fmt(r.server_us_per_job, '.1f')} worker {fmt(r.worker_us_per_job, '.1f')} us/job"
                )
    print()
    print(report(res))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "command": res.command,
            "machine": res.machine,
            "versions": res.versions,
            "configs": {c.key: c.__dict__ for c in res.configs},
            "runs": {k: [r.__dict__ for r in v] for k, v in res.runs.items()},
            "medians": {k: cpu_of(res, k) for k in res.runs},
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0


# -- helpers: run in a subprocess, peers in the peers' venv, jobtui and raw in ours --------
#
#     python bench/peers.py _helper SYSTEM ACTION DSN OPTIONS_JSON
#
# ACTION is setup (schema), bulk (enqueue `count` jobs), paced (the latency phase's
# enqueues; prints the ids as JSON) or worker (runs until SIGTERM; raw: until empty).


def helper_main(argv: Sequence[str]) -> int:
    system, action, dsn, raw_opts = argv
    opts = json.loads(raw_opts)
    fn = HELPERS[system]
    result = fn(action, dsn, opts)
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


def paced(count: int, interval: float, enqueue_one: Any) -> list[int]:
    """Enqueue one warm-up job, wait half a second, then `count` jobs on a fixed schedule."""
    enqueue_one()
    time.sleep(0.5)
    ids = []
    t0 = time.perf_counter()
    for i in range(count):
        delay = t0 + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        ids.append(enqueue_one())
    return ids


async def apaced(count: int, interval: float, enqueue_one: Any) -> list[int]:
    await enqueue_one()
    await asyncio.sleep(0.5)
    ids = []
    t0 = time.perf_counter()
    for i in range(count):
        delay = t0 + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ids.append(await enqueue_one())
    return ids


def jobtui_helper(action: str, dsn: str, opts: dict[str, Any]) -> Any:
    import psycopg

    from jobtui import Client, NewJob
    from jobtui.kernel.migrate import migrate

    if action == "setup":
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        return None
    if action == "bulk":
        with Client(dsn) as q:
            for start in range(0, opts["count"], 10_000):
                q.enqueue_many([NewJob(JOB_TYPE) for _ in range(min(10_000, opts["count"] - start))])
        return None
    if action == "paced":
        # Keyed, so that workers deleting what they finish keep these rows to be measured.
        keys = (f"latency-{i}" for i in itertools.count())
        with Client(dsn, max_connections=1) as q:
            return paced(opts["count"], opts["interval"], lambda: q.enqueue(JOB_TYPE, key=next(keys)))
    raise ValueError(action)


def raw_helper(action: str, dsn: str, opts: dict[str, Any]) -> Any:
    if action != "worker":
        return jobtui_helper(action, dsn, opts)
    # bench/core.py's raw loop (this helper runs in the project's venv, like jobtui's).
    sys.path.insert(0, str(HERE))
    from core import RawLoop

    loop = RawLoop(
        dsn,
        job_type=JOB_TYPE,
        worker=f"raw-{opts.get('index', 0)}",
        delete=bool(opts.get("delete")),
        exact=bool(opts.get("exact")),
    )
    try:
        loop.drain(int(opts["batch"]))
    finally:
        loop.close()
    return None


def pgqueuer_helper(action: str, dsn: str, opts: dict[str, Any]) -> Any:
    if opts.get("uvloop"):
        import uvloop

        return uvloop.run(pgqueuer_main(action, dsn, opts))
    return asyncio.run(pgqueuer_main(action, dsn, opts))


async def pgqueuer_main(action: str, dsn: str, opts: dict[str, Any]) -> Any:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    if action in ("setup", "bulk", "paced"):
        conn = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            if action == "setup":
                await queries.install()
                return None
            if action == "bulk":
                for start in range(0, opts["count"], 10_000):
                    n = min(10_000, opts["count"] - start)
                    await queries.enqueue([JOB_TYPE] * n, [None] * n, [0] * n)
                return None

            async def one() -> int:
                return int((await queries.enqueue(JOB_TYPE, None))[0])

            return await apaced(opts["count"], opts["interval"], one)
        finally:
            await conn.close()
    if action != "worker":
        raise ValueError(action)
    managers = []
    resources = []
    for _ in range(int(opts.get("managers", 1))):
        if opts.get("driver") == "asyncpg-pool":
            pool = await asyncpg.create_pool(dsn, min_size=2, max_size=int(opts.get("pool_max", 4)))
            resources.append(pool)
            driver: Any = AsyncpgPoolDriver(pool)
        else:
            conn = await asyncpg.connect(dsn)
            resources.append(conn)
            driver = AsyncpgDriver(conn)
        qm = QueueManager(Queries(driver))

        @qm.entrypoint(JOB_TYPE)
        async def noop(job: Any) -> None:
            """Does nothing."""

        managers.append(qm)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [m.shutdown.set() for m in managers])
    max_tasks = opts.get("max_concurrent_tasks")
    await asyncio.gather(
        *(m.run(batch_size=int(opts.get("batch_size", 10)), max_concurrent_tasks=max_tasks) for m in managers)
    )
    for r in resources:
        await r.close()
    return None


def procrastinate_helper(action: str, dsn: str, opts: dict[str, Any]) -> Any:
    if opts.get("uvloop"):
        import uvloop

        return uvloop.run(procrastinate_main(action, dsn, opts))
    return asyncio.run(procrastinate_main(action, dsn, opts))


async def procrastinate_main(action: str, dsn: str, opts: dict[str, Any]) -> Any:
    import procrastinate

    pool_args: dict[str, Any] = {}
    if opts.get("pool_max"):
        pool_args = {"min_size": min(4, int(opts["pool_max"])), "max_size": int(opts["pool_max"])}
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, **pool_args))

    @app.task(name=JOB_TYPE)
    async def noop() -> None:
        """Does nothing."""

    async with app.open_async():
        if action == "setup":
            await app.schema_manager.apply_schema_async()
            return None
        if action == "bulk":
            for start in range(0, opts["count"], 10_000):
                n = min(10_000, opts["count"] - start)
                await noop.batch_defer_async(*({} for _ in range(n)))
            return None
        if action == "paced":

            async def one() -> int:
                return int(await noop.defer_async())

            return await apaced(opts["count"], opts["interval"], one)
        if action == "worker":
            worker_opts = {k: v for k, v in opts.items() if k not in ("pool_max", "uvloop", "index")}
            with contextlib.suppress(asyncio.CancelledError):
                await app.run_worker_async(**worker_opts)
            return None
    raise ValueError(action)


HELPERS = {
    "jobtui": jobtui_helper,
    "raw": raw_helper,
    "pgqueuer": pgqueuer_helper,
    "procrastinate": procrastinate_helper,
}


if __name__ == "__main__":
    sys.exit(main())
