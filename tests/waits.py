"""Waits on a state, not on the clock: a test polls what it waits for and fails, saying what
did not happen, when it does not happen in time. The timeouts are generous, since under a
loaded machine a state comes late but still comes; they bound only how long a broken test
hangs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

POLL = 0.02


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, logs: Callable[[], str] | None = None) -> Any:
    """Poll `predicate` until it returns something truthy, and return that; fail after
    `timeout` seconds naming `what` did not happen (with the tail of `logs` when given)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n--- logs ---\n{logs()[-6000:]}" if logs else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{extra}")
        time.sleep(POLL)


async def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """`wait_until` for a test that runs in the event loop: the loop goes on between polls."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(POLL)
