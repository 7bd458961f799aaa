"""`jobtui bench` against real PostgreSQL: real worker processes drain real jobs, and the
benchmark's schema is gone afterwards."""

from __future__ import annotations

import psycopg

from jobtui import bench


def test_bench_drains_its_jobs_with_worker_processes_and_cleans_up(dsn: str) -> None:
    result = bench.run(dsn, n=600, workers=2, concurrency=10, latency_jobs=20)
    assert result.jobs == 600 and result.workers == 2 and result.latency_samples == 20
    assert result.enqueue_per_s > 0 and result.drain_per_s > 0
    assert 0 < result.latency_p50_ms <= result.latency_p90_ms <= result.latency_p99_ms
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (bench.BENCH_SCHEMA,)).fetchone()
    assert row == (0,)


def test_bench_with_workers_deleting_on_complete_counts_every_job(dsn: str) -> None:
    # run() raises unless the tallies and done rows account for every job drained.
    result = bench.run(dsn, n=600, workers=2, concurrency=10, latency_jobs=20, delete_on_complete=True)
    assert result.jobs == 600 and result.latency_samples == 20 and result.drain_per_s > 0
    assert 0 < result.latency_p50_ms <= result.latency_p99_ms
