"""Chaos run: a crash anywhere delays work, never loses or duplicates it.

    .venv/bin/python bench/chaos.py [--dsn DSN] [--jobs 5000] [--seconds 90] [--workers 4]
                                    [--concurrency 6] [--executor thread|process]
                                    [--restart-postgres] [--seed N]

Creates a database of its own on the server of --dsn (default: the CI server), migrates it
and starts --workers `python -m jobtui.cli worker --app tests.apps.chaos_app:jobs` processes. For
--seconds it enqueues the jobs (evenly, the last ones as the faults end) and, at random,

  kill       SIGKILLs a worker, which its supervisor (this script) restarts at once;
  stop       SIGSTOPs a worker for longer than its lease, then SIGCONTs it: a zombie that
             wakes up with jobs that were reaped and re-claimed elsewhere meanwhile;
  terminate  pg_terminate_backend()s a random share of the workers' and handlers' connections;
  restart    restarts PostgreSQL (--restart-postgres: the local cluster, found with
             pg_ctlcluster, when this process may restart it).

Then it stops the faults, waits for the queue to drain (bounded), stops the workers and checks
the outcome against what the handlers (tests/apps/chaos_app.py) recorded. Effect jobs must be done
with their effect exactly once; poison jobs (they always fail) dead after their attempts with
no effect; and no state written by a worker whose lease had passed to another claim:

  * done rows: the row's (lease_token, locked_by) is an attempt that started and whose
    handler returned, and finished_at is after that return (the outcome is that attempt's);
  * every `error` entry of a row's history names an attempt whose handler did not return
    (a zombie's late failure accepted over a live lease would name the live attempt);
  * every effect was done while its attempt's lease was the job's current one (the handler
    reads the job row in the effect's transaction);
  * no attempt (job, lease token) started twice.

It prints one table of figures and exits 1 when a check failed. Only loopback traffic (or
the --dsn server); every process it starts is killed before it exits; the database is
dropped unless --keep.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests.apps.chaos_app` importable
    sys.path.insert(0, str(ROOT))

from jobtui.core.claims import RELEASE_KINDS  # noqa: E402
from jobtui.core.jobs import enqueue_many  # noqa: E402
from jobtui.kernel.domain import NewJob  # noqa: E402
from jobtui.kernel.migrate import migrate  # noqa: E402
from tests.apps.chaos_app import APP_TABLES, POISON_ATTEMPTS, effect_key  # noqa: E402
from tests.waits import hold, wait_until  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
APP = "tests.apps.chaos_app:jobs"
KEY_PREFIX = "chaos-run:"
# The harness's own connections carry this name; terminations spare them.
HARNESS = "jobtui-chaos-harness"
EFFECT_TYPES = ("chaos.sync", "chaos.async")
FAULTS = ("kill", "stop", "terminate", "restart")

Conn = psycopg.Connection[Any]
T = TypeVar("T")


# -- databases ---------------------------------------------------------------------------------


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def connect(dsn: str, *, timeout: float = 30.0) -> Conn:
    """An autocommit harness connection, retried while the server restarts (bounded)."""

    def attempt() -> Conn | None:
        with contextlib.suppress(psycopg.OperationalError):
            return psycopg.connect(dsn, autocommit=True, connect_timeout=5, application_name=HARNESS)
        return None

    conn: Conn = wait_until(attempt, timeout, f"a connection to {dsn}")
    return conn


def create_database(server_dsn: str, prefix: str = "jobtui_chaos") -> tuple[str, str]:
    """A new database migrated for jobtui, with the chaos app's tables; (name, dsn)."""
    name = f"{prefix}_{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    with connect(server_dsn) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_dbname(server_dsn, name)
    with connect(dsn) as conn:
        migrate(conn)
        conn.execute(APP_TABLES)
    return name, dsn


