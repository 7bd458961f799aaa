"""Waits with a time limit that never lose a cancellation.

On Python 3.11, `asyncio.wait_for` returns the awaited result when a cancellation arrives in
the same turn of the loop as that result: the task that was cancelled runs on, and a loop
that ends only by cancellation (a process's fleet row refreshing) never ends, so a process
told to stop waits forever for it. `asyncio.timeout` keeps the cancellation (as `wait_for`
does from 3.12); these wrap it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar, cast

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """`awaitable`'s result; TimeoutError after `timeout` seconds (None: no limit).

    A future answered in the turn its time ran out gives its answer (a forked process's pid,
    outcomes written): the task was only told to stop after the answer came.
    """
    try:
        async with asyncio.timeout(timeout):
            return await awaitable
    except TimeoutError:
        if isinstance(awaitable, asyncio.Future) and awaitable.done() and not awaitable.cancelled():
            return cast(T, awaitable.result())
        raise


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Until `event` is set or `timeout` seconds passed: whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
    return event.is_set()
