"""Every transition of the queue, against a real PostgreSQL: enqueue, claim, heartbeat,
complete, fail, release, reap, the operator's requeue, kill-lease and cancel, fencing of
lost leases, and the races that matter (idempotency keys, concurrent claimers)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobtui import AsyncClient, Client, Failure, InvalidInput, JobStatus, Lease, NewJob
from jobtui.core.claims import claim_call, complete_call, heartbeat_beat_call
from jobtui.core.jobs import COPY_THRESHOLD
from jobtui.kernel.db import run, statements
from jobtui.kernel.domain import DEFAULT_MAX_ATTEMPTS, Runner
from jobtui.reads.joblists import running_jobs
from tests.waits import wait_until

Conn = psycopg.Connection[Any]


@pytest.fixture
def q(dsn: str) -> Iterator[Client]:
    with Client(dsn) as queue:
        yield queue


def value(conn: Conn, query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def snapshot(conn: Conn, job_id: int) -> dict[str, Any]:
    """The whole row as JSON, to compare before and after a write that must not happen."""
    return dict(value(conn, "SELECT to_jsonb(j) FROM jobtui.job j WHERE id = %s", job_id))


def count(conn: Conn, where: str = "true") -> int:
    return int(value(conn, f"SELECT count(*) FROM jobtui.job WHERE {where}"))


def expire(conn: Conn, job_id: int) -> None:
    """Move a running job's lease into the past, as if its worker stopped heartbeating."""
    conn.execute("UPDATE jobtui.job SET locked_until = now() - interval '1 second' WHERE id = %s", (job_id,))


def make_dead(q: Client, job_type: str, error: str) -> int:
    job_id = q.enqueue(job_type, max_attempts=1)
    [job] = q.claim([job_type], worker="w1")
    assert job.id == job_id
    [outcome] = q.fail([Failure(job.lease, error, 0)])
    assert outcome.status == JobStatus.DEAD
    return job_id


def make_failed(q: Client, job_type: str, error: str) -> int:
    job_id = q.enqueue(job_type)
    [job] = q.claim([job_type], worker="w1")
    assert q.fail_permanently([job.lease], [error]) == {job_id}
    return job_id


# -- enqueue -------------------------------------------------------------------------------


def test_enqueue_stores_the_job(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("email.send", {"user_id": 42, "name": "Zoë", "tags": ["a", None, 1.5]})
    row = q.get(job_id)
    assert row is not None
    assert row.id == job_id
    assert row.type == "email.send"
    assert row.payload == {"user_id": 42, "name": "Zoë", "tags": ["a", None, 1.5]}
    assert row.status == JobStatus.READY
    assert (row.attempts, row.lease_token, row.lease_expirations) == (0, 0, 0)
    assert row.max_attempts is None  # left to the handler: filled in at the first claim
    assert row.idempotency_key is None
    assert row.locked_by is None and row.locked_until is None and row.finished_at is None
    assert row.errors == [] and row.last_error is None
    assert row.run_at == row.created_at  # no delay: runnable from the moment it was inserted
    assert row.db_now is not None and row.run_at <= row.db_now
    assert count(conn) == 1


def test_enqueue_without_payload_stores_an_empty_object(q: Client) -> None:
    row = q.get(q.enqueue("t"))
    assert row is not None and row.payload == {}


def test_enqueue_delay_puts_run_at_in_the_future_by_the_database_clock(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t", delay=90)
    assert value(conn, "SELECT run_at - created_at FROM jobtui.job WHERE id = %s", job_id) == timedelta(seconds=90)
    assert value(conn, "SELECT run_at > now() + interval '80 seconds' FROM jobtui.job WHERE id = %s", job_id)
    assert q.claim(["t"], worker="w1") == []


def test_enqueue_fractional_delay(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t", delay=1.25)
    assert value(conn, "SELECT run_at - created_at FROM jobtui.job WHERE id = %s", job_id) == timedelta(seconds=1.25)


def test_enqueue_at_a_given_time(q: Client) -> None:
    when = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    row = q.get(q.enqueue("t", run_at=when))
    assert row is not None and row.run_at == when
    row = q.get(q.enqueue("t", run_at=when, delay=60))
    assert row is not None and row.run_at == when + timedelta(seconds=60)


def test_enqueue_max_attempts(q: Client) -> None:
    row = q.get(q.enqueue("t", max_attempts=3))
    assert row is not None and row.max_attempts == 3


def test_duplicate_key_returns_the_existing_id_and_inserts_nothing(q: Client, conn: Conn) -> None:
    first = q.enqueue("email.send", {"n": 1}, key="welcome:42")
    other = q.enqueue("email.send", {"n": 3}, key="welcome:43")
    second = q.enqueue("email.send", {"n": 2}, key="welcome:42", delay=500, max_attempts=2)
    assert second == first != other
    assert count(conn) == 2
    row = q.get(first)
    assert row is not None
    assert row.payload == {"n": 1} and row.max_attempts is None and row.idempotency_key == "welcome:42"
    # The key keeps its job after the job finished.
    [job] = q.claim(["email.send"], worker="w1", limit=1)
    assert job.id == first
    q.complete([job.lease])
    assert q.enqueue("email.send", {"n": 4}, key="welcome:42") == first
    assert count(conn) == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"job_type": ""},
        {"job_type": "   "},
        {"job_type": "x" * 201},
        {"job_type": "a\x00b"},
        {"payload": {"x": float("nan")}},
        {"payload": {"x": object()}},
        {"payload": {"x": "a\x00b"}},
        {"payload": "x" * 1_000_001},
        {"key": ""},
        {"key": "k" * 1001},
        {"key": "a\x00"},
        {"delay": -1},
        {"delay": float("inf")},
        {"delay": 11 * 365 * 86400},
        {"max_attempts": 0},
        {"max_attempts": 1001},
        {"max_attempts": True},
        {"max_attempts": 2.5},
    ],
)
def test_enqueue_rejects_bad_input_and_writes_nothing(q: Client, conn: Conn, kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"job_type": "t", "payload": {}, **kwargs}
    job_type, payload = args.pop("job_type"), args.pop("payload")
    with pytest.raises(InvalidInput):
        q.enqueue(job_type, payload, **args)
    with pytest.raises(InvalidInput):
        q.enqueue_many([NewJob("t"), NewJob(job_type, payload, **args)])
    assert count(conn) == 0


def test_enqueue_commits_with_the_callers_transaction(q: Client, dsn: str, conn: Conn) -> None:
    with psycopg.connect(dsn) as own:
        own.execute("CREATE TABLE public.orders (id int)")
        own.execute("INSERT INTO public.orders VALUES (1)")
        job_id = q.enqueue("order.placed", {"order": 1}, key="order:1", conn=own)
        ids = q.enqueue_many([NewJob("order.mail"), NewJob("order.mail", key="mail:1")], conn=own)
        # Not visible outside the transaction yet, and not claimable.
        assert count(conn) == 0
        assert q.claim(["order.placed", "order.mail"], worker="w1", limit=10) == []
        own.commit()
    assert count(conn) == 3
    assert value(conn, "SELECT count(*) FROM public.orders") == 1
    assert q.get(job_id) is not None
    assert sorted(j.id for j in q.claim(["order.placed", "order.mail"], worker="w1", limit=10)) == sorted(
        [job_id, *ids]
    )