def drop_database(server_dsn: str, name: str) -> None:
    with connect(server_dsn) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def local_restart_command(server_dsn: str) -> list[str] | None:
    """`pg_ctlcluster ... restart` for the local cluster serving `server_dsn`, or None when this
    process cannot restart that server (not root, no pg_ctlcluster, another server)."""
    if os.geteuid() != 0 or shutil.which("pg_ctlcluster") is None or not Path("/etc/postgresql").is_dir():
        return None
    with connect(server_dsn, timeout=5) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    data_dir = Path(str(row[0])) if row else None
    for version in sorted(os.listdir("/etc/postgresql")):
        for cluster in sorted(os.listdir(Path("/etc/postgresql") / version)):
            if data_dir is not None and Path(f"/var/lib/postgresql/{version}/{cluster}") == data_dir:
                return ["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster, "restart"]
    return None


def restart_postgres(command: Sequence[str], server_dsn: str, timeout: float = 60.0) -> float:
    """Restart the server; return once it accepts connections again (seconds it took)."""
    started = time.monotonic()
    subprocess.run(list(command), check=True, capture_output=True, timeout=timeout)
    ensure_up(server_dsn, timeout)
    return time.monotonic() - started


def ensure_up(server_dsn: str, timeout: float = 60.0) -> None:
    with connect(server_dsn, timeout=timeout) as conn:
        conn.execute("SELECT 1")


# -- processes ---------------------------------------------------------------------------------


class Proc:
    """A `python -m jobtui.cli ...` child whose output goes to a log file."""

    def __init__(self, name: str, args: Sequence[str], env: dict[str, str], log_path: Path, prefix: Sequence[str] = ()):
        self.name = name
        self.log_path = log_path
        self._log_file = log_path.open("wb")
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "jobtui.cli", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of the harness is for the harness only
        )
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.stopped = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def stop(self) -> None:
        self.signal(signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        self.signal(signal.SIGCONT)
        self.stopped = False

    def kill(self) -> None:
        """SIGKILL (a stopped process too) and reap."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._closed()

    def terminate(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (after SIGCONT) and wait up to `timeout`, then SIGKILL; the exit code."""
        self.cont()
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._closed()
        return self.proc.returncode

    def _closed(self) -> None:
        if self.ended_at is None and not self.alive():
            self.ended_at = time.time()
        self._log_file.close()


class Procs:
    """Every process started for a run; `close()` kills those still running."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.all: list[Proc] = []

    def start(
        self, name: str, args: Sequence[str], *, env: dict[str, str] | None = None, prefix: Sequence[str] = ()
    ) -> Proc:
        proc = Proc(name, args, {**self.env, **(env or {})}, self.log_dir / f"{name}.log", prefix)
        self.all.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.all:
            proc.kill()


def worker_args(name: str, *, lease: float, concurrency: int, app: str = APP, extra: Sequence[str] = ()) -> list[str]:
    return ["worker", "--app", app, "--id", name, "--lease", f"{lease}s", "--concurrency", str(concurrency), *extra]


def child_env(dsn: str) -> dict[str, str]:
    env = {**os.environ, "JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    return env


_REJECTED = re.compile(r"job (\d+) \(([^)]*)\) attempt (\d+): outcome not written")


def rejected_outcomes(procs: Sequence[Proc]) -> set[tuple[int, int, str]]:
    """(job id, attempt, worker) of every outcome a worker logged as not written."""
    found: set[tuple[int, int, str]] = set()
    for proc in procs:
        for match in _REJECTED.finditer(proc.log()):
            found.add((int(match.group(1)), int(match.group(3)), proc.name))
    return found


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Config:
    jobs: int = 5000
    seconds: float = 90.0  # the fault phase; jobs are enqueued evenly over it
    workers: int = 4
    concurrency: int = 6
    lease: float = 2.0
    fault_every: float = 1.5  # mean seconds between faults
    weights: dict[str, float] = field(default_factory=lambda: {"kill": 3, "stop": 2, "terminate": 3, "restart": 1})
    stop_extra: tuple[float, float] = (1.0, 3.0)  # a SIGSTOP lasts the lease plus this much
    restart_postgres: bool = False
    restart_every: float = 25.0  # at most one PostgreSQL restart per this many seconds
    restart_command: list[str] | None = None  # default: local_restart_command(dsn)
    poison_share: float = 0.02
    flaky_share: float = 0.05
    long_share: float = 0.12  # jobs in flight for 0.3-1.5 s, so that faults find some
    over_lease_share: float = 0.01  # jobs running 1.5-2.5 leases: heartbeats must hold them
    drain_timeout: float = 120.0
    seed: int | None = None
    log_dir: Path | None = None
    keep_db: bool = False
    progress: Callable[[str], None] | None = None
    executor: str = "thread"  # where the workers run the sync handlers (--executor)


@dataclass
class Result:
    jobs: int = 0
    effect_jobs: int = 0
    poison_jobs: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    terminated_backends: int = 0
    restart_seconds: list[float] = field(default_factory=list)
    worker_exits: int = 0  # workers that exited on their own (database down when they started)
    lease_expiries: int = 0
    attempts: int = 0
    most_attempts: int = 0  # the most attempts one job took
    # Attempts handed back without counting: by the worker (its lease could not be extended,
    # it stopped) or for the handler (its own database connection failed).
    released: Counter[str] = field(default_factory=Counter)
    rejected_outcomes: int = 0
    # Outcomes written, then retried after the connection broke before the answer came back:
    # the retry finds the row finished and the worker logs the outcome as not written.
    misreported: int = 0
    lost: int = 0
    duplicated: int = 0
    stale_outcomes: int = 0
    stale_effects: int = 0
    double_runs: int = 0
    latency_p50: float = 0.0
    latency_p99: float = 0.0
    latency_max: float = 0.0
    chaos_seconds: float = 0.0
    drain_seconds: float = 0.0
    total_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    log_dir: str = ""
    database: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def rows(self) -> list[tuple[str, str]]:
        done = self.statuses.get("done", 0)
        dead = self.statuses.get("dead", 0)
        restarts = len(self.restart_seconds)
        restart_note = f" (back in {max(self.restart_seconds):.1f} s at most)" if restarts else ""
        return [
            ("jobs", f"{self.jobs} ({self.effect_jobs} with an effect, {self.poison_jobs} poison)"),
            ("done / dead (by design)", f"{done} / {dead}"),
            ("worker kills (SIGKILL, restarted)", str(self.faults["kill"])),
            ("worker stops (SIGSTOP past the lease)", str(self.faults["stop"])),
            ("connection terminations", f"{self.faults['terminate']} ({self.terminated_backends} backends)"),
            ("PostgreSQL restarts", f"{restarts}{restart_note}"),
            ("workers exited on their own (db down at start)", str(self.worker_exits)),
            ("lease expiries (jobtui.lease_expiry)", str(self.lease_expiries)),
            ("attempts beyond the first (most for one job)", f"{self.attempts - self.jobs} ({self.most_attempts})"),
            (
                "attempts released, not counted",
                ", ".join(f"{kind} {n}" for kind, n in sorted(self.released.items())) or "0",
            ),
            ("zombie outcomes discarded or rejected", str(self.rejected_outcomes)),
            ("outcomes written but logged as not written", str(self.misreported)),
            ("lost", str(self.lost)),
            ("duplicated effects", str(self.duplicated)),
            ("stale writes (outcome or effect)", str(self.stale_outcomes + self.stale_effects)),
            ("attempts run twice", str(self.double_runs)),
            (
                "enqueue to done, p50 / p99 / max",
                f"{self.latency_p50:.2f} s / {self.latency_p99:.2f} s / {self.latency_max:.1f} s",
            ),
            ("fault phase", f"{self.chaos_seconds:.0f} s"),
            ("time to drain after the last fault", f"{self.drain_seconds:.1f} s"),
            ("total", f"{self.total_seconds:.0f} s"),
        ]

    def table(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        vwidth = max(len(v) for _, v in rows)
        lines = [
            f"| {'figure'.ljust(width)} | {'value'.ljust(vwidth)} |",
            f"|{'-' * (width + 2)}|{'-' * (vwidth + 2)}|",
        ]
        lines += [f"| {k.ljust(width)} | {v.ljust(vwidth)} |" for k, v in rows]
        return "\n".join(lines)


def plan_jobs(config: Config, rng: random.Random) -> list[NewJob]:
    """The run's jobs, each with an idempotency key so that enqueueing can be retried."""
    jobs = []
    for i in range(config.jobs):
        roll = rng.random()
        if roll < config.poison_share:
            jobs.append(NewJob("chaos.poison", {"n": i}, key=f"{KEY_PREFIX}{i}"))
            continue
        payload: dict[str, Any] = {"n": i, "before": rng.uniform(0, 0.02), "after": rng.uniform(0, 0.02)}
        roll = rng.random()
        if roll < config.over_lease_share:
            payload["after"] = rng.uniform(1.5, 2.5) * config.lease
        elif roll < config.over_lease_share + config.long_share:
            payload["before"], payload["after"] = rng.uniform(0.2, 1.0), rng.uniform(0.1, 0.5)
        if rng.random() < config.flaky_share:
            payload["fail_first"] = True
        jobs.append(NewJob(rng.choice(EFFECT_TYPES), payload, key=f"{KEY_PREFIX}{i}"))
    return jobs


class Run:
    """One chaos run; `run()` returns the Result, and every process is gone afterwards."""

    def __init__(self, server_dsn: str, config: Config) -> None:
        self.server_dsn = server_dsn
        self.config = config
        self.rng = random.Random(config.seed)
        self.result = Result()
        self.name = ""
        self.dsn = ""
        self._conn: Conn | None = None
        self.slots: list[Proc] = []
        self.generation: Counter[int] = Counter()
        self.procs: Procs | None = None
        self.restart_command: list[str] | None = None
        self._cover = [k for k in ("kill", "stop", "terminate") if config.weights.get(k, 0) > 0]
        self.rng.shuffle(self._cover)

    def say(self, text: str) -> None:
        if self.config.progress is not None:
            self.config.progress(text)

    # -- harness connection (reconnects after a restart or a termination) -----------------------

    def db(self) -> Conn:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.dsn, timeout=60)
        return self._conn

    def forget_conn(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # broken by a restart or a termination
                self._conn.close()
        self._conn = None

    def retried(self, work: Callable[[Conn], T]) -> T:
        """`work` on the harness connection, again on a new one while the server restarts."""

        def attempt() -> tuple[T] | None:
            try:
                return (work(self.db()),)
            except psycopg.OperationalError:
                self.forget_conn()
                return None

        answer: tuple[T] = wait_until(attempt, 10, "the database to answer again", every=0.25)
        return answer[0]

    def query(self, statement: str, params: Any = None) -> list[Any]:
        def read(conn: Conn) -> list[Any]:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

        return self.retried(read)

    # -- workers ---------------------------------------------------------------------------------

    def start_worker(self, slot: int) -> Proc:
        assert self.procs is not None
        self.generation[slot] += 1
        name = f"w{slot}.{self.generation[slot]}"
        proc = self.procs.start(
            name,
            worker_args(
                name,
                lease=self.config.lease,
                concurrency=self.config.concurrency,
                extra=[
                    *("--no-scheduler", "--poll", "0.5s", "--shutdown-timeout", "5s"),
                    *("--executor", self.config.executor),
                ],
            ),
        )
        if slot < len(self.slots):
            self.slots[slot] = proc
        else:
            self.slots.append(proc)
        return proc

    def supervise(self) -> None:
        """Restart workers that exited on their own (a worker refuses to start while the
        database is down)."""
        for slot, proc in enumerate(self.slots):
            if not proc.alive():
                proc.kill()
                self.result.worker_exits += 1
                self.start_worker(slot)

    # -- faults ----------------------------------------------------------------------------------

    def fault(self, kind: str, pending: list[tuple[float, int, Proc]]) -> None:
        config = self.config
        if kind == "kill":
            slot = self.rng.randrange(len(self.slots))
            self.slots[slot].kill()
            self.start_worker(slot)
        elif kind == "stop":
            running = [s for s, p in enumerate(self.slots) if p.alive() and not p.stopped]
            stopped = len(self.slots) - len(running)
            if not running or stopped >= len(self.slots) - 1:
                return  # keep one worker running
            slot = self.rng.choice(running)
            proc = self.slots[slot]
            proc.stop()
            pending.append((time.monotonic() + config.lease + self.rng.uniform(*config.stop_extra), slot, proc))
        elif kind == "terminate":
            pids = [
                int(r[0])
                for r in self.query(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND backend_type = 'client backend' AND application_name IS DISTINCT FROM %s",
                    (HARNESS,),
                )
            ]
            if not pids:
                return
            chosen = self.rng.sample(pids, max(1, math.ceil(len(pids) * self.rng.uniform(0.2, 1.0))))
            rows = self.query(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(p)) FROM unnest(%s::int[]) AS p", (chosen,)
            )
            self.result.terminated_backends += int(rows[0][0])
        elif kind == "restart":
            assert self.restart_command is not None
            self.forget_conn()
            took = restart_postgres(self.restart_command, self.server_dsn)
            self.result.restart_seconds.append(took)
            self.say(f"  PostgreSQL restarted ({took:.1f} s)")
        self.result.faults[kind] += 1

    def pick_fault(self, last_restart: float) -> str:
        if self._cover:  # each kind of worker fault once first, in random order
            return self._cover.pop()
        weights = dict(self.config.weights)
        if not self.config.restart_postgres or time.monotonic() - last_restart < self.config.restart_every:
            weights["restart"] = 0
        kinds = [k for k in FAULTS if weights.get(k, 0) > 0]
        return self.rng.choices(kinds, [weights[k] for k in kinds])[0]

    # -- phases ----------------------------------------------------------------------------------

    def enqueue(self, batch: list[NewJob]) -> None:
        # Keys make a retry after an unknown commit (a restart mid-batch) insert nothing twice.
        def insert(conn: Conn) -> None:
            with conn.transaction():
                enqueue_many(conn, batch)

        self.retried(insert)

    def chaos(self, jobs: list[NewJob]) -> None:
        config = self.config
        start = time.monotonic()
        end = start + config.seconds
        enqueue_span = max(0.25, config.seconds - 0.5)
        batches = max(1, math.ceil(enqueue_span / 0.25))
        size = math.ceil(len(jobs) / batches)
        queued = 0
        next_fault = start + self.rng.expovariate(1 / config.fault_every)
        last_restart = start - config.restart_every / 2  # no restart in the first moments
        pending: list[tuple[float, int, Proc]] = []  # (when, slot, stopped process) to SIGCONT
        last_report = start
        while True:
            now = time.monotonic()
            if now >= end and queued >= len(jobs):
                break
            if queued < len(jobs) and now >= start + enqueue_span * queued / len(jobs):
                self.enqueue(jobs[queued : queued + size])
                queued += size
            for item in [p for p in pending if p[0] <= now]:
                pending.remove(item)
                item[2].cont()
            if now >= next_fault and now < end:
                kind = self.pick_fault(last_restart)
                if kind == "restart":
                    last_restart = now
                self.fault(kind, pending)
                next_fault = time.monotonic() + min(
                    self.rng.expovariate(1 / config.fault_every), 4 * config.fault_every
                )
            self.supervise()
            if now - last_report >= 10:
                last_report = now
                self.say(f"  {now - start:4.0f} s: {self.progress_line()}")
            hold(0.02, "the chaos loop's tick: its faults and enqueues fall due on the clock")
        for _, _, proc in pending:
            proc.cont()
        self.result.chaos_seconds = time.monotonic() - start

    def progress_line(self) -> str:
        rows = self.query("SELECT status, count(*) FROM jobtui.job GROUP BY status ORDER BY status")
        counts = ", ".join(f"{s} {n}" for s, n in rows)
        return f"{counts}; faults {dict(self.result.faults)}"

    def drain(self) -> None:
        started = time.monotonic()

        def drained() -> bool:
            self.supervise()
            rows = self.query(
                "SELECT count(*) FROM jobtui.job WHERE idempotency_key LIKE %s AND status IN ('ready', 'running')",
                (KEY_PREFIX + "%",),
            )
            return int(rows[0][0]) == 0

        # Not drained in time is not a failure here: the checks that follow say which jobs.
        deadline = started + self.config.drain_timeout
        timeout = 2 * self.config.drain_timeout
        wait_until(lambda: drained() or time.monotonic() > deadline, timeout, "the drain or its deadline", every=0.1)
        self.result.drain_seconds = time.monotonic() - started

    def stop_workers(self) -> None:
        """Stop each worker cleanly: its handlers, woken zombies' included, finish within the
        shutdown timeout (5 s, within terminate's 10) and it writes, or tries to, what they
        did; once it has exited, nothing more of it can land."""
        for proc in self.slots:
            proc.terminate(10)

    # -- checks ----------------------------------------------------------------------------------

    def check(self, jobs: list[NewJob]) -> None:
        res = self.result
        assert self.procs is not None
        violations = res.violations
        keys = {j.key: j for j in jobs}
        rows = self.query(
            "SELECT id, idempotency_key, type, status, attempts, lease_token, locked_by, errors, finished_at,"
            " extract(epoch FROM finished_at - created_at) FROM jobtui.job"
        )
        starts: dict[tuple[int, int], list[str]] = defaultdict(list)
        ends: dict[tuple[int, int], Any] = {}
        for job_id, token, worker, event, at in self.query(
            "SELECT job_id, token, worker, event, at FROM chaos_attempt"
        ):
            if event == "start":
                starts[(job_id, token)].append(worker)
            else:
                ends[(job_id, token)] = (worker, at)
        effects: dict[int, list[tuple[int, str, int | None, str | None]]] = defaultdict(list)
        for job_id, token, worker, seen_token, seen_status in self.query(
            "SELECT job_id, token, worker, seen_token, seen_status FROM chaos_effect"
        ):
            effects[job_id].append((token, worker, seen_token, seen_status))
        recorded = {r[0] for r in self.query("SELECT key FROM jobtui.effect")}
        rejected = rejected_outcomes(self.procs.all)
        res.rejected_outcomes = len(rejected)
        res.lease_expiries = int(self.query("SELECT count(*) FROM jobtui.lease_expiry")[0][0])

        def bad(kind: str, text: str) -> None:
            if len(violations) < 50:
                violations.append(f"{kind}: {text}")

        for (job_id, token), workers in starts.items():
            if len(workers) > 1:
                res.double_runs += 1
                bad("double run", f"job {job_id} token {token} started {len(workers)} times: {workers}")
        seen_keys: set[str] = set()
        latencies: list[float] = []
        statuses: Counter[str] = Counter()
        for job_id, key, job_type, status, attempts, token, locked_by, errors, finished_at, latency in rows:
            if key not in keys:
                continue
            seen_keys.add(key)
            statuses[status] += 1
            res.attempts += attempts
            res.most_attempts = max(res.most_attempts, attempts)
            # Every claim is an attempt, unless it was released uncounted (which its history says).
            released = Counter(e.get("kind") for e in errors if e.get("kind") in RELEASE_KINDS)
            res.released.update(released)
            if attempts + sum(released.values()) != token:
                bad(
                    "bookkeeping",
                    f"job {job_id}: attempts {attempts} + releases {sum(released.values())} <> lease_token {token}",
                )
            done_effects = effects.get(job_id, [])
            for e_token, e_worker, seen_token, seen_status in done_effects:
                if seen_token != e_token or seen_status != "running":
                    res.stale_effects += 1
                    bad(
                        "stale effect",
                        f"job {job_id}: effect by {e_worker} with token {e_token} while the row had token "
                        f"{seen_token} ({seen_status})",
                    )
            for entry in errors:
                if entry.get("kind") == "error" and (job_id, entry.get("attempt")) in ends:
                    res.stale_outcomes += 1
                    bad(
                        "stale outcome",
                        f"job {job_id}: error entry for attempt {entry.get('attempt')} whose handler returned",
                    )
            if job_type == "chaos.poison":
                if status != "dead" or attempts != POISON_ATTEMPTS:
                    res.lost += 1
                    bad("poison", f"job {job_id} is {status} after {attempts} attempts")
                if done_effects:
                    bad("poison", f"job {job_id} has an effect")
                continue
            if status != "done":
                res.lost += 1
                bad("lost", f"job {job_id} ({job_type}) is {status} after {attempts} attempts")
                continue
            latencies.append(float(latency))
            if len(done_effects) == 0 or effect_key(job_id) not in recorded:
                res.lost += 1
                bad("lost", f"job {job_id} done without its effect ({len(done_effects)} rows)")
            elif len(done_effects) > 1:
                res.duplicated += len(done_effects) - 1
                bad("duplicate", f"job {job_id}: effect done {len(done_effects)} times: {done_effects}")
            if (job_id, token, locked_by) in rejected:
                res.misreported += 1
            end = ends.get((job_id, token))
            if locked_by not in starts.get((job_id, token), []) or end is None or end[0] != locked_by:
                res.stale_outcomes += 1
                bad(
                    "stale outcome",
                    f"job {job_id} done with token {token} by {locked_by}, whose handler did not return",
                )
            elif finished_at < end[1]:
                res.stale_outcomes += 1
                bad("stale outcome", f"job {job_id} done at {finished_at}, before its holder's handler returned")
        missing = set(keys) - seen_keys
        res.lost += len(missing)
        for key in sorted(k for k in missing if k is not None)[:10]:
            bad("lost", f"job {key} is not in the queue")
        res.statuses = dict(statuses)
        res.effect_jobs = sum(1 for j in jobs if j.type in EFFECT_TYPES)
        res.poison_jobs = res.jobs - res.effect_jobs
        if latencies:
            latencies.sort()
            res.latency_p50 = statistics.median(latencies)
            res.latency_p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            res.latency_max = latencies[-1]

    # -- all of it -------------------------------------------------------------------------------

    def run(self) -> Result:
        config = self.config
        started = time.monotonic()
        if config.restart_postgres:
            self.restart_command = config.restart_command or local_restart_command(self.server_dsn)
            if self.restart_command is None:
                raise RuntimeError("--restart-postgres: cannot restart this server from here (root and pg_ctlcluster)")
        log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="jobtui-chaos-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.result.log_dir = str(log_dir)
        jobs = plan_jobs(config, self.rng)
        self.result.jobs = len(jobs)
        self.name, self.dsn = create_database(self.server_dsn)
        self.result.database = self.name
        self.procs = Procs(log_dir, child_env(self.dsn))
        try:
            for slot in range(config.workers):
                self.start_worker(slot)
            self.say(f"database {self.name}, {config.workers} workers, logs in {log_dir}")
            self.chaos(jobs)
            self.say(f"  faults over: {self.progress_line()}")
            self.drain()
            self.stop_workers()
            self.check(jobs)
        finally:
            self.procs.close()
            self.forget_conn()
            if config.restart_postgres:
                ensure_up(self.server_dsn)
            if not config.keep_db:
                drop_database(self.server_dsn, self.name)
        self.result.total_seconds = time.monotonic() - started
        return self.result


