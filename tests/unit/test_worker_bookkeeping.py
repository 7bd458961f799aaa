"""The worker's bookkeeping of the jobs it holds, where no database is involved."""

from __future__ import annotations

from datetime import UTC, datetime

from jobtui.core.registry import Job, Jobs
from jobtui.kernel.domain import ClaimedJob
from jobtui.worker import InFlight, Worker

NOW = datetime.now(UTC)


def flight(job_id: int, token: int) -> InFlight:
    claimed = ClaimedJob(job_id, "t", None, token, 3, token, NOW, NOW, NOW)
    return InFlight(Job(claimed, "w", "jobtui"), claimed, 0.0, None)


def test_a_finished_attempt_leaves_the_next_claim_of_its_job_alone() -> None:
    # A job released with Retry() and no delay (or reaped) can be claimed again before the
    # writer reports its first outcome: the newer flight must keep its heartbeats.
    jobs = Jobs()

    @jobs.handler("t")
    async def t(job: Job) -> None:
        """Never runs here."""

    worker = Worker(jobs, "postgresql://unused", scheduler=False, retention=None)
    first, again = flight(7, 1), flight(7, 2)
    worker.in_flight[7] = again
    worker._finished(first)
    assert worker.in_flight == {7: again}
    worker._finished(again)
    assert worker.in_flight == {}
