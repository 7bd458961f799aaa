"""A claim whose answer was lost (its connection broke during it: a failover, a restart) took
jobs the worker never saw. The worker gives them back, uncounted, before it claims again.
A claim whose answer came after the lease it granted could have run out hands its jobs back,
unstarted and uncounted."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from jobtui import Client, Job, Jobs, NewJob, Worker
from jobtui.core.claims import release_unanswered_call
from jobtui.core.queues import set_limit
from tests.waits import until

Conn = psycopg.Connection[tuple[object, ...]]


def test_jobs_of_a_lost_claim_go_back_to_ready_uncounted_and_no_others(dsn: str, conn: Conn) -> None:
    with Client(dsn) as queue:
        queue.enqueue_many([NewJob("mail.send", {"n": i}) for i in range(6)])
        held = queue.claim(["mail.send"], worker="w1", limit=2)  # the worker got these
        queue.claim(["mail.send"], worker="w1", limit=2)  # the answer of this one was lost
        others = queue.claim(["mail.send"], worker="w2", limit=2)  # another worker's
        released = queue.run(release_unanswered_call("w1", [j.id for j in held]))
    rows = {
        int(r[0]): (r[1], r[2], r[3])  # type: ignore[call-overload]
        for r in conn.execute("SELECT id, status, attempts, errors -> -1 ->> 'kind' FROM jobtui.job").fetchall()
    }
    assert len(released) == 2 and not released & {j.id for j in held + others}
    for job_id in released:
        assert rows[job_id] == ("ready", 0, "abandoned")
    for job in held + others:
        assert rows[job.id][:2] == ("running", 1)


async def test_a_claim_answered_after_its_lease_hands_its_jobs_back_unstarted(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    started: list[int] = []
    jobs = Jobs()

    @jobs.handler("limited.job")
    async def run(job: Job) -> None:
        started.append(job.attempt)

    with Client(dsn) as queue:
        set_limit(conn, "limited", 5, actor="test")
        job_id = queue.enqueue("limited.job", {}, queue="limited")
    lease = 2.0
    worker = Worker(jobs, dsn, queues={"limited": 1}, lease=lease, scheduler=False, retention=None, poll_interval=0.05)
    # The claim of a queue with a limit waits for the queue's lock: held here, the claim's
    # answer comes after the lease it grants could have run out.
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ('"jobtui".queue_limit.limited',))
        task = asyncio.create_task(worker.run())
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE '%jobtui: claim_take%'"
        )
        await until(lambda: conn.execute(waiting).fetchone() == (1,), 10, "the claim to wait for the lock")
        await asyncio.sleep(lease + 0.5)  # the claim waits past its lease
        holder.commit()
    try:
        await until(lambda: started, 10, "the job to run")
        await until(lambda: worker.counts["done"] == 1, 10, "its outcome written")
    finally:
        worker.stop()
        await task
    # Handed back unstarted and uncounted, then claimed again and run once.
    assert started == [1]
    assert worker.counts["abandoned"] == 1
    row = conn.execute("SELECT status, attempts, errors FROM jobtui.job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None and row[:2] == ("done", 1)
    entries: list[dict[str, str]] = row[2]  # type: ignore[assignment]
    (entry,) = entries
    assert entry["kind"] == "abandoned" and entry["error"].startswith("not started: the claim's answer came")
    assert "handed back to ready unstarted, not counted" in caplog.text