def run(server_dsn: str, config: Config) -> Result:
    return Run(server_dsn, config).run()


@contextlib.contextmanager
def run_database(server_dsn: str, prefix: str = "jobtui_chaos") -> Iterator[str]:
    """A migrated database with the chaos app's tables, dropped afterwards; yields its DSN."""
    name, dsn = create_database(server_dsn, prefix)
    try:
        yield dsn
    finally:
        drop_database(server_dsn, name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_TEST_DSN", DEFAULT_DSN), help="the server to use")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=90.0, help="fault phase (default 90)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--fault-every", type=float, default=1.5, help="mean seconds between faults")
    parser.add_argument("--restart-postgres", action="store_true", help="also restart the local PostgreSQL")
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--log-dir", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the run's database")
    parser.add_argument("--executor", choices=("thread", "process"), default="thread", help="the workers' --executor")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    config = Config(
        jobs=args.jobs,
        seconds=args.seconds,
        workers=args.workers,
        concurrency=args.concurrency,
        fault_every=args.fault_every,
        restart_postgres=args.restart_postgres,
        drain_timeout=args.drain_timeout,
        seed=seed,
        log_dir=args.log_dir,
        keep_db=args.keep,
        progress=lambda text: print(text, flush=True),
        executor=args.executor,
    )
    print(
        f"jobtui chaos: {args.jobs} jobs, {args.workers} workers x {args.concurrency} ({args.executor}),"
        f" {args.seconds:.0f} s of faults, seed {seed}"
    )
    result = run(args.dsn, config)
    print(result.table())
    for violation in result.violations:
        print(f"VIOLATION {violation}")
    print(f"worker logs: {result.log_dir}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
