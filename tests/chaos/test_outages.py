"""Outages longer than a lease, zombies inside an effect's transaction, and restarts, against
real worker processes and real PostgreSQL.

The workers reach the server through a TCP proxy (tests/proxy.py) that the test cuts (every
connection reset, new ones refused) or freezes (nothing moves, nothing is reset: a
partition), or run on a cluster of the test's own (tests/cluster.py) that it restarts. The
handlers (tests/apps/outage_app.py) log their starts and stops with the machine's monotonic
clock to a file, since the database cannot be written while it is away.

`-m slow` runs 20 outage trials; the default run keeps three of them.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui import AsyncClient, Client, DatabaseUnavailable, NewJob
from jobtui.core.jobs import enqueue, enqueue_call
from jobtui.kernel import migrate
from tests.chaos.app_workers import LEASE, Start, db_with, overlapping
from tests.chaos.outages import outage_into_a_job
from tests.cluster import LocalCluster
from tests.proxy import Proxy
from tests.waits import hold, wait_until
from tests.workers import APP_TABLES, WorkerProcess, close_gate, open_gate

APP = "tests.apps.outage_app:jobs"
Conn = psycopg.Connection[Any]


db = db_with(APP_TABLES)


@dataclass(frozen=True)
class Run:
    """One attempt as the handler saw it: its lease token, worker, start and stop (monotonic)."""

    token: int
    worker: str
    started: float
    stopped: float | None
    how: str | None  # end, cancelled (async), stopped (a sync handler saw job.lost)


def runs(events: Path, job_id: int) -> list[Run]:
    starts: dict[int, tuple[str, float]] = {}
    stops: dict[int, tuple[str, float]] = {}
    text = events.read_text() if events.exists() else ""
    for line in text.splitlines():
        what, job, token, worker, at = line.split()
        if int(job) != job_id:
            continue
        if what == "start":
            assert int(token) not in starts, f"attempt {token} of job {job_id} started twice"
            starts[int(token)] = (worker, float(at))
        else:
            stops[int(token)] = (what, float(at))
    return [
        Run(token, worker, at, stops.get(token, (None, None))[1], stops.get(token, (None, None))[0])
        for token, (worker, at) in sorted(starts.items())
    ]


def job_row(db: Conn, job_id: int) -> dict[str, Any]:
    cur = db.execute(
        "SELECT status, attempts, lease_token, lease_expirations, errors FROM jobtui.job WHERE id = %s", (job_id,)
    )
    names = [c.name for c in cur.description or []]
    found = cur.fetchone()
    assert found is not None
    return dict(zip(names, found, strict=True))


def effects(db: Conn, key: str) -> list[tuple[int, str]]:
    return [(int(r[0]), str(r[1])) for r in db.execute("SELECT attempt, worker FROM effect_log WHERE key = %s", (key,))]


# -- outages longer than the lease --------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    mode: str  # cut: connections reset, new ones refused; freeze: a partition
    job_type: str
    outage: float  # seconds
    workers: int  # all through the proxy; the job runs on the first
    offset: float  # seconds from the handler's start to the outage

    def __str__(self) -> str:
        kind = self.job_type.split(".")[1]
        return f"{self.mode}-{kind}-{self.outage:g}s-{self.workers}w-at{self.offset:g}s"


# The short set: a cut and a partition, sync and async, and one outage past 10 s (where a
# per-connection back-off used to sleep longest) with a second worker that could reap the job.
SHORT_TRIALS = [
    Trial("cut", "outage.async", 2 * LEASE, 1, 0.3),
    Trial("freeze", "outage.sync", 2 * LEASE, 2, 0.6),
    Trial("cut", "outage.async", 11.0, 2, 1.0),
]


def _slow_trials(n: int = 20, seed: int = 15) -> list[Trial]:
    rng = random.Random(seed)
    trials = [Trial("cut", "outage.sync", 12.0, 2, 1.2)]  # the long one, on a sync handler
    while len(trials) < n:
        trials.append(
            Trial(
                rng.choice(["cut", "freeze"]),
                rng.choice(["outage.async", "outage.sync"]),
                round(rng.uniform(2 * LEASE, 4 * LEASE), 1),
                rng.choice([1, 2]),
                round(rng.uniform(0.1, 1.5), 1),
            )
        )
    return trials


def _outage_trial(trial: Trial, db: Conn, dsn: str, proxy: Proxy, start: Start, events: Path) -> None:
    through = proxy.dsn(dsn)
    workers = [start(f"W{i}", through, "--concurrency", "2") for i in range(trial.workers)]
    # Enqueued once every worker runs, so the first one may take it or not: either is fine.
    job_id = enqueue(db, enqueue_call(trial.job_type, {"seconds": 4 * LEASE}))
    wait_until(lambda: runs(events, job_id), 10, "the job to start", workers[0].log)
    down, up = (proxy.cut, proxy.restore) if trial.mode == "cut" else (proxy.freeze, proxy.thaw)
    outage_into_a_job(trial.offset, trial.outage, down, up)

    def logs() -> str:
        return "\n".join(f"--- {w.name} ---\n{w.log()}" for w in workers)

    wait_until(lambda: job_row(db, job_id)["status"] == "done", 60, "the job done after the outage", logs)
    # Every attempt's handler ended (done, cancelled or stopped): none still runs to overlap.
    wait_until(lambda: all(r.how is not None for r in runs(events, job_id)), 2 * LEASE, "every handler ended", logs)
    found = runs(events, job_id)
    row = job_row(db, job_id)
    assert not overlapping(found), f"two attempts ran at once: {overlapping(found)}\n{logs()}"
    # The attempt the outage interrupted was given up and handed back without counting; the
    # one after it did the job.
    assert found[0].how in ("cancelled", "stopped"), (found, logs())
    assert (row["status"], row["attempts"], row["lease_expirations"]) == ("done", 1, 0), (row, logs())
    assert [e["kind"] for e in row["errors"]] == ["abandoned"] * (row["lease_token"] - 1), row["errors"]
    assert db.execute("SELECT count(*) FROM jobtui.lease_expiry").fetchone() == (0,)
    assert len(effects(db, f"outage:{job_id}")) == 1
    assert all(w.proc.poll() is None for w in workers), logs()


@pytest.mark.parametrize("trial", SHORT_TRIALS, ids=str)
def test_an_outage_longer_than_the_lease_runs_no_job_twice_and_counts_no_attempt(
    trial: Trial, db: Conn, dsn: str, proxy: Proxy, start: Start, events: Path
) -> None:
    _outage_trial(trial, db, dsn, proxy, start, events)


@pytest.mark.slow
@pytest.mark.parametrize("trial", _slow_trials(), ids=str)
def test_outage_trials(trial: Trial, db: Conn, dsn: str, proxy: Proxy, start: Start, events: Path) -> None:
    _outage_trial(trial, db, dsn, proxy, start, events)


# -- zombies inside the effect's transaction ----------------------------------------------


def _freeze_in_effect(mode: str, db: Conn, dsn: str, start: Start, tmp_path: Path) -> tuple[int, WorkerProcess, int]:
    """Worker X starts the job, opens the effect's transaction and is frozen there (before or
    after `once()`, by `mode`), held at a gate the test opens; worker Y runs meanwhile."""
    marker = tmp_path / f"holding-{mode}"
    x = start("X", dsn)
    gate = close_gate(db)
    job_id = enqueue(db, enqueue_call("hold_effect", {"mode": mode, "marker": str(marker), "gate": gate}))
    wait_until(marker.exists, 10, "X inside the effect's transaction", x.log)
    x.signal(signal.SIGSTOP)
    start("Y", dsn)
    return job_id, x, gate


def _refused(tmp_path: Path, job_id: int) -> bool:
    """Whether the handler logged that once() refused attempt 1 of `job_id`."""
    log = tmp_path / "events.log"
    return log.exists() and any(
        line.split()[:3] == ["refused", str(job_id), "1"] for line in log.read_text().splitlines()
    )


def test_a_zombie_checking_its_lease_after_a_reclaim_is_refused(
    db: Conn, dsn: str, start: Start, tmp_path: Path
) -> None:
    job_id, x, gate = _freeze_in_effect("before", db, dsn, start, tmp_path)
    try:
        # X held no lock yet: its lease expired and Y took the job, did the effect and finished.
        wait_until(lambda: job_row(db, job_id)["status"] == "done", 20, "Y to do the job")
        assert effects(db, f"hold:{job_id}") == [(2, "Y")]
    finally:
        open_gate(db, gate)
        x.signal(signal.SIGCONT)
    # X wakes inside its transaction and calls once(): refused, nothing recorded.
    wait_until(lambda: _refused(tmp_path, job_id), 15, "X's once() to be refused", x.log)
    x.wait_gave_up(job_id, "hold_effect", 15)
    assert effects(db, f"hold:{job_id}") == [(2, "Y")]
    row = job_row(db, job_id)
    assert (row["status"], row["lease_token"]) == ("done", 2)
    assert db.execute("SELECT count(*) FROM jobtui.effect").fetchone() == (1,)


def test_a_zombie_inside_its_effect_transaction_keeps_the_job_until_it_commits(
    db: Conn, dsn: str, start: Start, tmp_path: Path
) -> None:
    job_id, x, gate = _freeze_in_effect("after", db, dsn, start, tmp_path)
    try:
        hold(3 * LEASE, "X frozen for three leases: time for Y to reap and claim the job, were it able to")
        # once() locked the job's row: however long X is frozen, its expired lease is not
        # reaped and nobody claims the job, so the effect cannot commit under a later claim.
        row = job_row(db, job_id)
        assert (row["status"], row["lease_token"], row["lease_expirations"]) == ("running", 1, 0), row
    finally:
        open_gate(db, gate)
        x.signal(signal.SIGCONT)
    # X commits its effect and its handler returns. X may give the attempt up when it wakes
    # (its lease was not extended in time), but its thread runs on to the end without seeing
    # that, and the row is still X's: X writes it done. Only in the moment between X's commit and
    # its outcome could Y's reaper take the expired lease; then Y finds the effect done.
    wait_until(lambda: job_row(db, job_id)["status"] == "done", 20, "the job done", x.log)
    assert effects(db, f"hold:{job_id}") == [(1, "X")]
    row = job_row(db, job_id)
    assert (row["attempts"], row["lease_token"], row["lease_expirations"]) in ((1, 1, 0), (2, 2, 1)), row
    if row["lease_token"] == 1:
        assert row["errors"] == [], row


# -- the handler's own database errors ----------------------------------------------------


def test_a_handlers_lost_connection_does_not_count_as_an_attempt(db: Conn, dsn: str, start: Start) -> None:
    w = start("W", dsn)
    # Its connection is terminated 3 times inside the effect's transaction; it allows 2 attempts.
    job_id = enqueue(db, enqueue_call("db_error", {"fail": 3}))
    wait_until(lambda: job_row(db, job_id)["status"] == "done", 20, "the job done", w.log)
    row = job_row(db, job_id)
    assert row["attempts"] == 1 and row["lease_token"] == 4
    assert [e["kind"] for e in row["errors"]] == ["db_error"] * 3
    assert all("AdminShutdown" in e["error"] for e in row["errors"])
    # The terminated transactions recorded nothing; the fourth did the effect once.
    assert effects(db, f"db-error:{job_id}") == [(4, "W")]
    assert "the handler's database connection failed; released, not counted (1 of 25 in a row)" in w.log()


def test_a_handler_that_always_loses_its_connection_ends_dead(db: Conn, dsn: str, start: Start) -> None:
    w = start("W", dsn, "--concurrency", "1")
    job_id = enqueue(db, enqueue_call("db_error", {"fail": 1000}, max_attempts=1))
    wait_until(lambda: job_row(db, job_id)["status"] == "dead", 60, "the job dead", w.log)
    row = job_row(db, job_id)
    # 25 releases in a row, then the 26th run counts: its one attempt.
    assert (row["attempts"], row["lease_token"]) == (1, 26)
    assert row["errors"][-1]["kind"] == "error"
    assert "releases in a row without an attempt counted" in row["errors"][-1]["error"]


# -- start-up and restarts ----------------------------------------------------------------


def test_a_worker_started_while_the_database_is_away_waits_for_it(
    db: Conn, dsn: str, proxy: Proxy, start: Start
) -> None:
    proxy.cut()
    w = start("W", proxy.dsn(dsn), wait=False)
    w.wait_log("waiting up to 60s for PostgreSQL", 15)
    hold(1.5, "a while in which the worker must not give up and exit")
    assert w.proc.poll() is None, w.log()
    proxy.restore()
    w.wait_started(20)
    assert w.log().count("waiting up to") == 1
    job_id = enqueue(db, enqueue_call("outage.async", {"seconds": 0}))
    wait_until(lambda: job_row(db, job_id)["status"] == "done", 15, "a job done", w.log)


def test_a_worker_gives_up_waiting_for_the_database_with_one_line(dsn: str, proxy: Proxy, start: Start) -> None:
    proxy.cut()
    w = start("W", proxy.dsn(dsn), "--wait-for-db", "1s", wait=False)
    assert w.wait_exit(20) == 2, w.log()
    errors = [line for line in w.log().splitlines() if line.startswith("jobtui: error:")]
    assert len(errors) == 1 and "cannot reach PostgreSQL" in errors[0] and "waited 1s" in errors[0], w.log()
    assert "Traceback" not in w.log()


def test_after_a_restart_heartbeats_go_first_and_claims_are_back_within_two_seconds(
    tmp_path: Path, start: Start, events: Path
) -> None:
    with LocalCluster.create() as cluster:
        admin = cluster.dsn("postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE app")
        app = cluster.dsn("app")
        with psycopg.connect(app, autocommit=True) as conn:
            migrate.migrate(conn)
            conn.execute(APP_TABLES)
        w = start("W", app, "--lease", "6s")
        with psycopg.connect(app, autocommit=True) as conn:
            # Runs across the restart: its lease (6 s) outlasts the restart, so the worker's
            # first act when the server is back is to extend it, not to lose it.
            long = enqueue(conn, enqueue_call("outage.async", {"seconds": 8}))
        wait_until(lambda: runs(events, long), 10, "the long job to start", w.log)
        cluster.stop()
        # The worker has seen the server gone, with the long job in flight.
        w.wait_log("database unreachable", 15)
        # The moment the server first accepts a connection, not the moment pg_ctl reports it.
        accepting = cluster.start_accepting()
        with psycopg.connect(app, autocommit=True) as conn:
            quick = enqueue(conn, enqueue_call("outage.async", {"seconds": 0}))
        wait_until(lambda: runs(events, quick), 10, "the job enqueued after the restart to start", w.log)
        took = runs(events, quick)[0].started - accepting
        print(f"from the server accepting connections to the first claim: {took:.2f}s")
        assert took < 2.0, f"{took:.2f}s from accepting connections to the first claim\n{w.log()}"
        with psycopg.connect(app, autocommit=True) as conn:
            wait_until(
                lambda: conn.execute("SELECT status FROM jobtui.job WHERE id = %s", (long,)).fetchone() == ("done",),
                20,
                "the long job done",
                w.log,
            )
            row = conn.execute(
                "SELECT attempts, lease_token, lease_expirations FROM jobtui.job WHERE id = %s", (long,)
            ).fetchone()
        assert row == (1, 1, 0), (row, w.log())
        assert [r.how for r in runs(events, long)] == ["end"]


def test_pooled_clients_survive_the_server_dropping_their_connections(dsn: str, db: Conn) -> None:
    def drop_connections() -> None:
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )

    with Client(dsn, max_connections=2) as q:
        q.enqueue("t")
        q.enqueue_many([])  # a second pooled connection may be open too
        drop_connections()
        # The first call after the drop works: the pool checks a connection before handing it out.
        assert q.enqueue("t") > 0

    async def async_side() -> None:
        async with AsyncClient(dsn, max_connections=2) as aq:
            await aq.enqueue("t")
            drop_connections()
            assert await aq.enqueue("t") > 0

    asyncio.run(async_side())


def test_every_client_call_fails_the_same_way_when_the_database_is_away(dsn: str, proxy: Proxy) -> None:
    # Connections refused or reset: every call fails at once, naming why, however long its
    # timeout (3 s: the first call starts the client's pool on a loaded machine).
    proxy.cut()
    away = proxy.dsn(dsn)
    bulk = [NewJob("t") for _ in range(2000)]
    with Client(away, timeout=10) as q:
        for call in (lambda: q.enqueue("t"), lambda: q.enqueue_many(bulk)):
            began = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="cannot reach PostgreSQL"):
                call()
            assert time.monotonic() - began < 3

    async def async_side() -> None:
        async with AsyncClient(away, timeout=10) as aq:
            for call in (lambda: aq.enqueue("t"), lambda: aq.enqueue_many(bulk)):
                began = time.monotonic()
                with pytest.raises(DatabaseUnavailable, match="cannot reach PostgreSQL"):
                    await call()
                assert time.monotonic() - began < 3

    asyncio.run(async_side())
