"""Typed payloads with pydantic: checked at enqueue in one line, decoded for the handler."""

from __future__ import annotations

import asyncio

import pydantic
import pytest

import jobtui
from jobtui import Client, InvalidInput, Job, Jobs, JobStatus, Worker
from tests.waits import until


class Welcome(pydantic.BaseModel):
    user_id: int
    name: str = "friend"


def _jobs(seen: list[object]) -> Jobs:
    jobs = Jobs()

    @jobs.handler("email.welcome", payload=Welcome)
    async def welcome(job: Job) -> None:
        seen.append(job.payload)

    @jobs.handler("untyped")
    def untyped(job: Job) -> None:
        seen.append(job.payload)

    return jobs


async def test_payloads_are_checked_at_enqueue_and_decoded_for_the_handler(dsn: str) -> None:
    seen: list[object] = []
    jobs = _jobs(seen)
    with Client(dsn, middleware=[jobtui.checked_payloads(jobs)]) as queue:
        with pytest.raises(InvalidInput) as bad:
            queue.enqueue("email.welcome", {"user_id": "not a number"})
        message = str(bad.value)
        assert message.startswith("payload for 'email.welcome' does not fit Welcome: user_id: ")
        assert "\n" not in message
        typed = queue.enqueue("email.welcome", Welcome(user_id=7))
        from_dict = queue.enqueue("email.welcome", {"user_id": "8"})  # coerced, as the model says
        other = queue.enqueue("untyped", {"anything": True})
        assert queue.count() == 3  # the bad one was not inserted
        row = queue.get(from_dict)
        assert row is not None and row.payload == {"user_id": 8, "name": "friend"}
        # A payload that skipped the check (enqueued from the shell) fails for good, at once.
        with Client(dsn) as unchecked:
            stray = unchecked.enqueue("email.welcome", {"user": 1}, max_attempts=5)
        worker = Worker(jobs, dsn, concurrency=2, scheduler=False, retention=None, poll_interval=0.05)
        task = asyncio.create_task(worker.run())
        await until(lambda: queue.count(status=["ready", "running"]) == 0, 30, "every job finished")
        worker.stop()
        await task
        failed = queue.get(stray)
    assert sorted(seen, key=str) == sorted([Welcome(user_id=7), Welcome(user_id=8), {"anything": True}], key=str)
    assert failed is not None and failed.status is JobStatus.FAILED and failed.attempts == 1
    assert (failed.last_error or "").startswith("Permanent: payload does not fit Welcome: user_id: Field required")
    assert typed != other