def test_enqueue_rolls_back_with_the_callers_transaction(q: Client, dsn: str, conn: Conn) -> None:
    with psycopg.connect(dsn) as own:
        rolled_back = q.enqueue("order.placed", {"order": 1}, key="order:1", conn=own)
        q.enqueue_many([NewJob("bulk", {"i": i}) for i in range(COPY_THRESHOLD)], conn=own)
        q.enqueue_many([NewJob("small", key="small:1")], conn=own)
        assert value(own, "SELECT count(*) FROM jobtui.job") == COPY_THRESHOLD + 2
        own.rollback()
    assert count(conn) == 0
    assert q.get(rolled_back) is None
    # The key is free again: a new enqueue inserts a new job.
    again = q.enqueue("order.placed", {"order": 1}, key="order:1")
    assert again != rolled_back and count(conn) == 1


def test_enqueue_notifies_listeners(q: Client, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(statements("jobtui").channel)))
        q.enqueue("t")
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in notes] == ["jobtui.job"]


# -- enqueue_many --------------------------------------------------------------------------


def test_enqueue_many_small_batch_keeps_input_order(q: Client, conn: Conn) -> None:
    jobs = [
        NewJob("a", {"i": 0}),
        NewJob("b", {"i": 1}, delay=30),
        NewJob("a", {"i": 2}, max_attempts=4),
        NewJob("c", None),
    ]
    ids = q.enqueue_many(jobs)
    assert len(ids) == 4 and len(set(ids)) == 4
    assert ids == sorted(ids)
    for job_id, job in zip(ids, jobs, strict=True):
        row = q.get(job_id)
        assert row is not None
        assert (row.type, row.payload, row.max_attempts) == (job.type, job.payload or {}, job.max_attempts)
        lag = value(conn, "SELECT run_at - created_at FROM jobtui.job WHERE id = %s", job_id)
        assert lag == timedelta(seconds=job.delay)
    assert count(conn) == 4
    assert q.enqueue_many([]) == []
    assert count(conn) == 4


def test_enqueue_many_with_keys_and_duplicates(q: Client, conn: Conn) -> None:
    existing = q.enqueue("t", {"old": True}, key="k1")
    jobs = [
        NewJob("t", {"i": 0}, key="k1"),  # exists already
        NewJob("t", {"i": 1}),
        NewJob("t", {"i": 2}, key="k2"),
        NewJob("t", {"i": 3}, key="k2"),  # duplicate inside the batch
        NewJob("t", {"i": 4}),
        NewJob("t", {"i": 5}, key="k1"),
        NewJob("t", {"i": 6}, key="k3"),
    ]
    ids = q.enqueue_many(jobs)
    assert ids[0] == ids[5] == existing
    assert ids[2] == ids[3]
    new = [ids[1], ids[2], ids[4], ids[6]]
    assert len(set(new)) == 4 and existing not in new
    assert new == sorted(new)  # inserted in input order
    assert count(conn) == 5
    payloads = {job_id: q.get(job_id).payload for job_id in set(ids)}  # type: ignore[union-attr]
    assert payloads == {existing: {"old": True}, ids[1]: {"i": 1}, ids[2]: {"i": 2}, ids[4]: {"i": 4}, ids[6]: {"i": 6}}
    # The same batch again inserts nothing and returns the same ids, except for the keyless jobs.
    again = q.enqueue_many(jobs)
    assert [again[i] for i in (0, 2, 3, 5, 6)] == [ids[i] for i in (0, 2, 3, 5, 6)]
    assert count(conn) == 7


def test_enqueue_many_only_existing_keys(q: Client, conn: Conn) -> None:
    a = q.enqueue("t", key="a")
    b = q.enqueue("t", key="b")
    assert q.enqueue_many([NewJob("t", key="b"), NewJob("t", key="a"), NewJob("t", key="b")]) == [b, a, b]
    assert count(conn) == 2


