"""Schedules in named queues, and jobtui's own jobs on every worker whatever queues it serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui.core import scheduler
from jobtui.core.maintenance import ARCHIVE_TYPE, BUILTIN_QUEUE
from jobtui.core.registry import Jobs
from tests.waits import wait_until
from tests.workers import ROOT, WorkerProcess

Conn = psycopg.Connection[Any]
APP = "tests.apps.reports_app:jobs"
WORKER_APP = "tests.apps.worker_app:jobs"


def count(conn: Conn, query: str) -> int:
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def jobtui(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "--actor", "olga", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_fleet_serving_only_a_named_queue_runs_its_schedules_jobs_and_the_archivers(
    executor: str, dsn: str, conn: Conn, tmp_path: Path
) -> None:
    env = {**os.environ, "JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    # In process mode the reports run in handler processes, the archiver in a thread beside.
    args = ["--queues", "reports=2", "--poll", "0.2s", "--executor", executor]
    worker = WorkerProcess("R", args, env, tmp_path / "R.log", app=APP)
    try:
        worker.wait_started()
        done = "SELECT count(*) FROM jobtui.job WHERE type = 'rep.build' AND status = 'done' AND queue = 'reports'"
        wait_until(lambda: count(conn, done) >= 3, 20, "3 scheduled reports done", worker.log)
        # The archiver's job, now rather than at the next minute: it runs on this worker too.
        assert jobtui(dsn, "schedule", "run-now", ARCHIVE_TYPE).returncode == 0
        archived = f"SELECT count(*) FROM jobtui.job WHERE type = '{ARCHIVE_TYPE}' AND status = 'done'"
        wait_until(lambda: count(conn, archived) >= 1, 20, "the archiver's job done", worker.log)
        assert count(conn, "SELECT count(*) FROM jobtui.job WHERE queue = 'default'") == 0
        assert "jobtui.builtin x 1" in worker.log()
        assert f"sync handlers in {executor}" in worker.log()
    finally:
        worker.kill()


def test_a_schedules_queue_is_its_own_else_its_handlers_else_default(conn: Conn) -> None:
    jobs = Jobs()
    jobs.handler("mail.digest", queue="mail")(lambda job: None)
    jobs.schedule("digest", cron="0 * * * *", type="mail.digest")
    jobs.schedule("digest-now", cron="0 * * * *", type="mail.digest", queue="urgent")
    jobs.schedule("other", cron="0 * * * *", type="not.handled.here")
    scheduler.sync(conn, jobs.schedule_specs())
    rows = {r.name: r.queue for r in scheduler.list_schedules(conn)}
    assert rows == {"digest": "mail", "digest-now": "urgent", "other": "default"}
    job_id = scheduler.run_now(conn, "digest")
    assert count(conn, f"SELECT count(*) FROM jobtui.job WHERE id = {job_id} AND queue = 'mail'") == 1


def test_schedule_add_takes_a_queue_and_list_shows_it(dsn: str, conn: Conn) -> None:
    add = ("schedule", "add", "--cron", "0 3 * * *", "--type", "rep.build")
    assert jobtui(dsn, *add[:2], "nightly", *add[2:], "--queue", "reports").returncode == 0
    # Without --queue: the queue the app's handler declares, else default.
    assert jobtui(dsn, *add[:2], "from-app", *add[2:], "--app", APP).returncode == 0
    assert jobtui(dsn, *add[:2], "plain", *add[2:]).returncode == 0
    listed = json.loads(jobtui(dsn, "schedule", "list", "--json").stdout)
    assert {s["name"]: s["queue"] for s in listed} == {"from-app": "reports", "nightly": "reports", "plain": "default"}
    table = jobtui(dsn, "schedule", "list").stdout
    assert "queue" in table.splitlines()[1] and "reports" in table
    bad = jobtui(dsn, *add[:2], "bad", *add[2:], "--queue", "")
    assert bad.returncode == 2 and "bad queue name" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    with conn.transaction():
        job_id = scheduler.run_now(conn, "nightly")
    assert count(conn, f"SELECT count(*) FROM jobtui.job WHERE id = {job_id} AND queue = 'reports'") == 1


def test_the_archivers_jobs_have_a_queue_of_their_own(conn: Conn) -> None:
    from jobtui.core.maintenance import Retention, with_builtins

    jobs = with_builtins(Jobs(), "postgresql://unused.invalid/x", "jobtui", Retention())
    scheduler.sync(conn, jobs.schedule_specs())
    assert [r.queue for r in scheduler.list_schedules(conn) if r.name == ARCHIVE_TYPE] == [BUILTIN_QUEUE]


def test_a_worker_of_every_queue_runs_the_archivers_job_ahead_of_an_older_backlog(
    dsn: str, conn: Conn, tmp_path: Path
) -> None:
    # A backlog due an hour ago: a claim of every queue takes the oldest jobs first, so the
    # archiver's job (due now) would wait behind all of it but for its own slot.
    conn.execute(
        "INSERT INTO jobtui.job (type, queue, payload, run_at)"
        " SELECT 'brief', 'default', '{\"sleep\": 0.5}', now() - interval '1 hour' FROM generate_series(1, 200)"
    )
    env = {**os.environ, "JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    worker = WorkerProcess("E", ["--concurrency", "1", "--poll", "0.2s"], env, tmp_path / "E.log", app=WORKER_APP)
    try:
        worker.wait_started()
        assert jobtui(dsn, "schedule", "run-now", ARCHIVE_TYPE).returncode == 0
        archived = f"SELECT count(*) FROM jobtui.job WHERE type = '{ARCHIVE_TYPE}' AND status = 'done'"
        wait_until(lambda: count(conn, archived) >= 1, 20, "the archiver's job done", worker.log)
        assert count(conn, "SELECT count(*) FROM jobtui.job WHERE type = 'brief' AND status = 'ready'") > 100
        assert "every queue x 1, jobtui.builtin x 1" in worker.log()
    finally:
        worker.kill()
