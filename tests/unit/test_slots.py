"""A worker's claim slots: room per pool, and which producer a job's end wakes."""

from __future__ import annotations

import asyncio

from jobtui.worker.slots import Slots


def test_a_handler_ending_wakes_its_own_pools_producer_only() -> None:
    async def body() -> None:
        slots = Slots({"emails": 2, "reports": 2})
        slots.busy["emails"] = slots.held["emails"] = 2
        assert slots.room("emails") == 0
        slots.handler_ended("emails")
        assert slots.room("emails") == 1
        assert slots.kicks["emails"].is_set() and not slots.kicks["reports"].is_set()

    asyncio.run(body())


def test_an_outcome_written_wakes_the_producer_only_when_writes_held_its_room() -> None:
    async def body() -> None:
        slots = Slots({None: 2})
        kick = slots.kicks[None]
        # Two handlers run and one outcome waits to be written: the handlers bound the room.
        slots.busy[None], slots.held[None] = 2, 3
        slots.outcome_settled(None)
        assert slots.room(None) == 0 and not kick.is_set()
        # Handlers done, four outcomes waiting to be written: the writes bound the room.
        slots.busy[None], slots.held[None] = 0, 4
        assert slots.room(None) == 0
        slots.outcome_settled(None)
        assert slots.room(None) == 1 and kick.is_set()
        kick.clear()
        # Three waiting, one handler running: room 1 either way; one more written makes 1.
        slots.busy[None], slots.held[None] = 1, 3
        slots.outcome_settled(None)
        assert slots.room(None) == 1 and not kick.is_set()

    asyncio.run(body())


def test_a_notification_wakes_every_producer_but_the_polled_builtin_slots() -> None:
    from jobtui import Jobs, Worker
    from jobtui.core.maintenance import BUILTIN_QUEUE

    async def body() -> None:
        # Every worker keeps a slot for jobtui's own jobs, a few a minute: it claims once a
        # poll, not once per enqueue's notification.
        worker = Worker(Jobs(), "postgresql://unused.invalid/x", concurrency=3)
        slots = worker.slots
        assert slots.sizes == {None: 3, BUILTIN_QUEUE: 1} and slots.polled == {BUILTIN_QUEUE}
        slots.notified()
        assert slots.kicks[None].is_set() and not slots.kicks[BUILTIN_QUEUE].is_set()
        slots.wake()  # a resume, a stop, a job that may be ready again: every producer
        assert slots.kicks[BUILTIN_QUEUE].is_set()

    asyncio.run(body())
