"""Retry delays: exact values without jitter, the cap, huge attempts, jitter bounds."""

from __future__ import annotations

import math
import random
import sys

import pytest

from jobtui.kernel.backoff import DEFAULT_POLICY, BackoffPolicy, delay

DOUBLING = BackoffPolicy(base=1, factor=2, cap=60, jitter=0)


@pytest.mark.parametrize(
    ("attempt", "policy", "expected"),
    [
        (1, DOUBLING, 1.0),
        (2, DOUBLING, 2.0),
        (3, DOUBLING, 4.0),
        (4, DOUBLING, 8.0),
        (6, DOUBLING, 32.0),
        (7, DOUBLING, 60.0),  # 64 is over the cap
        (8, DOUBLING, 60.0),
        (1, BackoffPolicy(base=5, factor=3, cap=1000, jitter=0), 5.0),
        (3, BackoffPolicy(base=5, factor=3, cap=1000, jitter=0), 45.0),
        (5, BackoffPolicy(base=5, factor=3, cap=1000, jitter=0), 405.0),
        (6, BackoffPolicy(base=5, factor=3, cap=1000, jitter=0), 1000.0),
        (1, BackoffPolicy(base=0.5, factor=2, cap=10, jitter=0), 0.5),
        (4, BackoffPolicy(base=0.5, factor=2, cap=10, jitter=0), 4.0),
        (7, BackoffPolicy(base=1, factor=2, cap=64, jitter=0), 64.0),  # exactly at the cap
        (3, BackoffPolicy(base=1, factor=2, cap=4, jitter=0), 4.0),
        (1, BackoffPolicy(base=7, factor=1, cap=100, jitter=0), 7.0),  # constant delay
        (500, BackoffPolicy(base=7, factor=1, cap=100, jitter=0), 7.0),
        (1, BackoffPolicy(base=0, factor=2, cap=10, jitter=0), 0.0),  # no delay at all
        (50, BackoffPolicy(base=0, factor=2, cap=10, jitter=0.5), 0.0),
        (1, BackoffPolicy(base=3, factor=2, cap=3, jitter=0), 3.0),  # cap equal to base
        (1, BackoffPolicy(jitter=0), 1.0),
        (13, BackoffPolicy(jitter=0), 3600.0),  # 4096 > default cap of an hour
        (12, BackoffPolicy(jitter=0), 2048.0),
    ],
)
def test_delay_without_jitter(attempt: int, policy: BackoffPolicy, expected: float) -> None:
    result = delay(attempt, policy)
    assert type(result) is float
    assert result == expected


@pytest.mark.parametrize("attempt", [1000, 10**6, 2**31 - 1, 2**63, sys.maxsize * 10, 10**400])
@pytest.mark.parametrize("policy", [DOUBLING, BackoffPolicy(base=1, factor=1000, cap=86400, jitter=0)])
def test_huge_attempts_do_not_overflow(attempt: int, policy: BackoffPolicy) -> None:
    result = delay(attempt, policy)
    assert type(result) is float
    assert result == policy.cap


@pytest.mark.parametrize(
    ("attempt", "policy"),
    [
        (1, BackoffPolicy(base=1, factor=2, cap=60, jitter=0.25)),
        (3, BackoffPolicy(base=1, factor=2, cap=60, jitter=0.25)),
        (5, BackoffPolicy(base=10, factor=2, cap=3600, jitter=1.0)),
        (10**6, BackoffPolicy(base=1, factor=2, cap=60, jitter=0.25)),  # jitter at the cap
        (4, DEFAULT_POLICY),
    ],
)
def test_jitter_stays_within_bounds(attempt: int, policy: BackoffPolicy) -> None:
    plain = delay(attempt, BackoffPolicy(policy.base, policy.factor, policy.cap, jitter=0))
    low = plain * (1 - policy.jitter)
    high = min(plain * (1 + policy.jitter), policy.cap)
    rng = random.Random(1234)
    values = [delay(attempt, policy, rng) for _ in range(2000)]
    assert all(low <= v <= high for v in values), (min(values), max(values), low, high)
    assert all(type(v) is float for v in values)
    # The spread is used, not a constant: values reach near both ends of the range.
    assert len(set(values)) > 500
    assert min(values) < low + (plain - low) * 0.1
    if high > plain:
        assert max(values) > high - (high - plain) * 0.1
    else:  # at the cap the upper half is clipped to the cap itself
        assert max(values) == policy.cap


def test_jitter_is_deterministic_for_a_seeded_random() -> None:
    policy = BackoffPolicy(base=1, factor=2, cap=3600, jitter=0.5)
    first = [delay(n, policy, random.Random(42)) for n in range(1, 12)]
    second = [delay(n, policy, random.Random(42)) for n in range(1, 12)]
    other = [delay(n, policy, random.Random(43)) for n in range(1, 12)]
    assert first == second
    assert first != other


def test_jitter_without_rng_uses_module_random() -> None:
    policy = BackoffPolicy(base=100, factor=2, cap=3600, jitter=0.5)
    random.seed(7)
    first = delay(1, policy)
    random.seed(7)
    assert delay(1, policy) == first
    assert 50 <= first <= 150


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": -1},
        {"base": math.nan},
        {"base": math.inf},
        {"factor": 0.5},
        {"factor": 0},
        {"factor": -2},
        {"factor": math.nan},
        {"factor": math.inf},
        {"base": 10, "cap": 5},
        {"cap": math.inf},
        {"cap": 11 * 365 * 86400},  # past the 10 years a delay may have
        {"cap": math.nan},
        {"jitter": -0.1},
        {"jitter": 1.01},
        {"jitter": math.nan},
        {"jitter": math.inf},
    ],
)
def test_invalid_policy_raises(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        BackoffPolicy(**kwargs)


@pytest.mark.parametrize("attempt", [0, -1, -(10**6)])
def test_attempts_are_one_based(attempt: int) -> None:
    with pytest.raises(ValueError, match="1-based"):
        delay(attempt, DOUBLING)
