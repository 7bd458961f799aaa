"""A job's work in the test apps: the time a handler takes, as a real one takes it, and the
lines it notes of its steps. That time is the point (a lease runs out meanwhile, a worker is
stopped mid-job, a timeout fires), so the clock is what these wait on, in this one place."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from jobtui.core.registry import Job

STEP = 0.02  # how often a long handler that checks `stop` looks up from its work


def note(job: Job, what: str, *fields: str) -> None:
    """Append `what job-id lease-token worker [fields] monotonic-time` to the file named by
    JOBTUI_TEST_EVENTS: the file, not the database, since the database may be away."""
    line = " ".join([what, str(job.id), str(job.lease_token), job.worker_id, *fields, f"{time.monotonic():.6f}"])
    # One write of a short line with O_APPEND: lines of several processes do not interleave.
    fd = os.open(os.environ["JOBTUI_TEST_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def work(seconds: float, stop: Callable[[], bool] | None = None) -> bool:
    """Work `seconds` in a handler's thread; with `stop` (a handler that checks `job.lost` or
    `job.cancelled` between steps), return True as soon as it says so."""
    deadline = time.monotonic() + seconds
    while True:
        if stop is not None and stop():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(left if stop is None else min(left, STEP))  # the job's work itself


async def awork(seconds: float) -> None:
    """Work `seconds` in the event loop; cancelling the handler's task stops it."""
    await asyncio.sleep(seconds)  # the job's work itself
