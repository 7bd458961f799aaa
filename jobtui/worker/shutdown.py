"""Shutdown: the jobs in flight get the shutdown timeout to finish, then go back to ready
without counting the attempt: a handler process once it is gone (children.py stops it), a
thread that runs on due a little later, when the worker's process has surely exited."""

from __future__ import annotations

import asyncio
import logging

from jobtui.kernel.timeouts import within
from jobtui.worker.completer import OutcomeWriter
from jobtui.worker.events import Events
from jobtui.worker.executor import PROCESS, InFlight
from jobtui.worker.outcome import Outcome

log = logging.getLogger("jobtui.worker")

# A job released at shutdown while its handler's thread still runs is due this much later,
# when the worker's process (and so the thread) surely ended.
THREAD_RELEASE_DELAY = 5.0


async def drain(in_flight: dict[int, InFlight], writer: OutcomeWriter, timeout: float, events: Events) -> int:
    """Wait for the handlers in flight up to `timeout`, then release the rest; how many were
    released."""
    tasks = [f.task for f in in_flight.values() if f.task is not None and not f.task.done()]
    if tasks:
        log.info("waiting up to %.0fs for %d in-flight job(s)", timeout, len(tasks))
        await asyncio.wait(tasks, timeout=timeout)
    # Outcomes handed to the writer are written before it stops; the rest go back. A flight
    # `gone` was claimed again here: its newer attempt is the one released.
    left = [f for f in in_flight.values() if not f.writing and not f.gone]
    if not left:
        return 0
    for flight in left:
        flight.job.mark_lost()
        flight.stop_reason = "shutdown"
        if flight.task is not None:
            flight.task.cancel()
    stopping = [f.task for f in left if f.executor == PROCESS and f.task is not None]
    if stopping:
        await asyncio.wait(stopping)  # children.py kills what is still there after its grace
    reason = "the worker stopped before the handler finished"
    # A thread still running is released for later: by then the process has exited.
    delay = {id(f): 0.0 if f.handler_done else THREAD_RELEASE_DELAY for f in left}
    releases = asyncio.gather(*(writer.write(Outcome.SHUTDOWN, f.claimed.lease, reason, delay[id(f)]) for f in left))
    try:
        written = await within(releases, timeout)
    except TimeoutError:
        log.error("could not release %d unfinished job(s): the database did not answer; their leases will expire",
                  len(left))  # fmt: skip
        return 0
    released = sum(written)
    log.warning("released %d unfinished job(s) back to ready, attempts not counted", released)
    if events.watched:
        events.tell("released", [f.job.id for f, ok in zip(left, written, strict=True) if ok])
    return released
