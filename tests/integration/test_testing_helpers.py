"""jobtui.testing against real PostgreSQL: the assertions see the caller's transaction,
run_job and drain run handlers (through their middleware) and write real outcomes; and the
pytest example the docs show passes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from jobtui import Client, Job, Jobs, JobStatus, NewJob, Retry
from jobtui.testing import adrain, assert_enqueued, drain, refute_enqueued, run_job

ROOT = Path(__file__).resolve().parents[2]


def _jobs(calls: list[str]) -> Jobs:
    jobs = Jobs()

    @jobs.middleware
    def seen(job: Job) -> Iterator[None]:
        calls.append(f"mw {job.type}")
        yield

    @jobs.handler("ok")
    def ok(job: Job) -> None:
        calls.append(f"ok {job.payload['n']}")

    @jobs.handler("flaky", max_attempts=2)
    async def flaky(job: Job) -> None:
        raise ValueError(f"flaky {job.attempt}")

    @jobs.handler("later")
    def later(job: Job) -> None:
        raise Retry(delay=3600)

    return jobs


def test_assertions_see_the_open_transaction(dsn: str) -> None:
    with psycopg.connect(dsn) as conn, Client(dsn) as queue:
        queue.enqueue("ok", {"n": 1, "extra": True}, conn=conn)
        assert assert_enqueued(conn, "ok", {"n": 1})["payload"] == {"n": 1, "extra": True}
        refute_enqueued(conn, "ok", {"n": 2})
        with pytest.raises(AssertionError, match=r"found 0; 'ok' jobs there: \[\{"):
            assert_enqueued(conn, "ok", {"n": 2})
        with psycopg.connect(dsn) as other:
            refute_enqueued(other, "ok")  # not committed: nobody else sees it
        conn.rollback()
        refute_enqueued(conn, "ok")


def test_run_job_writes_each_outcome(dsn: str) -> None:
    calls: list[str] = []
    jobs = _jobs(calls)
    done = run_job(jobs, dsn, "ok", {"n": 7})
    assert (done.outcome, done.row.status, done.row.attempts) == ("complete", JobStatus.DONE, 1)
    failed = run_job(jobs, dsn, "flaky", {})
    assert failed.outcome == "fail" and failed.row.status is JobStatus.READY and "flaky 1" in failed.error
    assert failed.row.max_attempts == 2  # the handler's limit, as a worker claims it
    later = run_job(jobs, dsn, "later", {})
    assert later.outcome == "retry" and later.row.status is JobStatus.READY and later.row.attempts == 0
    assert calls == ["mw ok", "ok 7", "mw flaky", "mw later"]


def test_drain_runs_due_jobs_until_none_is_due(dsn: str) -> None:
    calls: list[str] = []
    jobs = _jobs(calls)
    with Client(dsn) as queue:
        queue.enqueue_many([NewJob("ok", {"n": i}) for i in range(3)] + [NewJob("later", {})])
    ran = drain(jobs, dsn)
    assert sorted(r.outcome for r in ran) == ["complete", "complete", "complete", "retry"]
    with Client(dsn) as queue:
        assert queue.count(status="done") == 3 and queue.count(status="ready", type="later") == 1


async def test_adrain_in_async_tests(dsn: str) -> None:
    with Client(dsn) as queue:
        queue.enqueue("flaky", {})
    ran = await adrain(_jobs([]), dsn)
    # Retried after its backoff, so not due again within the drain.
    assert [r.outcome for r in ran] == ["fail"]


def test_the_pytest_example_passes(dsn: str) -> None:
    env = {**os.environ, "JOBTUI_DSN": dsn}
    # In one process, as in an application's own project: the example's tests share its
    # database, and this repository's pytest settings would run them in three.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "examples/testing"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout
