"""jobtui behind a real PgBouncer in transaction mode (a pool of 4 server connections):
enqueue, two worker processes with their schedulers, the console's refresh and `stats`, with
no session state, no prepared statement and no LISTEN through the pooler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from jobtui import Client, NewJob
from jobtui.cli.main import main
from jobtui.tui.data import DataSource
from tests.apps.topology_app import APP_TABLES
from tests.cli import run_cli
from tests.topology import PgBouncer
from tests.waits import wait_until
from tests.workers import ROOT, WorkerProcess

APP = "tests.apps.topology_app:jobs"
Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def bouncer(dsn: str) -> Iterator[PgBouncer]:
    params = conninfo_to_dict(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(APP_TABLES)
    host, port = str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))
    with PgBouncer.start(upstream_host=host, upstream_port=port, pool_size=4) as running:
        yield running


def _pooled(bouncer: PgBouncer, dsn: str) -> str:
    return bouncer.dsn(str(conninfo_to_dict(dsn)["dbname"]))


def _count(conn: Conn, query: str) -> int:
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]


@pytest.mark.parametrize("bulk", [1000, pytest.param(20_000, marks=pytest.mark.slow)])
def test_a_drain_through_pgbouncer_in_transaction_mode_loses_nothing_and_logs_no_error(
    bulk: int, dsn: str, bouncer: PgBouncer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = bulk + 20
    pooled = _pooled(bouncer, dsn)
    monkeypatch.setenv("JOBTUI_POOLER", "transaction")  # the console's, as `jobtui --pooler` sets it
    with Client(pooled, pooler="transaction") as queue:
        # 1000 keyless jobs or more take the COPY path; the lone enqueues run more than five times on
        # the same pooled connections, where psycopg would otherwise prepare them.
        queue.enqueue_many([NewJob("topo.effect", {"key": f"bulk-{i}"}) for i in range(bulk)])
        for i in range(20):
            queue.enqueue("topo.effect", {"key": f"one-{i}"}, key=f"one-{i}")
    env = {**os.environ, "JOBTUI_DSN": pooled, "JOBTUI_POOLER": "transaction", "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    # A polls; B listens on a direct DSN of its own. A short lease reaps often: the reaper
    # shares the claims' connection, and each claim is a transaction of its own.
    workers = [
        WorkerProcess(
            name,
            ["--concurrency", "20", "--poll", "0.2s", "--lease", "2s", *extra],
            env,
            tmp_path / f"{name}.log",
            app=APP,
        )
        for name, extra in (("A", []), ("B", ["--listen-dsn", dsn]))
    ]
    source = DataSource(pooled, "jobtui")
    try:
        for worker in workers:
            worker.wait_started()
        logs = lambda: "\n".join(w.log() for w in workers)  # noqa: E731
        refreshes = 0

        def drained() -> bool:
            # The console's refresh during the drain, on one pooled client connection whose
            # transactions go to whichever server connection is free.
            nonlocal refreshes
            source.fetch()
            refreshes += 1
            return _count(db, "SELECT count(*) FROM jobtui.job WHERE type = 'topo.effect' AND status = 'done'") == total

        with psycopg.connect(dsn, autocommit=True) as db:
            wait_until(drained, 90 + total / 100, f"{total} jobs done through the pooler", logs)
            assert refreshes > 5  # more than psycopg's threshold for preparing a statement
            # The console's refreshes, on one pooled connection: each snapshot is one transaction.
            for _ in range(8):
                fetched = source.fetch()
            # The drained type: a schedule's tick may be due and ready at this moment.
            assert sum(t.ready for t in fetched.snapshot.by_type if t.type == "topo.effect") == 0
            wait_until(
                lambda: _count(db, "SELECT count(*) FROM jobtui.job WHERE type = 'topo.tick' AND status = 'done'"),
                15,
                "a scheduled tick done",
                logs,
            )
            # B's wake-ups: one session LISTENs, on the direct DSN.
            listening = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND query LIKE '%LISTEN %'"
            )
            assert _count(db, listening) == 1
            assert _count(db, "SELECT count(*) FROM effect_log") == total
            assert _count(db, "SELECT count(DISTINCT key) FROM effect_log") == total
        stats = run_cli("--pooler", "transaction", "--dsn", pooled, "stats", "--json", env=env)
        assert stats.returncode == 0, stats.stderr
        read = json.loads(stats.stdout)
        # The drained type, as above: a schedule's tick may be due and ready at this moment.
        assert sum(t["ready"] for t in read["by_type"] if t["type"] == "topo.effect") == 0, read["by_type"]
        assert read["totals"]["done_last_minute"] > 0
    finally:
        source.close()
        for worker in workers:
            worker.kill()
    for worker in workers:
        assert " ERROR " not in worker.log(), worker.log()
    # LISTEN cannot work through the pooler: the worker without a direct DSN says it polls.
    assert "polling every 0.2s" in workers[0].log()
    assert "polling" not in workers[1].log()
    assert "prepared statement" not in bouncer.log()


def test_the_pooler_flag_reaches_the_command_as_a_value_not_through_the_environment(
    dsn: str, bouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("JOBTUI_POOLER", raising=False)
    pooled = _pooled(bouncer, dsn)
    assert main(["--pooler", "transaction", "--dsn", pooled, "enqueue", "topo.effect", "--payload", "{}"]) == 0
    assert main(["--pooler", "transaction", "--dsn", pooled, "stats", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{") :])["totals"]["ready"] == 1
    assert "JOBTUI_POOLER" not in os.environ
    assert "prepared statement" not in bouncer.log()


def test_a_bad_pooler_setting_is_one_line_and_exit_code_2(dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "stats"],
        cwd=ROOT,
        env={**os.environ, "JOBTUI_POOLER": "statement"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "JOBTUI_POOLER=transaction" in done.stderr, done.stderr


def test_the_console_behind_a_transaction_pooler_leaves_no_setting_on_its_server_connection(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind PgBouncer in transaction mode a session setting stays on the server connection
    for its next client, a worker say: the console's statement timeout must not."""
    params = conninfo_to_dict(dsn)
    host, port = str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))
    monkeypatch.setenv("JOBTUI_POOLER", "transaction")
    with PgBouncer.start(upstream_host=host, upstream_port=port, pool_size=1) as one:
        pooled = _pooled(one, dsn)
        source = DataSource(pooled, "jobtui")
        try:
            source.fetch()
        finally:
            source.close()
        # The pool has one server connection: the console's, now this client's.
        with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as other:
            row = other.execute("SELECT current_setting('statement_timeout')").fetchone()
    assert row == ("0",)


