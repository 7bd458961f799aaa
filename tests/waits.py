"""Waits on a state, not on the clock: a test polls what it waits for and fails, saying what
did not happen, when it does not happen in time. The timeouts are generous, since under a
loaded machine a state comes late but still comes; they bound only how long a broken test
hangs.

Where the clock itself is what a test waits on (an outage's length, the window a rate is
measured over, a span in which something must not happen), it calls `hold`, which names why:
these are the only fixed waits, and the polls below the only loops that sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

POLL = 0.02


class _Deadline:
    """When a wait gives up, and what it then says."""

    def __init__(self, timeout: float, what: str, logs: Callable[[], str] | None = None) -> None:
        self.at = time.monotonic() + timeout
        self.timeout = timeout
        self.what = what
        self.logs = logs

    def check(self) -> None:
        if time.monotonic() > self.at:
            extra = f"\n--- logs ---\n{self.logs()[-6000:]}" if self.logs else ""
            raise AssertionError(f"timed out after {self.timeout}s waiting for {self.what}{extra}")


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    logs: Callable[[], str] | None = None,
    every: float = POLL,
) -> Any:
    """Poll `predicate` (every `every` seconds) until it returns something truthy, and return
    that; fail after `timeout` seconds naming `what` did not happen (with the tail of `logs`
    when given)."""
    deadline = _Deadline(timeout, what, logs)
    while not (value := predicate()):
        deadline.check()
        time.sleep(every)  # the poll: what is waited on has no signal this side can block on
    return value


async def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """`wait_until` for a test that runs in the event loop: the loop goes on between polls."""
    deadline = _Deadline(timeout, what)
    while not (value := predicate()):
        deadline.check()
        await asyncio.sleep(POLL)  # the poll, yielding to the loop the test runs in
    return value


def hold(seconds: float, why: str) -> None:
    """Let `seconds` pass, for a wait the clock alone can tell: `why` says what it is (the
    length of an outage, a measuring window, a span in which something must not happen)."""
    if seconds > 0:
        time.sleep(seconds)  # time itself is what the caller waits on: see `why`
