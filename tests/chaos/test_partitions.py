"""A worker cut off by a silent network partition (tests/netns.py: blackhole routes in a
router namespace, both ways) is back within 3 s of the heal, in both executors: it completes
a job of a queue only it serves, no job runs twice because of the heal, nothing is lost, each
effect is done once, and no stale write lands (tests/chaos/partition.py runs and checks it).

The default run keeps one short partition per executor; `-m slow` runs 45 s, 120 s and 300 s,
and bench/partition.py runs any length from the command line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.partition import LEASE, run_partition

BACK_WITHIN = 3.0


def _check(seconds: float, executor: str, tmp_path: Path) -> None:
    result = run_partition(seconds, executor, log_dir=tmp_path)
    assert not result.problems, f"{result.line()}\n--- A ---\n{result.log[-6000:]}"
    assert result.reclaimed_after >= LEASE, result.line()  # B waited for A's leases to expire
    assert result.back_after < BACK_WITHIN, f"{result.line()}\n--- A ---\n{result.log[-6000:]}"
    print(result.line())


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_worker_is_back_within_3s_of_a_partitions_heal(executor: str, tmp_path: Path) -> None:
    _check(15.0, executor, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seconds", [45.0, 120.0, 300.0])
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_long_partitions(seconds: float, executor: str, tmp_path: Path) -> None:
    _check(seconds, executor, tmp_path)
