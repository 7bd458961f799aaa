"""The executor: runs one attempt's handler and says what became of it.

Async handlers run on the worker's loop. A sync handler runs in a thread of its own
(`thread`) or in a child process of the worker's pool (`process`, children.py), chosen by
the handler's `executor=` or the worker's --executor. A thread cannot be stopped, so its
attempt ends only when it returns, even past its timeout; a child process is stopped for
real. A timeout, a Retry, Permanent, or the handler's own database connection failing each
lead to their own outcome; any other exception, or a child that died, is a counted failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobtui.core.registry import Handler, Job
from jobtui.kernel.domain import ClaimedJob
from jobtui.worker.outcome import Outcome, fields, judged

if TYPE_CHECKING:
    from jobtui.worker.children import Child, ChildPool

log = logging.getLogger("jobtui.worker")

ASYNC, THREAD, PROCESS = "async", "thread", "process"
COMPLETED: tuple[Outcome, str, float] = (Outcome.COMPLETE, "", 0.0)
# A job whose handler process could not be started is released (uncounted, bounded like a
# Retry) and due again this much later.
NO_CHILD_DELAY = 1.0


@dataclass(slots=True)
class InFlight:
    """A job this worker is running, as the console shows it."""

    job: Job
    claimed: ClaimedJob
    started: float
    deadline: float | None
    # Until when (time.monotonic()) the lease surely holds: the moment its claim or its last
    # successful heartbeat was sent, plus the lease the database granted from its own now().
    lease_until: float = 0.0
    # The claim slots it takes (the queue its producer claims from; None: every queue).
    pool: str | None = None
    executor: str = THREAD  # ASYNC, THREAD or PROCESS
    task: asyncio.Task[None] | None = None
    # Set when the outcome is handed to the writer: from then on the row may leave
    # `running` at any moment, and the write itself tells whether the lease held.
    writing: bool = False
    # The handler stopped for real: the task ended, the thread returned, the child is gone
    # or back in the pool. A later claim of the same job waits for it (worker.py).
    handler_done: bool = False
    # Thread mode: why the attempt was given up while its thread runs on (the lease could
    # not be extended in time). The row stays running under this worker until it returns.
    given_up: str | None = None
    # The lease is surely lost (a heartbeat found it gone, an operator cancelled the job, or
    # it was claimed again): whatever the handler returns is dropped.
    gone: bool = False
    timed_out: bool = False  # thread mode: it ran over its timeout, and runs on
    stop_reason: str | None = None  # process mode: why its child is being stopped (children.STOP_REASONS)
    child: Child | None = None  # process mode: the child running it
    reported: bool = False  # a heartbeat wrote what runs it (job.runner)
    _ended: asyncio.Future[None] | None = None

    def handler_stopped(self) -> None:
        self.handler_done = True
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)

    async def wait_handler(self) -> None:
        """Until the handler stopped for real."""
        if self.handler_done:
            return
        if self._ended is None:
            self._ended = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._ended)

    def runner(self) -> dict[str, Any]:
        """What runs the job, for the console (the heartbeat writes it to job.runner)."""
        found: dict[str, Any] = {"token": self.claimed.lease_token, "executor": self.executor}
        child = self.child
        if child is not None and not child.gone.is_set():
            found["pid"] = child.pid
            rss = child.read_rss()
            if rss is not None:
                found["rss"] = rss
        return found


Backoff = Callable[[Handler, Job], float]


def settled(flight: InFlight, outcome: Outcome, error: str) -> tuple[Outcome, str] | None:
    """What to write for an attempt whose handler stopped, by what the worker knows of its
    row; None: nothing, its lease is surely lost. The write is fenced by the lease token all
    the same, so a row taken meanwhile by another worker is left alone.

    An attempt over its timeout is a counted failure. One whose handler may have cut its work
    short for a loss (it saw `job.lost`, or `once()` refused an effect) is released,
    uncounted: it never ends done. Otherwise the handler's own outcome stands, even in an
    attempt given up while its thread ran on: the thread returned having done its work.
    """
    if flight.gone:
        return None
    if outcome is Outcome.TIMEOUT or not flight.job.loss_seen:
        return outcome, error
    why = flight.given_up or "its lease was lost (an effect was refused)"
    return Outcome.ABANDONED, f"attempt given up: {why}"


async def run_handler(
    handler: Handler, flight: InFlight, backoff: Backoff, children: ChildPool | None = None
) -> tuple[Outcome, str, float]:
    """Run the handler of `flight`; return (outcome, error text or reason, delay).

    An async handler runs in the job's own task (one coroutine deep: this is once per job).
    With a timeout, under a deadline that says whether it fired: a TimeoutError is the
    timeout's only when it did (comparing clocks is not enough: uvloop's timers fire on its
    cached millisecond time, up to a millisecond early). When the attempt is given up (its
    lease lost, a shutdown) the task is cancelled; a handler that swallows that still ends
    the attempt as cancelled, so what it returned is not written beside the give-up's release.
    """
    if not handler.is_async:
        if flight.executor == PROCESS:
            assert children is not None
            return await _in_child(handler, flight, backoff, children)
        return await _in_thread(handler, flight, backoff)
    job = flight.job
    deadline = None if handler.timeout is None else asyncio.timeout(flight.started + handler.timeout - time.monotonic())
    try:
        if deadline is None:
            await handler.fn(job)
        else:
            async with deadline:
                await handler.fn(job)
        ended = COMPLETED
    except TimeoutError as exc:
        if deadline is not None and deadline.expired():
            ended = Outcome.TIMEOUT, _over(handler), backoff(handler, job)
        else:
            ended = _judged(exc, handler, job, backoff)  # the handler's own TimeoutError
    except Exception as exc:
        ended = _judged(exc, handler, job, backoff)
    finally:
        flight.handler_stopped()
    # The flight's task is the one running this (set once the task exists: none can cancel it
    # before, as during an eager start); asking the loop for it would cost four calls a job.
    if flight.task is not None and flight.task.cancelling():
        raise asyncio.CancelledError
    return ended


def _over(handler: Handler, stopped: str = "") -> str:
    return f"TimeoutError: handler ran over its timeout of {handler.timeout}s{stopped}"


def _judged(exc: BaseException, handler: Handler, job: Job, backoff: Backoff) -> tuple[Outcome, str, float]:
    outcome, error, delay = judged(exc)
    return outcome, error, backoff(handler, job) if delay is None else delay


async def _in_thread(handler: Handler, flight: InFlight, backoff: Backoff) -> tuple[Outcome, str, float]:
    """Run a sync handler in its thread, until it returns. Past its timeout it is told
    (`job.lost`, and `once()` refuses), and its attempt still ends only when it returns."""
    job = flight.job
    future = in_thread(handler.fn, job, flight.handler_stopped)
    if handler.timeout is not None:
        done, _ = await asyncio.wait((future,), timeout=max(0.0, flight.started + handler.timeout - time.monotonic()))
        if not done:
            flight.timed_out = True
            job.mark_lost()
            log.warning(
                "job %d (%s) attempt %d ran over its timeout of %gs; job.lost set for its sync handler, which "
                "runs on in its thread: the job stays running here until it returns",
                job.id,
                job.type,
                job.attempt,
                handler.timeout,
                extra=fields(job),
            )
    await asyncio.wait((future,))
    exc = future.exception()
    if flight.timed_out:
        return Outcome.TIMEOUT, _over(handler, "; it returned later"), backoff(handler, job)
    if exc is None:
        return Outcome.COMPLETE, "", 0.0
    return _judged(exc, handler, job, backoff)


async def _in_child(
    handler: Handler, flight: InFlight, backoff: Backoff, children: ChildPool
) -> tuple[Outcome, str, float]:
    """Run a sync handler in a child process; when it dies, the attempt fails saying how."""
    from jobtui.worker.children import ChildDied, ChildEndedItself, HandlerTimedOut, NoChild

    job = flight.job
    try:
        result = await children.run(flight, handler.timeout)
    except HandlerTimedOut:
        return Outcome.TIMEOUT, _over(handler, "; its process was stopped"), backoff(handler, job)
    except ChildEndedItself as exc:
        # Its lease was not extended in time (this worker froze): as for a lease given up,
        # the attempt is released uncounted, fenced by its token.
        job.mark_lost()
        return Outcome.ABANDONED, f"attempt given up: {exc}", 0.0
    except ChildDied as exc:
        return Outcome.FAIL, str(exc), backoff(handler, job)
    except NoChild as exc:
        log.error("job %d (%s): %s; released, not counted", job.id, job.type, exc, extra=fields(job))
        return Outcome.RETRY, f"NoChild: {exc}", NO_CHILD_DELAY
    finally:
        flight.handler_stopped()
    if result.loss_seen:
        job.loss_seen = True
    delay = backoff(handler, job) if result.delay is None else result.delay
    return Outcome(result.outcome), result.error, delay


def in_thread(fn: Callable[[Job], Any], job: Job, ended: Callable[[], None]) -> asyncio.Future[Any]:
    """Run a sync handler in a daemon thread of its own; the future settles when it returns,
    and `ended` is called then too.

    Not a pool: a thread still running at shutdown (Python cannot stop it) must not keep
    the process from exiting.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    # Retrieved here, so that a future nobody awaits any more (the worker stopped) logs nothing.
    future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def settle(result: Any, exc: BaseException | None) -> None:
        ended()
        if future.done():
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
