"""Failover: the primary crashes mid-drain, its synchronous standby is promoted, and workers on
a multi-host DSN (target_session_attrs=read-write) carry on there. Nothing is lost, and each
effect is done once (tests/failover.py runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.failover import run_failover


def _check(jobs: int, tmp_path: Path, workers: int, concurrency: int) -> None:
    result = run_failover(jobs=jobs, workers=workers, concurrency=concurrency, logs=tmp_path)
    assert 0 < result.done_before_stop < result.jobs, "the primary must stop mid-drain"
    assert result.done == result.jobs
    assert (result.effects, result.distinct_effects) == (result.jobs, result.jobs), result.logs[-4000:]
    assert result.most_attempts == 1, "an outage counts no attempt"
    assert result.errors_logged == 0, result.logs[-4000:]
    assert result.promotion_to_first_claim >= 0, "no claim on the new primary"
    # The console reconnected to the new primary, which is no standby, and saw the drain.
    assert (result.console_on_standby, result.console_ready) == (False, 0)
    assert "connection lost" in result.logs  # the workers did see the primary go


def test_workers_carry_on_on_the_promoted_standby(tmp_path: Path) -> None:
    _check(300, tmp_path, workers=2, concurrency=10)


@pytest.mark.slow
def test_a_long_drain_survives_a_failover(tmp_path: Path) -> None:
    _check(5000, tmp_path, workers=2, concurrency=20)
