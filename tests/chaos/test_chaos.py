"""Chaos against real worker processes and real PostgreSQL: a crash anywhere delays work, never
loses or duplicates it.

The run itself is bench/chaos.py (its docstring lists the faults and the checks): jobs whose
handlers do their effect through `job.once` into a table with no unique key, worker processes
SIGKILLed and restarted, SIGSTOPped past their lease and woken up, their connections
terminated; PostgreSQL restarted in the long run (and in the short one when
JOBTUI_CHAOS_RESTART=1: a restart disturbs every other session on the server, so the CI run
leaves it to the long one). The test asserts the run's verdict and that every fault happened.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.harness import Config, Result, local_restart_command, run


def verdict(result: Result) -> str:
    violations = "\n".join(result.violations) or "none"
    return f"\n{result.table()}\nviolations:\n{violations}\nworker logs: {result.log_dir}"


def check(result: Result, config: Config) -> None:
    print(verdict(result))
    assert result.ok, verdict(result)
    assert (result.lost, result.duplicated, result.stale_outcomes, result.stale_effects, result.double_runs) == (
        0,
        0,
        0,
        0,
        0,
    )
    expected = {"done": result.effect_jobs, "dead": result.poison_jobs}
    assert result.statuses == {k: v for k, v in expected.items() if v}, verdict(result)
    # The faults did happen, and did cost leases: the run proved something.
    for kind in ("kill", "stop", "terminate"):
        assert result.faults[kind] >= 1, f"no {kind} fault in the run{verdict(result)}"
    assert result.terminated_backends >= 1 and result.lease_expiries >= 1, verdict(result)
    assert result.drain_seconds < config.drain_timeout, verdict(result)


def test_chaos_short(server_dsn: str, tmp_path: Path) -> None:
    restart = os.environ.get("JOBTUI_CHAOS_RESTART") == "1"
    if restart and local_restart_command(server_dsn) is None:
        pytest.skip("JOBTUI_CHAOS_RESTART=1 but this process cannot restart the server (root and pg_ctlcluster)")
    config = Config(
        jobs=500,
        seconds=16,
        workers=3,
        concurrency=4,
        fault_every=0.8,
        restart_postgres=restart,
        restart_every=8,
        drain_timeout=30,
        log_dir=tmp_path,
        seed=int(os.environ.get("JOBTUI_CHAOS_SEED", "0")) or None,
    )
    result = run(server_dsn, config)
    check(result, config)
    if restart:
        assert result.restart_seconds, verdict(result)


@pytest.mark.slow
def test_chaos_long(server_dsn: str, tmp_path: Path) -> None:
    restart = local_restart_command(server_dsn) is not None
    config = Config(
        jobs=3000,
        seconds=60,
        workers=4,
        concurrency=6,
        fault_every=1.0,
        restart_postgres=restart,
        restart_every=20,
        drain_timeout=90,
        log_dir=tmp_path,
    )
    result = run(server_dsn, config)
    check(result, config)
    if restart:
        assert len(result.restart_seconds) >= 1, verdict(result)


@pytest.mark.slow
def test_chaos_with_handler_processes(server_dsn: str, tmp_path: Path) -> None:
    """The same faults on workers whose sync handlers run in child processes: a SIGKILLed or
    SIGSTOPped worker's children end with it (or are stopped before its lease expires)."""
    config = Config(
        jobs=2000,
        seconds=40,
        workers=3,
        concurrency=6,
        fault_every=1.0,
        drain_timeout=90,
        log_dir=tmp_path,
        executor="process",
    )
    result = run(server_dsn, config)
    check(result, config)
