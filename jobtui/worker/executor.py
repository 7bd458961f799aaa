"""The executor: runs one attempt's handler and says what became of it.

Async handlers run on the worker's loop; sync handlers run each in a daemon thread of its own
so they never block it. A timeout, a Retry, Permanent, or the handler's own database
connection failing each lead to their own outcome; any other exception is a counted failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..domain import ClaimedJob
from ..registry import Handler, Job, Permanent, Retry
from .outcome import Outcome, error_text, is_handler_connection_error


@dataclass
class InFlight:
    """A job this worker is running, as the console shows it."""

    job: Job
    claimed: ClaimedJob
    started: float
    deadline: float | None
    # Until when (time.monotonic()) the lease surely holds: the moment its claim or its last
    # successful heartbeat was sent, plus the lease the database granted from its own now().
    lease_until: float = 0.0
    task: asyncio.Task[None] | None = None
    # A sync handler's thread: set when it returned (it runs on after its task is cancelled).
    thread_ended: asyncio.Event | None = None
    # Set when the outcome is handed to the writer: from then on the row may leave
    # `running` at any moment, and the write itself tells whether the lease held.
    writing: bool = False
    # The claim slots it takes (the queue its producer claims from; None: every queue).
    pool: str | None = None


Backoff = Callable[[Handler, Job], float]


async def run_handler(handler: Handler, flight: InFlight, backoff: Backoff) -> tuple[Outcome, str, float]:
    """Run the handler of `flight`; return (outcome, error text or reason, delay)."""
    job = flight.job
    try:
        if handler.is_async:
            if handler.timeout is None:
                await handler.fn(job)
            else:
                await asyncio.wait_for(handler.fn(job), handler.timeout)
        else:
            flight.thread_ended = asyncio.Event()
            await asyncio.wait_for(in_thread(handler.fn, job, flight.thread_ended), handler.timeout)
        return Outcome.COMPLETE, "", 0.0
    except Permanent as exc:
        return Outcome.PERMANENT, error_text(exc), 0.0
    except Retry as exc:
        return Outcome.RETRY, str(exc), exc.delay
    except TimeoutError:
        return (
            Outcome.TIMEOUT,
            f"TimeoutError: handler ran over its timeout of {handler.timeout}s",
            backoff(handler, job),
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if is_handler_connection_error(exc):
            return Outcome.DB_ERROR, error_text(exc), backoff(handler, job)
        return Outcome.FAIL, error_text(exc), backoff(handler, job)


def in_thread(fn: Callable[[Job], Any], job: Job, ended: asyncio.Event) -> asyncio.Future[Any]:
    """Run a sync handler in a daemon thread of its own; the future settles when it returns,
    and `ended` is set then too, even after the future was cancelled.

    Not a pool: a thread abandoned at its timeout or at shutdown (Python cannot stop it)
    must neither hold up the jobs claimed after it nor keep the process from exiting; its
    job is marked lost, so `Job.once` refuses its late effects.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        ended.set()
        if future.done():  # cancelled: the handler ran over its timeout or was abandoned
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def target() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn(job)
        except BaseException as exc:  # handed to the loop, as a thread pool would
            error = exc
        # The loop is closed when the worker stopped before the handler returned.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=f"jobtui-handler-{job.id}", daemon=True).start()
    return future