def test_an_order_reaches_a_worker_behind_the_pooler_at_its_next_refresh(
    dsn: str, bouncer: PgBouncer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No LISTEN through the pooler: the worker registers, and reads a quiet, a resume and a
    stop, given through the pooler too, in the answer of its next refresh."""
    from jobtui.reads.fleet import read_fleet

    pooled = _pooled(bouncer, dsn)
    env = {**os.environ, "JOBTUI_DSN": pooled, "JOBTUI_POOLER": "transaction", "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    worker = WorkerProcess("P", ["--poll", "0.2s", "--lease", "3s"], env, tmp_path / "P.log", app=APP)
    cli = ["--pooler", "transaction", "--dsn", pooled, "workers"]
    try:
        worker.wait_started()
        with psycopg.connect(dsn, autocommit=True) as db:

            def state() -> str:
                return next(p.state for p in read_fleet(db).processes if p.name == "P")

            assert state() == "running"
            assert main([*cli, "quiet", "P"]) == 0
            wait_until(lambda: state() == "quiet", 5, "P quiet, read at a refresh (every 1 s)", worker.log)
            with Client(dsn) as queue:
                queue.enqueue("topo.noop", {})
            assert main([*cli, "resume", "P"]) == 0
            done = "SELECT count(*) FROM jobtui.job WHERE type = 'topo.noop' AND status = 'done'"
            wait_until(lambda: _count(db, done) == 1, 10, "a job done after the resume", worker.log)
            assert main([*cli, "stop", "P"]) == 0
            assert worker.wait_exit(15) == 0
            assert [p.name for p in read_fleet(db).processes] == []
        capsys.readouterr()
    finally:
        worker.kill()
    assert "polling every 0.2s" in worker.log()
    assert "prepared statement" not in bouncer.log()
