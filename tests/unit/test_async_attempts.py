"""How an async handler's attempt ends around its timeout, on asyncio's loop and on uvloop
(the worker's `--loop auto`), and when it is given up, where no database is involved."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import pytest

from jobtui.core.registry import Handler, Job
from jobtui.kernel.backoff import BackoffPolicy
from jobtui.kernel.domain import ClaimedJob
from jobtui.worker.executor import ASYNC, InFlight, run_handler
from jobtui.worker.outcome import Outcome

NOW = datetime.now(UTC)
TIMEOUT = 0.005


def loops() -> list[Any]:
    out: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return out
    return [*out, pytest.param(uvloop.new_event_loop, id="uvloop")]


def attempt(
    fn: Callable[[Job], Coroutine[Any, Any, None]],
    new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
) -> tuple[Outcome, str]:
    """One attempt of `fn` as the worker runs it, with a timeout of TIMEOUT seconds, on a
    loop of `new_loop`."""
    handler = Handler("t", fn, True, 3, TIMEOUT, BackoffPolicy())
    claimed = ClaimedJob(1, "t", None, 1, 3, 1, NOW, NOW, NOW)
    loop = new_loop()
    try:
        flight = InFlight(Job(claimed, "w", "jobtui"), claimed, time.monotonic(), None, executor=ASYNC)
        outcome, error, _ = loop.run_until_complete(run_handler(handler, flight, lambda h, j: 1.0))
    finally:
        loop.close()
    return outcome, error


@pytest.mark.parametrize("new_loop", loops())
def test_a_handler_past_its_timeout_times_out_every_time(new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    """The loop's timer decides, not a second reading of the clock: uvloop's timers fire on
    its cached millisecond time, which can be before the deadline by the clock."""

    async def slow(job: Job) -> None:
        await asyncio.sleep(1)  # the handler's work, longer than its timeout

    ends = [attempt(slow, new_loop) for _ in range(200)]
    wrong = [(o, e[:60]) for o, e in ends if o is not Outcome.TIMEOUT]
    assert not wrong, f"{len(wrong)} of 200 attempts past their timeout judged otherwise: {wrong[:3]}"
    assert all("ran over its timeout of 0.005s" in e for _, e in ends)


def test_a_handlers_own_timeout_error_is_its_failure_not_the_timeout() -> None:
    async def gives_up(job: Job) -> None:
        raise TimeoutError("the mail server did not answer")

    outcome, error = attempt(gives_up)
    assert outcome is Outcome.FAIL and "the mail server did not answer" in error, (outcome, error)


def test_a_given_up_attempt_stays_given_up_when_its_handler_swallows_the_cancel() -> None:
    """The worker cancels the job's task when it gives the attempt up (a lost lease, a
    shutdown) and hands the job back; a handler that catches that and returns must not have
    its return written as the job's outcome beside the release."""
    started = asyncio.Event()

    async def stubborn(job: Job) -> None:
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()  # the handler's work, until it is cancelled

    async def give_up() -> None:
        handler = Handler("t", stubborn, True, 3, None, BackoffPolicy())
        claimed = ClaimedJob(1, "t", None, 1, 3, 1, NOW, NOW, NOW)
        flight = InFlight(Job(claimed, "w", "jobtui"), claimed, time.monotonic(), None, executor=ASYNC)

        async def execute() -> None:  # the job's task, as the worker runs it
            await run_handler(handler, flight, lambda h, j: 1.0)

        task = flight.task = asyncio.ensure_future(execute())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert flight.handler_done

    asyncio.run(give_up())
