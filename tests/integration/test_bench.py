"""`jobtui bench` against real PostgreSQL: real worker processes drain real jobs, and the
benchmark's schema is gone afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import psycopg

from jobtui.cli import bench
from jobtui.core import bench as core_bench


def test_bench_drains_its_jobs_with_worker_processes_and_cleans_up(dsn: str) -> None:
    result = bench.run(dsn, n=600, workers=2, concurrency=10, latency_jobs=20)
    assert result.jobs == 600 and result.workers == 2 and result.latency_samples == 20
    assert result.enqueue_per_s > 0 and result.drain_per_s > 0
    assert 0 < result.latency_p50_ms <= result.latency_p90_ms <= result.latency_p99_ms
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (core_bench.BENCH_SCHEMA,)
        ).fetchone()
    assert row == (0,)


def test_bench_with_workers_deleting_on_complete_counts_every_job(dsn: str) -> None:
    # run() raises unless the tallies and done rows account for every job drained.
    result = bench.run(dsn, n=600, workers=2, concurrency=10, latency_jobs=20, delete_on_complete=True)
    assert result.jobs == 600 and result.latency_samples == 20 and result.drain_per_s > 0
    assert 0 < result.latency_p50_ms <= result.latency_p99_ms


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_bench_schema_option_runs_in_that_schema(dsn: str) -> None:
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:  # which schemas exist while the benchmark runs
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not done.is_set():
                rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE '%bench%'").fetchall()
                seen.update(str(r[0]) for r in rows)
                done.wait(0.05)  # the watch's pace; the end of the run ends it at once

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = _cli(dsn, "bench", "--schema", "my_bench", "--jobs", "300", "--workers", "1", "--concurrency", "10")
    finally:
        done.set()
        watcher.join(10)
    assert result.returncode == 0, result.stderr
    assert "in schema my_bench (dropped afterwards)" in result.stdout
    assert "drain" in result.stdout
    assert seen == {"my_bench"}  # never jobtui_bench
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'my_bench'").fetchone() == (0,)


def test_bench_refuses_a_schema_it_did_not_make(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA app_data")
        conn.execute("CREATE TABLE app_data.orders (id int)")
        conn.execute("INSERT INTO app_data.orders VALUES (1)")
    for args in (["bench", "--schema", "app_data"], ["--schema", "app_data", "bench"], ["bench", "--schema", "jobtui"]):
        result = _cli(dsn, *args, "--jobs", "10")
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("jobtui: error: schema "), result.stderr
        assert "already exists and jobtui bench did not make it" in lines[0]
        assert result.stdout == ""
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM app_data.orders").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM jobtui.job").fetchone() == (0,)  # jobtui's schema untouched
