"""A failover run: a primary and its synchronous standby of the run's own (tests/topology.py),
worker processes on a multi-host DSN (target_session_attrs=read-write), the primary stopped
mid-drain and the standby promoted. Every job must end done with its effect exactly once.

    result = run_failover(jobs=300, workers=2, concurrency=10, logs=tmp_path)

tests/chaos/test_failover.py runs a short one; `bench/failover.py` a long one, printing the
time from promotion to the first claim on the new primary.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from jobtui import Client, NewJob
from jobtui.kernel import migrate
from jobtui.reads.metrics import Snapshot
from jobtui.tui.data import DataSource
from tests.apps.topology_app import APP_TABLES
from tests.cluster import LocalCluster
from tests.topology import PRIMARY_SETTINGS, Standby, make_sync
from tests.waits import wait_until
from tests.workers import WorkerProcess

APP = "tests.apps.topology_app:jobs"


@dataclass(frozen=True)
class FailoverResult:
    jobs: int
    done: int
    effects: int
    distinct_effects: int
    done_before_stop: int
    promotion_seconds: float  # from stopping the primary to the standby accepting writes
    promotion_to_first_claim: float  # the standby's clock: from `pg_ctl promote` to the first claim on it
    drain_seconds: float  # from the enqueue to the last job done
    most_attempts: int  # the most attempts a done job used
    expiries: int  # leases the reapers found expired (a claim whose answer the crash cut off)
    errors_logged: int  # ERROR lines in the workers' logs
    console_ready: int  # ready effect jobs as the console read them on the new primary (0: drained)
    console_on_standby: bool  # whether that read said it was on a standby
    logs: str


def _count(conn: psycopg.Connection[Any], query: str, *params: Any) -> int:
    row = conn.execute(query, params).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _refreshed(console: DataSource) -> Any:
    def attempt() -> Snapshot | None:
        try:
            return console.fetch().snapshot
        except psycopg.OperationalError:
            return None

    return attempt


def failover_dsn(primary: LocalCluster, standby: LocalCluster) -> str:
    """The libpq multi-host DSN that finds whichever of the two accepts writes."""
    return (
        f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres dbname=postgres"
        " target_session_attrs=read-write connect_timeout=2"
    )


def run_failover(*, jobs: int, workers: int, concurrency: int, logs: Path, stop_at: float = 0.3) -> FailoverResult:
    """Drain `jobs` effect jobs through `workers` processes; stop the primary once `stop_at`
    of them are done, promote the standby, and wait for the rest (stopped whatever happens)."""
    with (
        LocalCluster.create(settings=[*PRIMARY_SETTINGS, "synchronous_commit = on"]) as primary,
        Standby.of(primary) as standby,
        contextlib.ExitStack() as procs,
    ):
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            migrate.migrate(conn)
            conn.execute(APP_TABLES)
        make_sync(primary)
        dsn = failover_dsn(primary, standby)
        env = {**os.environ, "JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1"}
        for name in ("JOBTUI_POOLER", "DATABASE_URL"):
            env.pop(name, None)
        started = time.monotonic()
        with Client(dsn) as queue:
            queue.enqueue_many([NewJob("topo.effect", {"key": f"failover-{i}"}) for i in range(jobs)])
        running = []
        for i in range(workers):
            args = ["--concurrency", str(concurrency), "--lease", "10s", "--poll", "0.2s"]
            worker = WorkerProcess(f"W{i}", args, env, logs / f"W{i}.log", app=APP)
            procs.callback(worker.kill)
            running.append(worker)
        for worker in running:
            worker.wait_started()

        def all_logs() -> str:
            return "\n".join(w.log() for w in running)

        done_query = "SELECT count(*) FROM jobtui.job WHERE type = 'topo.effect' AND status = 'done'"
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            wait_until(lambda: _count(conn, done_query) >= jobs * stop_at, 120, "the drain under way", all_logs)
            done_before = _count(conn, done_query)
        # The console's data on the same multi-host DSN, read before and after the failover.
        console = DataSource(dsn, "jobtui")
        procs.callback(console.close)
        console.fetch()
        stopped = time.monotonic()
        primary.stop("immediate")  # a crash: no shutdown checkpoint, clients cut off
        with psycopg.connect(standby.dsn(), autocommit=True) as conn:
            # Every claim before this was on the old primary; every one after, on the new.
            promoted_at: datetime = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        standby.promote()
        promotion = time.monotonic() - stopped
        with psycopg.connect(standby.dsn(), autocommit=True) as conn:
            wait_until(lambda: _count(conn, done_query) == jobs, 300, "every job done on the new primary", all_logs)
            drain = time.monotonic() - started
            first_claim = conn.execute(
                "SELECT extract(epoch FROM min(started_at) - %s) FROM jobtui.job"
                " WHERE type = 'topo.effect' AND started_at > %s",
                (promoted_at, promoted_at),
            ).fetchone()
            # The console's first refresh after the crash fails (its connection was cut);
            # the next one reconnects, to the new primary.
            console_back = wait_until(_refreshed(console), 30, "a console refresh on the new primary", all_logs)
            done = _count(conn, done_query)
            effects = _count(conn, "SELECT count(*) FROM effect_log")
            distinct = _count(conn, "SELECT count(DISTINCT key) FROM effect_log")
            most = _count(conn, "SELECT max(attempts) FROM jobtui.job WHERE type = 'topo.effect'")
            expiries = _count(conn, "SELECT count(*) FROM jobtui.lease_expiry")
        text = all_logs()
        errors = [ln for ln in text.splitlines() if " ERROR " in ln]
        return FailoverResult(
            jobs=jobs,
            done=done,
            effects=effects,
            distinct_effects=distinct,
            done_before_stop=done_before,
            promotion_seconds=promotion,
            promotion_to_first_claim=float(first_claim[0]) if first_claim and first_claim[0] is not None else -1.0,
            drain_seconds=drain,
            most_attempts=most,
            expiries=expiries,
            errors_logged=len(errors),
            console_ready=sum(t.ready for t in console_back.by_type if t.type == "topo.effect"),
            console_on_standby=console_back.standby,
            logs=text,
        )
