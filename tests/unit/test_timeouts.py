"""The waits with a time limit keep a cancellation that arrives in the same turn of the loop
as what they wait for (where Python 3.11's `asyncio.wait_for` returns the result instead and
the cancelled task runs on), and otherwise behave as a wait with a time limit does."""

from __future__ import annotations

import asyncio

import pytest

from jobtui.kernel.timeouts import wait_event, within


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5) is True
    assert await wait_event(event, None) is True


async def test_within_answers_or_raises_timeout_error() -> None:
    assert await within(asyncio.sleep(0, "answer"), 5) == "answer"
    with pytest.raises(TimeoutError):
        await within(asyncio.sleep(5), 0.01)
    future = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await within(future, 0.01)
    assert future.cancelled()  # what timed out is not left waiting


async def test_a_loop_cancelled_as_its_event_is_set_ends() -> None:
    """The shape of a process's fleet row: refresh on a hint or an interval, until cancelled."""
    hinted = asyncio.Event()
    turns = 0

    async def refresh_until_cancelled() -> None:
        nonlocal turns
        while True:
            await wait_event(hinted, 60)
            hinted.clear()
            turns += 1

    task = asyncio.create_task(refresh_until_cancelled())
    await asyncio.sleep(0.01)  # the task waits for the hint
    hinted.set()  # a stop hints the row ...
    task.cancel()  # ... and the process cancels the loop in the same turn
    done, _ = await asyncio.wait([task], timeout=2)
    assert task in done and task.cancelled(), f"the loop ran on after its cancellation ({turns} turns)"


async def test_a_result_that_comes_with_the_cancellation_does_not_swallow_it() -> None:
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    ran_on = False

    async def wait_then_go_on() -> None:
        nonlocal ran_on
        await within(asyncio.shield(future), 60)
        ran_on = True

    task = asyncio.create_task(wait_then_go_on())
    await asyncio.sleep(0.01)  # the task waits on the shielded future
    future.set_result("done")
    task.cancel()
    await asyncio.wait([task], timeout=2)
    assert task.cancelled() and not ran_on


async def test_a_future_answered_as_its_time_runs_out_gives_its_answer() -> None:
    """The answer and the deadline in one turn (answer first): the answer, not TimeoutError."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    loop.call_soon(future.set_result, 4242)  # before the deadline's own callback, in its turn
    assert await within(future, 0) == 4242
    unanswered: asyncio.Future[int] = loop.create_future()
    with pytest.raises(TimeoutError):
        await within(unanswered, 0)