class RecordingCursor(psycopg.Cursor[Any]):
    """A cursor that records whether COPY was used, to see which path a batch takes."""

    copies: list[str]

    def copy(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        RecordingCursor.copies.append(str(statement))
        return super().copy(statement, *args, **kwargs)


def test_enqueue_many_large_batch_takes_the_copy_path(q: Client, dsn: str, conn: Conn) -> None:
    jobs = [NewJob(f"type{i % 3}", {"i": i, "s": "tab\there, new\nline, back\\slash"}, max_attempts=i % 7 + 1)
            for i in range(1500)]  # fmt: skip
    RecordingCursor.copies = []
    with psycopg.connect(dsn, cursor_factory=RecordingCursor) as own:
        ids = q.enqueue_many(jobs, conn=own)
    assert len(RecordingCursor.copies) == 1
    assert len(ids) == 1500 and len(set(ids)) == 1500 and ids == sorted(ids)
    rows = conn.execute(
        "SELECT id, type, payload, max_attempts, status, run_at = created_at FROM jobtui.job"
    ).fetchall()
    assert len(rows) == 1500
    by_id = {r[0]: r[1:] for r in rows}
    for job_id, job in zip(ids, jobs, strict=True):
        assert by_id[job_id] == (job.type, job.payload, job.max_attempts, "ready", True)
    # The identity sequence moved past the reserved ids: a later enqueue does not collide.
    assert q.enqueue("after") > max(ids)


def test_enqueue_many_large_batch_with_a_key_takes_the_unnest_path(q: Client, dsn: str, conn: Conn) -> None:
    existing = q.enqueue("t", key="dup")
    jobs = [NewJob("t", {"i": i}) for i in range(1200)] + [NewJob("t", key="dup"), NewJob("t", delay=5)]
    RecordingCursor.copies = []
    with psycopg.connect(dsn, cursor_factory=RecordingCursor) as own:
        ids = q.enqueue_many(jobs, conn=own)
    assert RecordingCursor.copies == []
    assert ids[1200] == existing
    assert len(set(ids)) == len(ids) == 1202
    fresh = ids[:1200] + ids[1201:]
    assert fresh == sorted(fresh)
    assert count(conn) == 1202
    assert value(conn, "SELECT payload FROM jobtui.job WHERE id = %s", ids[777]) == {"i": 777}


# -- AsyncClient ----------------------------------------------------------------------------


async def test_async_enqueue(dsn: str, conn: Conn) -> None:
    async with AsyncClient(dsn) as aq:
        first = await aq.enqueue("email.send", {"user_id": 1}, key="k", max_attempts=3)
        second = await aq.enqueue("email.send", {"user_id": 2}, key="k")
        delayed = await aq.enqueue("email.send", delay=60)
    assert first == second != delayed
    assert count(conn) == 2
    assert value(conn, "SELECT payload FROM jobtui.job WHERE id = %s", first) == {"user_id": 1}
    assert value(conn, "SELECT max_attempts FROM jobtui.job WHERE id = %s", first) == 3
    assert value(conn, "SELECT run_at - created_at FROM jobtui.job WHERE id = %s", delayed) == timedelta(seconds=60)


async def test_async_enqueue_many(dsn: str, conn: Conn) -> None:
    async with AsyncClient(dsn) as aq:
        existing = await aq.enqueue("t", key="x")
        small = await aq.enqueue_many([NewJob("t", {"i": 0}), NewJob("t", key="x"), NewJob("t", key="y"),
                                       NewJob("t", key="y"), NewJob("t", {"i": 4})])  # fmt: skip
        big = await aq.enqueue_many([NewJob("u", {"i": i}) for i in range(COPY_THRESHOLD)])
    assert small[1] == existing and small[2] == small[3]
    assert len({small[0], small[2], small[4], existing}) == 4
    assert len(big) == COPY_THRESHOLD and big == sorted(big) and len(set(big)) == COPY_THRESHOLD
    assert count(conn) == 4 + COPY_THRESHOLD
    assert value(conn, "SELECT payload FROM jobtui.job WHERE id = %s", big[123]) == {"i": 123}
    assert value(conn, "SELECT payload FROM jobtui.job WHERE id = %s", small[4]) == {"i": 4}


async def test_async_enqueue_in_the_callers_transaction(dsn: str, conn: Conn) -> None:
    async with AsyncClient(dsn) as aq:
        async with await psycopg.AsyncConnection.connect(dsn) as own:
            await aq.enqueue("t", conn=own)
            await aq.enqueue_many([NewJob("t"), NewJob("t", key="k")], conn=own)
            assert count(conn) == 0
            await own.rollback()
        assert count(conn) == 0
        async with await psycopg.AsyncConnection.connect(dsn) as own:
            kept = await aq.enqueue("t", key="k", conn=own)
            await own.commit()
        assert count(conn) == 1
        assert await aq.enqueue("t", key="k") == kept


async def test_async_enqueue_rejects_bad_input(dsn: str, conn: Conn) -> None:
    async with AsyncClient(dsn) as aq:
        with pytest.raises(InvalidInput):
            await aq.enqueue("t", {"x": float("nan")})
        with pytest.raises(InvalidInput):
            await aq.enqueue_many([NewJob("t", delay=-1)])
    assert count(conn) == 0


# -- claim ---------------------------------------------------------------------------------


def test_claim_respects_the_limit_oldest_first(q: Client, conn: Conn) -> None:
    ids = [q.enqueue("t", {"i": i}) for i in range(5)]
    # Make the last job the oldest: run_at order wins over id order.
    conn.execute("UPDATE jobtui.job SET run_at = run_at - interval '1 hour' WHERE id = %s", (ids[4],))
    first = q.claim(["t"], worker="w1", limit=3)
    assert [j.id for j in first] == [ids[4], ids[0], ids[1]]
    assert [j.payload for j in first] == [{"i": 4}, {"i": 0}, {"i": 1}]
    second = q.claim(["t"], worker="w2", limit=3)
    assert sorted(j.id for j in second) == [ids[2], ids[3]]
    assert q.claim(["t"], worker="w3", limit=3) == []
    assert count(conn, "status = 'running'") == 5


def test_claim_limit_must_be_positive(q: Client) -> None:
    with pytest.raises(InvalidInput):
        q.claim(["t"], worker="w1", limit=0)


def test_claim_filters_by_type(q: Client) -> None:
    a = q.enqueue("a")
    b = q.enqueue("b")
    q.enqueue("c")
    assert q.claim(["x", "y"], worker="w1", limit=10) == []
    assert [j.id for j in q.claim(["a"], worker="w1", limit=10)] == [a]
    assert q.claim(["a"], worker="w1", limit=10) == []
    assert [j.id for j in q.claim(["a", "b"], worker="w1", limit=10)] == [b]
    assert q.claim([], worker="w1", limit=10) == []


def test_claim_skips_jobs_not_yet_due(q: Client, conn: Conn) -> None:
    later = q.enqueue("t", delay=60)
    now = q.enqueue("t")
    assert [j.id for j in q.claim(["t"], worker="w1", limit=10)] == [now]
    assert q.claim(["t"], worker="w1", limit=10) == []
    conn.execute("UPDATE jobtui.job SET run_at = now() - interval '1 second' WHERE id = %s", (later,))
    assert [j.id for j in q.claim(["t"], worker="w1", limit=10)] == [later]


def test_claim_sets_the_lease_by_the_database_clock(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("mail", {"to": "a@b"}, max_attempts=7)
    [job] = q.claim(["mail"], worker="host:1", lease=120)
    assert (job.id, job.type, job.payload, job.attempt, job.max_attempts, job.lease_token) == (
        job_id, "mail", {"to": "a@b"}, 1, 7, 1,
    )  # fmt: skip
    assert job.lease == Lease(job_id, 1)
    row = q.get(job_id)
    assert row is not None
    assert row.status == JobStatus.RUNNING and row.locked_by == "host:1" and row.attempts == 1
    assert row.locked_until == job.locked_until
    assert row.created_at == job.created_at and row.run_at == job.run_at
    # The lease, the heartbeat and the start are all the claim's own now().
    assert row.heartbeat_at == row.started_at
    assert row.locked_until is not None and row.heartbeat_at is not None
    assert row.locked_until - row.heartbeat_at == timedelta(seconds=120)
    remaining = value(conn, "SELECT locked_until - now() FROM jobtui.job WHERE id = %s", job_id)
    assert timedelta(seconds=110) < remaining <= timedelta(seconds=120)


def test_the_first_claim_fills_in_the_handlers_limit(q: Client, conn: Conn) -> None:
    by_handler = q.enqueue("a")
    explicit = q.enqueue("a", max_attempts=2)
    by_default = q.enqueue("b")
    limits = {"a": 4, "c": 9}
    claimed = {j.id: j for j in q.run(claim_call(["a", "b"], worker="w1", limit=10, max_attempts=limits))}
    expected = {by_handler: 4, explicit: 2, by_default: DEFAULT_MAX_ATTEMPTS}
    assert {job_id: j.max_attempts for job_id, j in claimed.items()} == expected
    rows = dict(conn.execute("SELECT id, max_attempts FROM jobtui.job").fetchall())
    assert rows == expected
    # Once set, the limit stays: a later claim with other limits does not change it.
    assert q.release([claimed[by_handler].lease]) == {by_handler}
    [again] = q.run(claim_call(["a"], worker="w2", limit=1, max_attempts={"a": 7}))
    assert (again.id, again.max_attempts) == (by_handler, 4)


def test_each_claim_increments_attempts_and_the_lease_token(q: Client) -> None:
    job_id = q.enqueue("t", max_attempts=5)
    [c1] = q.claim(["t"], worker="w1")
    assert (c1.attempt, c1.lease_token) == (1, 1)
    assert q.release([c1.lease]) == {job_id}  # not counted
    [c2] = q.claim(["t"], worker="w2")
    assert (c2.attempt, c2.lease_token) == (1, 2)
    [outcome] = q.fail([Failure(c2.lease, "boom", 0)])  # counted
    assert outcome.status == JobStatus.READY
    [c3] = q.claim(["t"], worker="w3")
    assert (c3.attempt, c3.lease_token) == (2, 3)
    row = q.get(job_id)
    assert row is not None and row.locked_by == "w3"


# -- heartbeat -----------------------------------------------------------------------------


def test_heartbeat_extends_only_held_leases(q: Client, conn: Conn) -> None:
    held = q.enqueue("t")
    other = q.enqueue("t")
    done = q.enqueue("t")
    [h, o, d] = q.claim(["t"], worker="w1", limit=3, lease=1)
    assert (h.id, o.id, d.id) == (held, other, done)
    q.complete([d.lease])
    before = q.get(held)
    assert before is not None and before.locked_until is not None
    leases = [h.lease, Lease(o.id, o.lease_token + 1), d.lease, Lease(999_999, 1)]
    assert q.heartbeat(leases, lease=300) == {held}
    after = q.get(held)
    assert after is not None and after.locked_until is not None and after.heartbeat_at is not None
    assert after.locked_until > before.locked_until
    assert after.locked_until - after.heartbeat_at == timedelta(seconds=300)
    # The job with the wrong token kept its old lease.
    untouched = q.get(other)
    assert untouched is not None and untouched.locked_until == o.locked_until
    assert q.heartbeat([]) == set()


def test_an_expired_lease_is_kept_only_for_a_thread_that_runs_on(q: Client, conn: Conn) -> None:
    kept = q.enqueue("t")
    expired = q.enqueue("t")
    [k, e] = q.claim(["t"], worker="w1", limit=2, lease=60)
    conn.execute("UPDATE jobtui.job SET locked_until = now() - interval '1 second'")
    # Expired by the database's clock: lost, unless the worker asks to keep it (its thread runs
    # on, and the row still has its token, so no one else took the job).
    beat = q.run(heartbeat_beat_call([k.lease, e.lease], 30, keep=[kept]))
    assert beat.held == {kept}
    assert q.run(heartbeat_beat_call([Lease(expired, e.lease_token + 1)], 30, keep=[expired])).held == set()
    row = q.get(kept)
    assert row is not None and row.status is JobStatus.RUNNING and row.locked_until is not None


def test_the_heartbeat_says_what_runs_each_job_and_readers_see_only_the_current_attempts(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t")
    [c] = q.claim(["t"], worker="w1")
    runner = {"token": c.lease_token, "executor": "process", "pid": 4242, "rss": 90 << 20}
    assert q.run(heartbeat_beat_call([c.lease], 30, runners={job_id: runner})).held == {job_id}
    assert [j.runner for j in running_jobs(conn)] == [Runner("process", 4242, 90 << 20)]
    row = q.get(job_id)
    assert row is not None and row.runner == Runner("process", 4242, 90 << 20)
    # A heartbeat without a runner keeps the one written; a later attempt does not show it.
    assert q.run(heartbeat_beat_call([c.lease], 30)).held == {job_id}
    assert [j.runner for j in running_jobs(conn)] == [Runner("process", 4242, 90 << 20)]
    q.release([c.lease])
    [again] = q.claim(["t"], worker="w2")
    assert [j.runner for j in running_jobs(conn)] == [None]
    row = q.get(job_id)
    assert row is not None and row.runner is None
    # Anything a worker (or anyone) wrote there is data: a token that is no number fails nothing.
    conn.execute('UPDATE jobtui.job SET runner = \'{"token": "x", "executor": 7}\'')
    assert [j.runner for j in running_jobs(conn)] == [None]
    conn.execute("UPDATE jobtui.job SET runner = jsonb_build_object('token', %s::bigint, 'executor', 'bad')",
                 (again.lease_token,))  # fmt: skip
    assert [j.runner for j in running_jobs(conn)] == [None]


# -- complete ------------------------------------------------------------------------------


def test_complete(q: Client, conn: Conn) -> None:
    ids = [q.enqueue("t") for _ in range(3)]
    jobs = q.claim(["t"], worker="w1", limit=3)
    assert q.complete([j.lease for j in jobs[:2]]) == set(ids[:2])
    for job_id in ids[:2]:
        row = q.get(job_id)
        assert row is not None
        assert row.status == JobStatus.DONE and row.locked_until is None and row.locked_by == "w1"
        assert row.finished_at is not None and row.started_at is not None and row.finished_at >= row.started_at
    assert count(conn, "status = 'running'") == 1
    # Completing twice writes nothing the second time.
    before = snapshot(conn, ids[0])
    assert q.complete([jobs[0].lease]) == set()
    assert snapshot(conn, ids[0]) == before


def tally(conn: Conn) -> list[tuple[str, int, str, int]]:
    """done_tally as (type, attempts, worker, jobs), minute rows added up."""
    rows = conn.execute(
        "SELECT type, attempts, worker, sum(jobs)::int FROM jobtui.done_tally GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def test_complete_with_delete_removes_keyless_jobs_and_counts_them(q: Client, conn: Conn) -> None:
    keyless = [q.enqueue("t") for _ in range(3)]
    retried = q.enqueue("u", max_attempts=3)
    keyed = q.enqueue("t", key="order-42")
    [first] = q.claim(["u"], worker="w1")
    q.fail([Failure(first.lease, "boom", 0)])
    jobs = q.claim(["t", "u"], worker="w1", limit=10)
    assert {j.id for j in jobs} == {*keyless, retried, keyed}
    assert q.complete([j.lease for j in jobs], delete=True) == {*keyless, retried, keyed}
    # Keyless jobs are gone, counted by type and attempts in the finishing worker's row...
    assert count(conn, f"id IN ({','.join(map(str, [*keyless, retried]))})") == 0
    assert tally(conn) == [("t", 1, "w1", 3), ("u", 2, "w1", 1)]
    bounds = conn.execute(
        "SELECT bool_and(first_started_at <= last_finished_at AND minute <= last_finished_at"
        " AND last_finished_at < minute + interval '1 minute') FROM jobtui.done_tally"
    ).fetchone()
    assert bounds == (True,)
    # ...and the keyed job stays done, so its key still refuses a second enqueue.
    row = q.get(keyed)
    assert row is not None and row.status == JobStatus.DONE
    assert q.enqueue("t", key="order-42") == keyed
    assert count(conn) == 1


def test_complete_with_delete_is_fenced_by_the_lease(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t")
    [stale] = q.claim(["t"], worker="w1", lease=60)
    expire(conn, job_id)
    assert q.reap() and q.claim(["t"], worker="w2")
    before = snapshot(conn, job_id)
    # The first worker's lease was reaped and the job claimed again: nothing is deleted or counted.
    assert q.complete([stale.lease], delete=True) == set()
    assert snapshot(conn, job_id) == before and tally(conn) == []


def test_complete_with_delete_adds_to_the_minute_row_of_its_worker(q: Client, conn: Conn) -> None:
    ids = q.enqueue_many([NewJob("t") for _ in range(5)])
    for worker, limit in (("w1", 2), ("w2", 2), ("w1", 1)):
        jobs = q.claim(["t"], worker=worker, limit=limit)
        assert q.complete([j.lease for j in jobs], delete=True) == {j.id for j in jobs}
    minutes = value(conn, "SELECT count(DISTINCT minute) FROM jobtui.done_tally")
    assert tally(conn) == [("t", 1, "w1", 3), ("t", 1, "w2", 2)]
    assert value(conn, "SELECT count(*) FROM jobtui.done_tally") == 2 * minutes
    assert count(conn, f"id IN ({','.join(map(str, ids))})") == 0


# -- fail ----------------------------------------------------------------------------------


def test_fail_returns_the_job_to_ready_after_the_delay(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t", max_attempts=3)
    [job] = q.claim(["t"], worker="host:7")
    [outcome] = q.fail([Failure(job.lease, "ValueError: bad\nTraceback ...", 30)])
    assert (outcome.job_id, outcome.status, outcome.type, outcome.attempt, outcome.max_attempts, outcome.worker) == (
        job_id, JobStatus.READY, "t", 1, 3, "host:7",
    )  # fmt: skip
    row = q.get(job_id)
    assert row is not None
    assert row.status == JobStatus.READY and row.locked_until is None and row.finished_at is None
    assert row.attempts == 1 and row.last_error == "ValueError: bad\nTraceback ..."
    [entry] = row.errors
    assert (entry.attempt, entry.worker, entry.kind, entry.error) == (
        1,
        "host:7",
        "error",
        "ValueError: bad\nTraceback ...",
    )
    # run_at is the failure's now() plus the delay.
    lag = value(conn, "SELECT run_at - (errors -> 0 ->> 'at')::timestamptz FROM jobtui.job WHERE id = %s", job_id)
    assert lag == timedelta(seconds=30)
    assert q.claim(["t"], worker="w2") == []
    conn.execute("UPDATE jobtui.job SET run_at = now() WHERE id = %s", (job_id,))
    [again] = q.claim(["t"], worker="w2")
    assert again.attempt == 2


def test_fail_sends_the_job_dead_when_attempts_are_spent(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t", max_attempts=2)
    [first] = q.claim(["t"], worker="w1")
    [o1] = q.fail([Failure(first.lease, "e1", 0)])
    assert o1.status == JobStatus.READY
    [second] = q.claim(["t"], worker="w2")
    run_at_before = q.get(job_id).run_at  # type: ignore[union-attr]
    [o2] = q.fail([Failure(second.lease, "e2", 60)])
    assert (o2.status, o2.attempt, o2.max_attempts, o2.worker) == (JobStatus.DEAD, 2, 2, "w2")
    row = q.get(job_id)
    assert row is not None
    assert row.status == JobStatus.DEAD and row.finished_at is not None and row.locked_until is None
    assert row.run_at == run_at_before  # a dead job is not rescheduled
    assert row.last_error == "e2"
    assert [(e.attempt, e.worker, e.kind, e.error) for e in row.errors] == [
        (1, "w1", "error", "e1"),
        (2, "w2", "error", "e2"),
    ]
    assert q.claim(["t"], worker="w3") == []


def test_fail_many_at_once(q: Client) -> None:
    a = q.enqueue("t", max_attempts=1)
    b = q.enqueue("t", max_attempts=5)
    ja, jb = q.claim(["t"], worker="w1", limit=2)
    outcomes = q.fail([Failure(ja.lease, "ea", 0), Failure(jb.lease, "eb", 0)])
    assert {(o.job_id, o.status) for o in outcomes} == {(a, JobStatus.DEAD), (b, JobStatus.READY)}
    assert q.get(a).last_error == "ea" and q.get(b).last_error == "eb"  # type: ignore[union-attr]


def test_fail_clips_long_errors_and_removes_nul(q: Client) -> None:
    job_id = q.enqueue("t")
    [job] = q.claim(["t"], worker="w1")
    error = "HEAD" + "x" * 20_000 + "\x00" + "TAIL"
    q.fail([Failure(job.lease, error, 0)])
    row = q.get(job_id)
    assert row is not None and row.last_error is not None
    assert len(row.last_error) < 8100
    assert row.last_error.startswith("HEAD") and row.last_error.endswith("TAIL")
    assert "characters cut" in row.last_error and "\x00" not in row.last_error


def test_error_history_keeps_the_newest_fifty(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t", max_attempts=100)
    for n in range(1, 56):
        [job] = q.claim(["t"], worker="w1")
        assert job.attempt == n
        q.fail([Failure(job.lease, f"error {n}", 0)])
    row = q.get(job_id)
    assert row is not None
    assert len(row.errors) == 50
    assert [e.attempt for e in row.errors] == list(range(6, 56))
    assert row.errors[-1].error == "error 55"


def test_fail_permanently(q: Client) -> None:
    job_id = q.enqueue("t", max_attempts=10)
    [job] = q.claim(["t"], worker="w1")
    assert q.fail_permanently([job.lease], ["no such user"]) == {job_id}
    row = q.get(job_id)
    assert row is not None
    assert row.status == JobStatus.FAILED and row.finished_at is not None and row.locked_until is None
    assert row.attempts == 1 and row.last_error == "no such user"
    [entry] = row.errors
    assert (entry.attempt, entry.worker, entry.kind, entry.error) == (1, "w1", "permanent", "no such user")
    assert q.claim(["t"], worker="w2") == []


# -- release -------------------------------------------------------------------------------


def test_release_does_not_count_the_attempt(q: Client, conn: Conn) -> None:
    a = q.enqueue("t", max_attempts=1)
    b = q.enqueue("t", max_attempts=1)
    ja, jb = q.claim(["t"], worker="w1", limit=2)
    assert q.release([ja.lease, jb.lease], [0, 45]) == {a, b}
    for job_id in (a, b):
        row = q.get(job_id)
        assert row is not None
        assert row.status == JobStatus.READY and row.attempts == 0 and row.locked_until is None
        assert row.finished_at is None and row.last_error is None
        # The history says why, though nothing failed.
        [entry] = row.errors
        assert (entry.attempt, entry.worker, entry.kind, entry.error) == (1, "w1", "shutdown", "released")
    assert value(conn, "SELECT run_at - now() > interval '40 seconds' FROM jobtui.job WHERE id = %s", b)
    # With one attempt allowed, the released job can still run (and still be claimed once).
    [again] = q.claim(["t"], worker="w2", limit=2)
    assert (again.id, again.attempt, again.lease_token, again.uncounted) == (a, 1, 2, 0)


def test_releases_the_job_asked_for_are_counted_in_a_row_and_an_outage_is_not(q: Client) -> None:
    job_id = q.enqueue("t", max_attempts=3)
    seen = []
    for kind in ("retry", "db_error", "abandoned", "shutdown", "retry"):
        [job] = q.claim(["t"], worker="w1")
        seen.append(job.uncounted)
        assert q.release([job.lease], kinds=[kind], reasons=[f"because {kind}"]) == {job_id}
    [job] = q.claim(["t"], worker="w1")
    # Retry and the handler's database errors count in a row; the worker's own give-ups do not.
    assert [*seen, job.uncounted] == [0, 1, 2, 2, 2, 3]
    assert job.attempt == 1  # none of them was an attempt
    row = q.get(job_id)
    assert row is not None
    assert [(e.kind, e.error) for e in row.errors] == [
        (k, f"because {k}") for k in ("retry", "db_error", "abandoned", "shutdown", "retry")
    ]
    # A counted failure starts the count again.
    q.fail([Failure(job.lease, "boom", 0)])
    [job] = q.claim(["t"], worker="w1")
    assert (job.attempt, job.uncounted) == (2, 0)
    with pytest.raises(InvalidInput, match="unknown release kind"):
        q.release([job.lease], kinds=["nap"])


# -- reap ----------------------------------------------------------------------------------


def test_reap_returns_an_expired_lease_to_ready(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t", max_attempts=3)
    keep = q.enqueue("t")
    [job] = q.claim(["t"], worker="host:1", lease=0.05)
    [held] = q.claim(["t"], worker="host:2", lease=300)
    assert held.id == keep
    expired = "SELECT now() > locked_until FROM jobtui.job WHERE id = %s"
    wait_until(lambda: value(conn, expired, job_id), 30, "the lease's end on the database's clock")
    [reaped] = q.reap()
    assert (reaped.job_id, reaped.type, reaped.worker, reaped.attempt, reaped.status) == (
        job_id, "t", "host:1", 1, JobStatus.READY,
    )  # fmt: skip
    assert reaped.expired_at == job.locked_until
    row = q.get(job_id)
    assert row is not None
    assert row.status == JobStatus.READY and row.locked_until is None and row.lease_expirations == 1
    assert row.attempts == 1 and row.finished_at is None
    assert row.last_error is not None and "lease expired" in row.last_error and "host:1" in row.last_error
    assert "attempts exhausted" not in row.last_error
    assert [(e.kind, e.attempt, e.worker) for e in row.errors] == [("lease_expired", 1, "host:1")]
    log = conn.execute(
        "SELECT job_id, job_type, worker, attempt, expired_at, outcome FROM jobtui.lease_expiry"
    ).fetchall()
    assert log == [(job_id, "t", "host:1", 1, job.locked_until, "ready")]
    # The other lease is still held, and nothing is left to reap.
    assert q.get(keep).status == JobStatus.RUNNING  # type: ignore[union-attr]
    assert q.reap() == []
    [again] = q.claim(["t"], worker="host:3")
    assert (again.id, again.attempt, again.lease_token) == (job_id, 2, 2)


def test_reap_sends_the_last_attempt_dead(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("crashy", max_attempts=2)
    for n in (1, 2):
        [job] = q.claim(["crashy"], worker=f"w{n}")
        assert job.attempt == n
        expire(conn, job_id)
        [reaped] = q.reap()
        assert reaped.attempt == n
    assert reaped.status == JobStatus.DEAD
    row = q.get(job_id)
    assert row is not None
    assert row.status == JobStatus.DEAD and row.finished_at is not None and row.lease_expirations == 2
    assert row.last_error is not None and "attempts exhausted" in row.last_error and "w2" in row.last_error
    outcomes = conn.execute("SELECT worker, attempt, outcome FROM jobtui.lease_expiry ORDER BY id").fetchall()
    assert outcomes == [("w1", 1, "ready"), ("w2", 2, "dead")]
    assert q.claim(["crashy"], worker="w3") == []


def test_reap_limit(q: Client, conn: Conn) -> None:
    for _ in range(5):
        q.enqueue("t")
    q.claim(["t"], worker="w1", limit=5)
    conn.execute("UPDATE jobtui.job SET locked_until = now() - interval '1 second'")
    assert len(q.reap(limit=2)) == 2
    assert len(q.reap(limit=10)) == 3
    assert q.reap() == []
    assert count(conn, "status = 'ready' AND lease_expirations = 1") == 5


# -- operator: requeue, kill-lease, cancel --------------------------------------------------


def test_requeue_by_id(q: Client, dsn: str) -> None:
    dead = make_dead(q, "t", "boom")
    failed = make_failed(q, "t", "nope")
    ready = q.enqueue("t")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute('LISTEN "jobtui.job"')
        assert sorted(q.requeue([dead, failed, ready, 999_999], actor="alice@host")) == [dead, failed]
        assert len(list(listener.notifies(timeout=5, stop_after=1))) >= 1
    for job_id, was in ((dead, "dead"), (failed, "failed")):
        row = q.get(job_id)
        assert row is not None
        assert row.status == JobStatus.READY and row.attempts == 0 and row.finished_at is None
        entry = row.errors[-1]
        assert (entry.kind, entry.worker, entry.attempt) == ("requeued", "alice@host", 1)
        assert entry.error == f"requeued from {was} by alice@host"
    assert q.requeue([dead], actor="alice@host") == []  # already ready
    claimed = q.claim(["t"], worker="w1", limit=10)
    assert sorted(j.id for j in claimed) == sorted([dead, failed, ready])
    assert all(j.attempt == 1 for j in claimed)


def test_requeue_matching_and_its_dry_run_count(q: Client, conn: Conn) -> None:
    a_timeout = make_dead(q, "a", "TimeoutError: upstream")
    a_value = make_failed(q, "a", "ValueError: bad")
    b_timeout = make_dead(q, "b", "timeouterror again")
    q.enqueue("a")  # ready: never requeued
    assert q.count_requeueable() == 3
    assert q.count_requeueable(job_type="a") == 2
    assert q.count_requeueable(error="timeout") == 2  # case-insensitive regex
    assert q.count_requeueable(job_type="a", error="^Timeout") == 1
    assert q.count_requeueable(job_type="c") == 0
    assert q.count_requeueable(error="Value|upstream") == 2
    # Counting changes nothing.
    assert count(conn, "status IN ('dead', 'failed')") == 3
    assert q.requeue_matching(job_type="a", error="timeout", actor="bob") == [a_timeout]
    assert q.get(a_timeout).status == JobStatus.READY  # type: ignore[union-attr]
    assert q.count_requeueable(error="timeout") == 1
    assert sorted(q.requeue_matching(actor="bob")) == sorted([a_value, b_timeout])
    assert q.count_requeueable() == 0
    assert q.requeue_matching(actor="bob") == []
    assert count(conn, "status = 'ready'") == 4


def test_kill_lease(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t")
    other = q.enqueue("t")
    [job] = q.claim(["t"], worker="w1")
    assert q.kill_lease([job_id, other, 999_999], actor="bob") == [job_id]
    row = q.get(job_id)
    assert row is not None
    assert row.status == JobStatus.READY and row.locked_until is None and row.attempts == 1
    assert row.last_error == "lease killed by bob during attempt 1 of 25"
    entry = row.errors[-1]
    assert (entry.kind, entry.worker, entry.error) == ("lease_killed", "w1", "lease killed by bob")
    assert value(conn, "SELECT run_at <= now() FROM jobtui.job WHERE id = %s", job_id)
    assert q.kill_lease([job_id], actor="bob") == []
    reclaimed = q.claim(["t"], worker="w2", limit=2)
    assert sorted(j.id for j in reclaimed) == [job_id, other]
    assert next(j for j in reclaimed if j.id == job_id).lease_token == job.lease_token + 1


def test_a_killed_lease_counts_as_an_attempt_and_the_last_one_goes_dead(q: Client) -> None:
    job_id = q.enqueue("t", max_attempts=2)
    for attempt in (1, 2):
        [job] = q.claim(["t"], worker="w1")
        assert job.attempt == attempt
        assert q.kill_lease([job_id], actor="bob") == [job_id]
    row = q.get(job_id)
    assert row is not None
    # Never "attempt 3 of 2": the second kill was the last attempt.
    assert (row.status, row.attempts, row.max_attempts) == (JobStatus.DEAD, 2, 2)
    assert row.finished_at is not None
    assert row.last_error == "lease killed by bob during attempt 2 of 2 (its last attempt: dead)"
    assert q.claim(["t"], worker="w1") == []
    assert q.requeue([job_id], actor="bob") == [job_id]


def test_kill_lease_with_tokens_kills_only_the_attempts_named(q: Client) -> None:
    """A kill asked of one attempt (its lease token, as a list of running jobs showed it)
    leaves the job alone once that attempt has ended and another one runs."""
    job_id = q.enqueue("t")
    [first] = q.claim(["t"], worker="w1")
    assert q.kill_lease([job_id], actor="bob", tokens=[first.lease_token]) == [job_id]
    [second] = q.claim(["t"], worker="w2")
    assert q.kill_lease([job_id], actor="bob", tokens=[first.lease_token]) == []
    row = q.get(job_id)
    assert row is not None and (row.status, row.locked_by, row.attempts) == (JobStatus.RUNNING, "w2", 2)
    assert q.kill_lease([job_id], actor="bob", tokens=[second.lease_token]) == [job_id]
    with pytest.raises(InvalidInput, match="one lease token per id"):
        q.kill_lease([job_id], actor="bob", tokens=[])


def test_an_effects_transaction_bounds_the_servers_wait_on_a_silent_client(q: Client, dsn: str) -> None:
    """While `once()`'s row lock is held, the server's end of the handler's connection gives up
    within seconds of the client going silent (a network that drops packets would otherwise
    leave the job ready but skipped for hours); after the transaction, its own settings."""
    from jobtui.core.registry import Job

    job_id = q.enqueue("t")
    [claimed] = q.claim(["t"], worker="w1")
    settings = "SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_user_timeout')"
    with psycopg.connect(dsn) as tx:
        before = tx.execute(settings).fetchone()
        tx.commit()
        assert Job(claimed, "w1", "jobtui").once(tx, "k-bounded") is True
        if tx.info.host.startswith("/"):  # a Unix socket has no TCP settings: they read 0
            assert tx.execute(settings).fetchone() == ("0", "0")
        else:
            assert tx.execute(settings).fetchone() == ("2", "5000")
        tx.commit()
        assert tx.execute(settings).fetchone() == before
    # A handler's connection that turns keepalives off keeps the server's defaults.
    with psycopg.connect(dsn, keepalives=0) as tx:
        assert Job(claimed, "w1", "jobtui").once(tx, "k-unbounded") is True
        idle, user_timeout = tx.execute(settings).fetchone() or ("", "")
        assert idle != "2" and user_timeout == "0"  # 0: the system's (SHOW reads the socket's)
    assert q.kill_lease([job_id], actor="bob") == [job_id]


def test_kill_lease_waits_for_an_effect_being_committed(q: Client, dsn: str) -> None:
    """While a handler's `once()` transaction holds the job's row, the kill is refused: the
    effect commits under the lease it was checked against."""
    from jobtui.core.registry import Job

    job_id = q.enqueue("t")
    [claimed] = q.claim(["t"], worker="w1")
    with psycopg.connect(dsn) as tx:
        assert Job(claimed, "w1", "jobtui").once(tx, "k-kill-wait") is True
        assert q.kill_lease([job_id], actor="bob") == []
    # The effect's transaction committed: now the kill goes through.
    assert q.kill_lease([job_id], actor="bob") == [job_id]


def test_cancel(q: Client) -> None:
    ready = q.enqueue("t")
    running = q.enqueue("t", delay=0)
    done = q.enqueue("u")
    [r] = q.claim(["t"], worker="w1")
    assert r.id == ready
    [d] = q.claim(["u"], worker="w1")
    q.complete([d.lease])
    assert sorted(q.cancel([ready, running, done], actor="carol")) == [ready, running]
    for job_id, worker in ((ready, "w1"), (running, None)):
        row = q.get(job_id)
        assert row is not None
        assert row.status == JobStatus.FAILED and row.finished_at is not None and row.locked_until is None
        assert row.last_error == "cancelled by carol"
        entry = row.errors[-1]
        assert (entry.kind, entry.worker, entry.error) == ("cancelled", worker, "cancelled by carol")
    assert q.get(done).status == JobStatus.DONE  # type: ignore[union-attr]
    assert q.claim(["t"], worker="w2") == []
    assert q.cancel([ready], actor="carol") == []


# -- fencing -------------------------------------------------------------------------------


def _reaped(q: Client, conn: Conn, job_id: int) -> None:
    expire(conn, job_id)
    assert [r.job_id for r in q.reap()] == [job_id]


def _reaped_and_reclaimed(q: Client, conn: Conn, job_id: int) -> None:
    _reaped(q, conn, job_id)
    [b] = q.claim(["t"], worker="B")
    assert b.id == job_id


def _killed(q: Client, conn: Conn, job_id: int) -> None:
    assert q.kill_lease([job_id], actor="op") == [job_id]


def _killed_and_reclaimed(q: Client, conn: Conn, job_id: int) -> None:
    _killed(q, conn, job_id)
    [b] = q.claim(["t"], worker="B")
    assert b.id == job_id


def _cancelled(q: Client, conn: Conn, job_id: int) -> None:
    assert q.cancel([job_id], actor="op") == [job_id]


def _reclaimed_by_the_same_worker(q: Client, conn: Conn, job_id: int) -> None:
    _reaped(q, conn, job_id)
    [b] = q.claim(["t"], worker="A")
    assert b.id == job_id


@pytest.mark.parametrize(
    "lose",
    [_reaped, _reaped_and_reclaimed, _killed, _killed_and_reclaimed, _cancelled, _reclaimed_by_the_same_worker],
)
def test_a_lost_lease_cannot_write(q: Client, conn: Conn, lose: Callable[[Client, Conn, int], None]) -> None:
    job_id = q.enqueue("t", max_attempts=5)
    [a] = q.claim(["t"], worker="A", lease=300)
    lose(q, conn, job_id)
    before = snapshot(conn, job_id)
    late: dict[str, Callable[[], object]] = {
        "complete": lambda: q.complete([a.lease]),
        "fail": lambda: q.fail([Failure(a.lease, "late failure", 0)]),
        "fail_permanently": lambda: q.fail_permanently([a.lease], ["late"]),
        "release": lambda: q.release([a.lease]),
        "heartbeat": lambda: q.heartbeat([a.lease], lease=3000),
    }
    for name, write in late.items():
        result = write()
        assert not result, f"{name} with a lost lease wrote {result!r}"
        assert snapshot(conn, job_id) == before, f"{name} with a lost lease changed the row"
    # Whoever holds the lease now can still finish the job.
    if before["status"] == "running":
        token = before["lease_token"]
        assert token == a.lease_token + 1
        assert q.complete([Lease(job_id, token)]) == {job_id}


def test_a_live_lease_among_lost_ones(q: Client, conn: Conn) -> None:
    lost = q.enqueue("t")
    live = q.enqueue("t")
    a_lost, a_live = q.claim(["t"], worker="A", limit=2)
    assert (a_lost.id, a_live.id) == (lost, live)
    _reaped_and_reclaimed(q, conn, lost)
    assert q.heartbeat([a_lost.lease, a_live.lease]) == {live}
    assert q.complete([a_lost.lease, a_live.lease]) == {live}
    assert q.get(lost).status == JobStatus.RUNNING  # type: ignore[union-attr]
    assert q.get(live).status == JobStatus.DONE  # type: ignore[union-attr]


# -- races ---------------------------------------------------------------------------------


def test_concurrent_enqueue_of_the_same_key(dsn: str, conn: Conn) -> None:
    rounds = 20
    barrier = threading.Barrier(2, timeout=10)
    results: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def worker(slot: int) -> None:
        try:
            queue = Client(dsn)
            with psycopg.connect(dsn, autocommit=True) as own:
                for n in range(rounds):
                    barrier.wait()
                    results[slot].append(queue.enqueue("t", {"slot": slot}, key=f"race:{n}", conn=own))
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert results[0] == results[1]
    assert len(set(results[0])) == rounds
    assert count(conn) == rounds
    assert value(conn, "SELECT count(DISTINCT idempotency_key) FROM jobtui.job") == rounds


def _wait_until_blocked(conn: Conn, pid: int) -> None:
    """Wait until backend `pid` waits on a lock (the other transaction's key)."""
    waiting = "SELECT coalesce(wait_event_type, '') = 'Lock' FROM pg_stat_activity WHERE pid = %s"
    wait_until(lambda: value(conn, waiting, pid), 30, "the second enqueue waiting on the first transaction")


@pytest.mark.parametrize("first_commits", [True, False])
def test_enqueue_waits_for_an_open_transaction_holding_the_key(dsn: str, conn: Conn, first_commits: bool) -> None:
    queue = Client(dsn)
    results: list[int] = []
    errors: list[BaseException] = []
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, autocommit=True) as second:
        first_id = queue.enqueue("t", {"by": "first"}, key="shared", conn=first)

        def enqueue_second() -> None:
            try:
                results.append(queue.enqueue("t", {"by": "second"}, key="shared", conn=second))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=enqueue_second)
        thread.start()
        _wait_until_blocked(conn, second.info.backend_pid)
        assert thread.is_alive() and results == []
        if first_commits:
            first.commit()
        else:
            first.rollback()
        thread.join(10)
    assert not thread.is_alive() and not errors, errors
    assert count(conn) == 1
    [(only_id, by)] = conn.execute("SELECT id, payload ->> 'by' FROM jobtui.job").fetchall()
    assert results == [only_id]
    if first_commits:
        assert (only_id, by) == (first_id, "first")
    else:
        assert only_id != first_id and by == "second"


def test_four_concurrent_claimers_take_each_job_exactly_once(q: Client, dsn: str, conn: Conn) -> None:
    total = 10_000
    enqueued = q.enqueue_many([NewJob("t", {"i": i}) for i in range(total)])
    assert len(enqueued) == total
    claimed: list[list[int]] = [[] for _ in range(4)]
    lost: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4, timeout=10)

    def claimer(slot: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                start.wait()
                while True:
                    jobs = run(own, claim_call(["t"], worker=f"w{slot}", limit=50))
                    if not jobs:
                        if value(own, "SELECT count(*) FROM jobtui.job WHERE status = 'ready'") == 0:
                            return
                        continue
                    ids = [j.id for j in jobs]
                    claimed[slot].extend(ids)
                    written = run(own, complete_call([j.lease for j in jobs]))
                    lost.extend(set(ids) - written)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert lost == []
    every = [job_id for ids in claimed for job_id in ids]
    assert len(every) == total, "some job was claimed twice or not at all"
    assert len(set(every)) == total
    assert set(every) == set(enqueued)
    stats = conn.execute(
        "SELECT status, count(*), min(attempts), max(attempts), max(lease_token) FROM jobtui.job GROUP BY status"
    ).fetchall()
    assert stats == [("done", total, 1, 1, 1)]
    # Each claimer's own share matches what the rows say it ran.
    by_worker = dict(conn.execute("SELECT locked_by, count(*) FROM jobtui.job GROUP BY locked_by").fetchall())
    assert by_worker == {f"w{i}": len(claimed[i]) for i in range(4) if claimed[i]}


# -- the claim's plan ----------------------------------------------------------------------


def test_claim_uses_the_ready_index_on_a_large_table(dsn: str, conn: Conn) -> None:
    conn.execute(
        """
        INSERT INTO jobtui.job (type, payload, status, run_at, attempts, locked_by, finished_at)
        SELECT 'type' || (g % 5), jsonb_build_object('g', g),
               CASE WHEN g % 100 = 0 THEN 'ready' ELSE 'done' END,
               now() - make_interval(secs => g), 1, 'w', now()
        FROM generate_series(1, 120000) AS g
        """
    )
    conn.execute("ANALYZE jobtui.job")
    assert count(conn) == 120_000
    assert count(conn, "status = 'ready'") == 1200
    # The walk is claim_pick's (migration 0021), planned once in the function: what it reads
    # on this table says which way it went. A sequential scan reads 120,000 rows, the ready
    # index in order the 50 it takes (each fetched again by id for the update).
    call = claim_call(["type0", "type3"], worker="w1", limit=50, max_attempts={"type0": 3})
    reads = "SELECT seq_scan, idx_tup_fetch FROM pg_stat_xact_user_tables WHERE relid = 'jobtui.job'::regclass"
    with conn.transaction(force_rollback=True):
        before = conn.execute(reads).fetchone()
        assert len(run(conn, call)) == 50
        after = conn.execute(reads).fetchone()
    assert before is not None and after is not None
    assert after[0] == before[0], "a sequential scan of job"
    assert after[1] - before[1] <= 200, after[1] - before[1]
    # The claim itself still works on this table, oldest first.
    with Client(dsn) as queue:
        jobs = queue.claim(["type0", "type3"], worker="w1", limit=50)
    assert len(jobs) == 50
    assert [j.run_at for j in jobs] == sorted(j.run_at for j in jobs)
    assert {j.type for j in jobs} <= {"type0", "type3"}
    assert json.dumps(jobs[0].payload).startswith('{"g": ')


@pytest.mark.parametrize("stale_first", [True, False])
def test_a_batch_holding_a_stale_and_the_current_lease_of_one_job_writes_the_current(
    q: Client, conn: Conn, stale_first: bool
) -> None:
    """A worker can hold a job's old lease (reaped) and its new one at once: whichever comes
    first in the batch, the current lease completes the job and extends by heartbeat."""
    job_id = q.enqueue("t")
    [first] = q.claim(["t"], worker="w", lease=300)
    expire(conn, job_id)
    assert [r.job_id for r in q.reap()] == [job_id]
    [second] = q.claim(["t"], worker="w", lease=300)
    assert (first.lease_token, second.lease_token) == (1, 2)
    batch = [first.lease, second.lease] if stale_first else [second.lease, first.lease]
    assert q.heartbeat(batch) == {job_id}
    assert q.complete(batch) == {job_id}
    row = q.get(job_id)
    assert row is not None and row.status == JobStatus.DONE and row.lease_token == 2


def test_complete_and_heartbeat_match_each_job_to_its_own_token_past_32_bit_ids(q: Client, conn: Conn) -> None:
    """Each row's token is looked up by its id: ids past 2**31 and tokens that differ within
    one batch are matched job by job, and a wrong token fences only its own job."""
    conn.execute("SELECT setval(pg_get_serial_sequence('jobtui.job', 'id'), 3000000000)")
    a, b, c = q.enqueue_many([NewJob("t") for _ in range(3)])
    assert min(a, b, c) > 2**31
    q.claim(["t"], worker="w", limit=3, lease=300)
    expire(conn, b)
    assert [r.job_id for r in q.reap()] == [b]
    [again] = q.claim(["t"], worker="w", lease=300)
    assert (again.id, again.lease_token) == (b, 2)
    batch = [Lease(a, 1), Lease(b, 2), Lease(c, 2)]  # c's token is 1: this lease is not its
    assert q.heartbeat(batch) == {a, b}
    assert q.complete(batch) == {a, b}
    assert [q.get(i).status for i in (a, b, c)] == [JobStatus.DONE, JobStatus.DONE, JobStatus.RUNNING]  # type: ignore[union-attr]
    assert q.complete([Lease(c, 1)]) == {c}


def test_complete_and_heartbeat_of_large_batches_write_every_row(q: Client) -> None:
    ids = q.enqueue_many([NewJob("t") for _ in range(2500)])  # three chunks of leases
    claimed = q.claim(["t"], worker="w", limit=2500, lease=300)
    assert len(claimed) == 2500
    leases = [j.lease for j in claimed]
    assert q.heartbeat(leases) == set(ids)
    assert q.complete(leases) == set(ids)
    assert q.complete(leases) == set()  # fenced: done rows are not running


def test_a_reaper_reaps_only_while_in_touch_and_never_its_own_jobs(q: Client, conn: Conn) -> None:
    from jobtui.core.claims import reap_call, reap_round_call

    mine = q.enqueue("t")
    theirs = q.enqueue("t")
    q.claim(["t"], worker="w1", limit=2)
    conn.execute("UPDATE jobtui.job SET locked_until = now() - interval '1 second'")
    db_now = value(conn, "SELECT now()")
    # The previous round ran long ago (the reaper was cut off, or its statement waited out
    # a partition), or never: this round reaps nothing, and says when it ran.
    for previous in (db_now - timedelta(seconds=10), None):
        first = q.run(reap_round_call(previous, 1.0))
        assert (first.open, first.reaped) == (False, [])
    assert count(conn, "status = 'running'") == 2
    # In touch: it reaps, but not the jobs it runs itself.
    second = q.run(reap_round_call(first.at, 60.0, own=[mine]))
    assert second.open and second.at >= first.at
    assert [r.job_id for r in second.reaped] == [theirs]
    assert count(conn, "status = 'running'") == 1
    assert run(conn, reap_call(own=[mine])) == []
    assert [r.job_id for r in run(conn, reap_call())] == [mine]


def test_each_history_entry_says_when_its_attempt_started(dsn: str) -> None:
    with Client(dsn) as q:
        job_id = q.enqueue("history", {}, max_attempts=3)
        (first,) = q.claim(["history"], worker="w1")
        started_first = q.get(job_id).started_at  # type: ignore[union-attr]
        q.fail([Failure(first.lease, "ValueError: one", delay=0)])
        (second,) = q.claim(["history"], worker="w2")
        started_second = q.get(job_id).started_at  # type: ignore[union-attr]
        q.fail_permanently([second.lease], ["ValueError: two"])
        job = q.get(job_id)
    assert job is not None and started_first is not None and started_second is not None
    assert [(e.attempt, e.worker) for e in job.errors] == [(1, "w1"), (2, "w2")]
    assert [datetime.fromisoformat(e.started or "") for e in job.errors] == [started_first, started_second]
    assert all(datetime.fromisoformat(e.started or "") <= datetime.fromisoformat(e.at) for e in job.errors)
