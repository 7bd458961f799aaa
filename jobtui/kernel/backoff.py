"""Retry delays: exponential with a cap and jitter. Pure; the caller passes the random source.

>>> import random
>>> delay(3, BackoffPolicy(base=1, factor=2, cap=60, jitter=0), random.Random(0))
4.0
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from jobtui.kernel.domain import MAX_DELAY_SECONDS


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Delay before retry n is `base * factor**(n-1)`, capped, then spread by +-jitter."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if not (self.base >= 0 and math.isfinite(self.base)):
            raise ValueError(f"backoff base must be a finite number >= 0, got {self.base}")
        if not (self.factor >= 1 and math.isfinite(self.factor)):
            raise ValueError(f"backoff factor must be a finite number >= 1, got {self.factor}")
        if not (self.base <= self.cap <= MAX_DELAY_SECONDS):
            raise ValueError(f"backoff cap must be >= base and at most 10 years, got {self.cap}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter must be between 0 and 1, got {self.jitter}")


DEFAULT_POLICY = BackoffPolicy()


def delay(attempt: int, policy: BackoffPolicy = DEFAULT_POLICY, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based) before the next one."""
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    # Compare exponents instead of computing factor**n, which overflows for large attempts;
    # an int compares with a float exactly, however large it is.
    exponent = attempt - 1
    if policy.base == 0:
        raw = 0.0
    elif policy.factor == 1 or exponent < math.log(policy.cap / policy.base) / math.log(policy.factor):
        raw = policy.base * policy.factor**exponent
    else:
        raw = policy.cap
    if policy.jitter:
        spread = (rng or random).uniform(-policy.jitter, policy.jitter)
        raw *= 1 + spread
    return float(min(raw, policy.cap))
