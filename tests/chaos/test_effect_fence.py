"""Regression: `Job.once` records an effect only while the attempt still holds its lease.

Found by the chaos run (bench/chaos.py): a worker SIGSTOPped past its lease woke up and its
handler recorded the job's effect through `job.once` although the reaper had already taken
the job back (and another worker could have claimed it): `once` only checked the worker's own
`lost` flag, which no heartbeat had set yet. The effect still happened once, but done by an
attempt that no longer held the job. `once` now checks the lease in the database, in the
effect's own transaction, and raises LeaseLost.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from jobtui.core.claims import claim_call, complete_call, reap_call
from jobtui.core.jobs import enqueue, enqueue_call, record_effect_call
from jobtui.core.registry import Job, LeaseLost
from jobtui.kernel.db import run
from jobtui.kernel.domain import ClaimedJob, Lease

Conn = psycopg.Connection[Any]


def claim(conn: Conn, worker: str) -> Job:
    [claimed] = run(conn, claim_call(["fence"], worker=worker, limit=1, lease=30))
    return Job(claimed, worker, "jobtui")


def again(claimed: ClaimedJob, worker: str) -> Job:
    """Another handler's view of the same attempt, with no local knowledge of a lost lease."""
    return Job(claimed, worker, "jobtui")


def expire_and_reap(conn: Conn, job_id: int) -> None:
    """As if the worker stopped heartbeating: its lease passes and a reaper takes the job back."""
    conn.execute("UPDATE jobtui.job SET locked_until = now() - interval '1 second' WHERE id = %s", (job_id,))
    assert [r.job_id for r in run(conn, reap_call())] == [job_id]


def recorded(conn: Conn, key: str) -> list[tuple[str, int]]:
    rows = conn.execute("SELECT key, job_id FROM jobtui.effect WHERE key = %s", (key,))
    return [(str(r[0]), int(r[1])) for r in rows]


def effect(dsn: str, job: Job, key: str) -> bool:
    """`once` in a transaction of its own, as a handler calls it."""
    with psycopg.connect(dsn) as tx:
        return job.once(tx, key)


def test_a_zombie_cannot_record_an_effect_after_its_job_was_reaped_or_reclaimed(dsn: str, conn: Conn) -> None:
    job_id = enqueue(conn, enqueue_call("fence", {}))
    [first] = run(conn, claim_call(["fence"], worker="A", limit=1, lease=30))
    expire_and_reap(conn, job_id)

    # Reaped, not claimed again: the zombie does not know yet (no heartbeat told it).
    zombie = again(first, "A")
    assert not zombie.lost
    with pytest.raises(LeaseLost):
        effect(dsn, zombie, "k")
    assert zombie.lost and recorded(conn, "k") == []

    # Claimed again by B: the zombie's attempt is refused while B holds the job, B records
    # the effect, and the zombie is still refused after B finished the job.
    live = claim(conn, "B")
    with pytest.raises(LeaseLost):
        effect(dsn, again(first, "A"), "k")
    assert effect(dsn, live, "k") is True
    assert effect(dsn, live, "k") is False  # done already: the holder's usual answer
    assert run(conn, complete_call([Lease(job_id, live.lease_token)])) == {job_id}
    with pytest.raises(LeaseLost):
        effect(dsn, again(first, "A"), "k")
    assert recorded(conn, "k") == [("k", job_id)]


async def test_once_async_is_fenced_too(dsn: str, conn: Conn) -> None:
    job_id = enqueue(conn, enqueue_call("fence", {}))
    zombie = claim(conn, "A")
    expire_and_reap(conn, job_id)
    live = claim(conn, "B")
    async with await psycopg.AsyncConnection.connect(dsn) as tx:
        with pytest.raises(LeaseLost):
            await zombie.once_async(tx, "k-async")
    async with await psycopg.AsyncConnection.connect(dsn) as tx:
        assert await live.once_async(tx, "k-async") is True
    assert zombie.lost and not live.lost
    assert recorded(conn, "k-async") == [("k-async", job_id)]


def test_a_rolled_back_effect_is_not_recorded_and_the_holder_can_do_it_again(dsn: str, conn: Conn) -> None:
    enqueue(conn, enqueue_call("fence", {}))
    job = claim(conn, "A")
    with psycopg.connect(dsn) as tx:
        assert job.once(tx, "k-rb") is True
        tx.rollback()
    assert recorded(conn, "k-rb") == []
    assert effect(dsn, job, "k-rb") is True


def test_without_a_lease_token_the_record_is_not_fenced(conn: Conn) -> None:
    # record_effect_call outside a job (no token): recorded once, whatever the queue holds.
    assert run(conn, record_effect_call("k-free", None)) == (True, True)
    assert run(conn, record_effect_call("k-free", None)) == (True, False)
    # With a token that no job holds: not recorded.
    assert run(conn, record_effect_call("k-none", 12345, 1)) == (False, False)
    assert recorded(conn, "k-none") == []
