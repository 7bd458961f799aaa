"""Shutdown: the jobs in flight get the shutdown timeout to finish, then go back to ready
without counting the attempt."""

from __future__ import annotations

import asyncio
import logging

from .completer import OutcomeWriter
from .executor import InFlight
from .outcome import Outcome

log = logging.getLogger("jobtui.worker")


async def drain(in_flight: dict[int, InFlight], writer: OutcomeWriter, timeout: float) -> int:
    """Wait for the handlers in flight up to `timeout`, then release the rest; how many were
    released."""
    tasks = [f.task for f in in_flight.values() if f.task is not None and not f.task.done()]
    if tasks:
        log.info("waiting up to %.0fs for %d in-flight job(s)", timeout, len(tasks))
        await asyncio.wait(tasks, timeout=timeout)
    # Outcomes handed to the writer are written before it stops; the rest go back.
    left = [f for f in in_flight.values() if not f.writing]
    if not left:
        return 0
    for flight in left:
        flight.job.mark_lost()
        if flight.task is not None:
            flight.task.cancel()
    reason = "the worker stopped before the handler finished"
    releases = asyncio.gather(*(writer.write(Outcome.SHUTDOWN, f.claimed.lease, reason) for f in left))
    try:
        released = sum(await asyncio.wait_for(releases, timeout))
    except TimeoutError:
        log.error("could not release %d unfinished job(s): the database did not answer; their leases will expire",
                  len(left))  # fmt: skip
        return 0
    log.warning("released %d unfinished job(s) back to ready, attempts not counted", released)
    return released
