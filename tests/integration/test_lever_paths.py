"""The claim's two walks against real PostgreSQL: a claim that no pause, limit or rate can
hold back takes the plain walk, and one look at queue_control in the claim's own snapshot
switches to the levered walk as soon as a lever in its reach is set, from the next claim;
the claim statement of the release before claims beside it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui.clients.client import Client
from jobtui.core import queues
from jobtui.core.claims import claim_call
from jobtui.kernel.db import run
from jobtui.kernel.domain import NewJob
from tests.conftest import rows_read
from tests.integration.test_levers import count, enqueue, jobtui, sampled
from tests.waits import wait_until
from tests.workers import WorkerProcess

Conn = psycopg.Connection[Any]
Spawn = Callable[..., WorkerProcess]
RELEASES = Path(__file__).resolve().parents[1] / "releases"


def claim(conn: Conn, queue: str | None = None, limit: int = 10, types: tuple[str, ...] = ("a",)) -> list[int]:
    return [j.id for j in run(conn, claim_call(types, worker="w", limit=limit, queue=queue))]


def test_levers_out_of_the_claims_reach_cost_it_no_row(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        q.enqueue_many([NewJob("a", {}) for _ in range(2000)])
        elsewhere = q.enqueue("a", queue="elsewhere")
    conn.execute("VACUUM ANALYZE jobtui.job")
    queues.set_rate(conn, "queue", "elsewhere", 5.0, actor="olga")
    queues.set_limit(conn, "capped", 1, actor="olga")
    queues.pause(conn, "queue", "held", actor="olga")
    queues.set_rate(conn, "type", "other", 1.0, actor="olga")
    with conn.transaction():
        assert len(claim(conn, "default")) == 10
        # The walk's ten rows and the update's ten: the rated part's look ahead is not run.
        assert rows_read(conn) <= 20
    # A claim of every queue has the rated queue in reach, and still takes the others' jobs.
    with conn.transaction():
        taken = claim(conn, None, 10)
        assert len(taken) == 10 and elsewhere not in taken
        assert rows_read(conn) > 20


def test_a_limit_and_a_pause_set_between_two_plain_claims_hold_from_the_next(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        ids = [q.enqueue("a", queue="lim") for _ in range(6)]
    assert claim(conn, "lim", 1) == ids[:1]  # no lever: the plain walk
    queues.set_limit(conn, "lim", 2, actor="olga")
    assert claim(conn, "lim", 10) == ids[1:2]  # one runs already, the limit leaves room for one
    assert claim(conn, None, 10) == []
    queues.set_limit(conn, "lim", None, actor="olga")
    assert claim(conn, "lim", 1) == ids[2:3]  # the limit cleared: plain again
    queues.pause(conn, "type", "a", actor="olga")
    assert claim(conn, "lim", 10) == []
    queues.resume(conn, "type", "a", actor="olga")
    assert sorted(claim(conn, None, 10)) == ids[3:]


def test_a_rate_on_another_queue_leaves_unrated_claims_whole(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        rated = [q.enqueue("a", queue="elsewhere") for _ in range(3)]
        free = [q.enqueue("a") for _ in range(20)]
    queues.set_rate(conn, "queue", "elsewhere", 0.001, actor="olga")  # one token, then none for hours
    first = claim(conn, None, 10)
    assert len(first) == 10 and len(set(first) & set(rated)) == 1
    assert sorted(claim(conn, "default", 10)) == free[len(first) - 1 : len(first) + 9]
    rest = claim(conn, None, 10)
    assert set(rest) == set(free) - set(first) - set(free[len(first) - 1 : len(first) + 9])
    assert claim(conn, None, 10) == []  # the rated queue's bucket is spent


def test_a_limit_set_while_a_worker_runs_holds_within_one_claim_cycle(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    worker = spawn("A", "--no-scheduler", "--concurrency", "6", "--verbose")
    ids = enqueue(app_dsn, "lim", 100, sleep=0.3)
    wait_until(lambda: count(db, "queue = 'lim' AND status = 'running'") >= 4, 15, "the worker ran the queue at 6")
    assert "2 running at once" in jobtui(app_dsn, "queue", "limit", "lim", "2").stdout
    # The limit holds from the worker's next claim on (see WorkerProcess.claims); the jobs
    # claimed before it finish.
    worker.wait_claims(worker.claims() + 2, 10)
    wait_until(lambda: count(db, "queue = 'lim' AND status = 'running'") <= 2, 10, "the jobs claimed before the limit")
    with sampled(app_dsn, "queue = 'lim' AND status = 'running'") as samples:
        done = count(db, "queue = 'lim' AND status = 'done'")
        # Sampled over the next ten claims, each with room for more than the limit.
        worker.wait_claims(worker.claims() + 10, 20)
    assert max(samples) <= 2, f"running jobs of the limited queue, sampled: max {max(samples)}"
    assert count(db, "queue = 'lim' AND status = 'done'") > done, "the limited queue stalled"
    assert jobtui(app_dsn, "queue", "limit", "lim", "none").returncode == 0
    wait_until(lambda: count(db, "id = ANY(%s) AND status = 'done'", ids) == len(ids), 60, "the queue drained")


def previous_claim(conn: Conn, queue: str | None, limit: int, types: tuple[str, ...] = ("a",)) -> list[int]:
    """A claim by the statement of release 0.3.0 (recorded in tests/releases), which reads the
    levers itself and knows no claim_levered."""
    text = (RELEASES / "v0.3.0" / "claim.sql").read_text().replace("{schema}", '"jobtui"')
    params = claim_call(types, worker="old", limit=limit, queue=queue).params
    with conn.cursor(binary=True) as cur:
        cur.execute(text.encode(), params)
        return [int(row[0]) for row in cur.fetchall()]


def test_a_claim_of_the_previous_release_claims_beside_this_one_under_the_same_levers(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        free = [q.enqueue("a") for _ in range(8)]
        limited = [q.enqueue("a", queue="lim") for _ in range(4)]
        held = [q.enqueue("a", queue="held") for _ in range(2)]
    queues.set_limit(conn, "lim", 2, actor="olga")
    queues.pause(conn, "queue", "held", actor="olga")
    taken = previous_claim(conn, None, 5) + claim(conn, None, 5) + previous_claim(conn, None, 5) + claim(conn, None, 5)
    assert len(taken) == len(set(taken)), "a job claimed twice"
    assert set(taken) == set(free) | set(limited[:2])  # the limit of 2 held across both, the pause too
    assert not set(taken) & set(held)
    queues.set_limit(conn, "lim", None, actor="olga")
    queues.resume(conn, "queue", "held", actor="olga")
    rest = previous_claim(conn, None, 1) + claim(conn, None, 10)
    assert sorted(rest) == sorted(limited[2:] + held)


def bucket_locked(dsn: str, kind: str, name: str) -> bool:
    """Whether another transaction holds the row of this bucket (asked from a connection of
    its own, which does not wait)."""
    with psycopg.connect(dsn, autocommit=True) as other:
        try:
            other.execute(
                "SELECT 1 FROM jobtui.rate_bucket WHERE kind = %s AND name = %s FOR UPDATE NOWAIT", (kind, name)
            )
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_a_claim_of_every_queue_locks_a_rated_bucket_only_when_it_meets_a_rated_job(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        free = [q.enqueue("a") for _ in range(12)]
        rated = q.enqueue("a", queue="elsewhere")
    queues.set_rate(conn, "queue", "elsewhere", 1000.0, actor="olga")
    with conn.transaction():
        assert claim(conn, None, 10) == free[:10]
        assert not bucket_locked(dsn, "queue", "elsewhere")  # no rated job among the ten
    with conn.transaction():
        assert sorted(claim(conn, None, 10)) == sorted([*free[10:], rated])
        assert bucket_locked(dsn, "queue", "elsewhere")
    assert not bucket_locked(dsn, "queue", "elsewhere")  # released at the claim's commit


def test_one_walk_takes_rated_and_unrated_jobs_in_claim_order_and_charges_the_bucket_once(conn: Conn, dsn: str) -> None:
    """Rated jobs ahead of unrated ones: the walk takes the bucket's two tokens' worth, passes
    over the rest of the rated queue and walks on for the unrated jobs behind, in one claim."""
    with Client(dsn) as q:
        rated = [q.enqueue("a", queue="slow") for _ in range(6)]
        free = [q.enqueue("a") for _ in range(6)]
    queues.set_rate(conn, "queue", "slow", 2.0, actor="olga")
    conn.execute("UPDATE jobtui.rate_bucket SET tokens = 2, refilled_at = now() + interval '1 hour'")
    updates = "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = 'jobtui.rate_bucket'::regclass"
    with conn.transaction():
        before = conn.execute(updates).fetchone()  # this backend's counts not yet sent
        taken = claim(conn, None, 6)
        after = conn.execute(updates).fetchone()
    assert before is not None and after is not None and after[0] - before[0] == 1
    assert sorted(taken) == sorted([*rated[:2], *free[:4]])
    assert conn.execute("SELECT tokens FROM jobtui.rate_bucket").fetchone() == (0.0,)
    # The passed-over rated jobs were locked by that claim only while it ran.
    assert sorted(claim(conn, "slow", 10)) == []  # no token
    assert sorted(claim(conn, None, 10)) == sorted(free[4:])


def test_a_rated_type_beside_a_spent_one_takes_its_own_tokens(conn: Conn, dsn: str) -> None:
    """A claim of types a and b, both rated, a's bucket spent: b's jobs come by b's tokens
    alone, not held to the spent bucket's."""
    with Client(dsn) as q:
        q.enqueue_many([NewJob("a", {}) for _ in range(5)])
        b = [q.enqueue("b") for _ in range(5)]
    queues.set_rate(conn, "type", "a", 0.001, actor="olga")
    queues.set_rate(conn, "type", "b", 1.0, actor="olga")
    conn.execute(  # no refill while the test runs
        "UPDATE jobtui.rate_bucket SET tokens = CASE name WHEN 'a' THEN 0 ELSE 2 END,"
        " refilled_at = now() + interval '1 hour'"
    )
    assert sorted(claim(conn, "default", 10, ("a", "b"))) == b[:2]


def claim_past_the_holder(conn: Conn, dsn: str, holder: Conn) -> tuple[list[int], int]:
    """A claim of every queue for 10 jobs on a connection of its own, which reads the bucket
    before `holder` commits its write and waits for that write at its charge; the jobs it
    took and its calls of claim_paced."""
    taken: list[int] = []
    paced: list[int] = []

    def claim_aside() -> None:
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("SET track_functions = 'pl'")
            with other.transaction():  # the function counts of this transaction
                taken.extend(claim(other, None, 10))
                row = other.execute(
                    "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE funcname = 'claim_paced'"
                ).fetchone()
            assert row is not None
            paced.append(int(row[0]))

    thread = threading.Thread(target=claim_aside)
    thread.start()
    try:
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND query LIKE '%claim_take%'"
                ).fetchone()
                == (1,)
            ),
            10,
            "the claim waiting on the bucket's row",
        )
    finally:
        holder.commit()
        thread.join(10)
    assert len(paced) == 1, "the claim did not finish"
    return taken, paced[0]


def test_a_single_bucket_spent_by_another_claim_since_the_read_gives_only_what_it_holds(
    conn: Conn, dsn: str, holder: Conn
) -> None:
    """The claim reads the bucket's tokens without a lock and walks that far; a claim that
    took tokens meanwhile leaves it fewer, and it takes only those."""
    with Client(dsn) as q:
        ids = [q.enqueue("a") for _ in range(8)]
    queues.set_rate(conn, "type", "a", 10.0, actor="olga")
    conn.execute("UPDATE jobtui.rate_bucket SET tokens = 5, refilled_at = now() + interval '1 hour'")  # no refill
    # The holder's transaction spends three tokens after this claim has read five.
    holder.execute("UPDATE jobtui.rate_bucket SET tokens = tokens - 3")
    taken, paced = claim_past_the_holder(conn, dsn, holder)
    assert (sorted(taken), paced) == (ids[:2], 1)
    assert conn.execute("SELECT tokens FROM jobtui.rate_bucket").fetchone() == (0.0,)


def test_a_claim_under_one_bucket_is_walked_and_charged_by_claim_pick_alone(conn: Conn, dsn: str) -> None:
    """Its queue rated, or its one type: claim_pick walks as far as the tokens and charges
    the bucket itself, without a call of claim_paced; a claim of two types, one rated, needs
    claim_paced's walk."""
    with Client(dsn) as q:
        q.enqueue_many([NewJob("a", {}, queue=queue) for queue in ("slow", "default") for _ in range(6)])
        q.enqueue_many([NewJob("b", {}) for _ in range(3)])
    queues.set_rate(conn, "queue", "slow", 2.0, actor="olga")
    queues.set_rate(conn, "type", "a", 1000.0, actor="olga")
    conn.execute("UPDATE jobtui.rate_bucket SET tokens = 4, refilled_at = now() + interval '1 hour'")  # no refill
    conn.execute("SET track_functions = 'pl'")
    calls = (
        "SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'claim_pick'), 0),"
        " coalesce(sum(calls) FILTER (WHERE funcname = 'claim_paced'), 0)"
        " FROM pg_stat_xact_user_functions WHERE schemaname = 'jobtui'"
    )

    def claimed_with_calls(queue: str | None, types: tuple[str, ...]) -> tuple[int, tuple[int, int]]:
        with conn.transaction():
            before = conn.execute(calls).fetchone()
            taken = claim(conn, queue, 10, types)
            after = conn.execute(calls).fetchone()
        assert before is not None and after is not None
        return len(taken), (after[0] - before[0], after[1] - before[1])

    # The type's bucket alone (the queue's bucket is not in the reach of a claim of "default").
    assert claimed_with_calls("default", ("a",)) == (4, (1, 0))
    queues.set_rate(conn, "type", "a", None, actor="olga")
    # The queue's bucket alone: its four tokens.
    assert claimed_with_calls("slow", ("a",)) == (4, (1, 0))
    conn.execute("UPDATE jobtui.rate_bucket SET tokens = 4")
    # A claim of two types in the rated queue: b's jobs are under the queue's bucket too, so
    # still one bucket; a claim of every queue meets unrated jobs as well: claim_paced.
    assert claimed_with_calls("slow", ("a", "b")) == (2, (1, 0))
    assert claimed_with_calls(None, ("a", "b"))[1] == (1, 1)


def test_claim_levered_takes_claim_picks_jobs_for_the_statement_that_walked_after_it(conn: Conn, dsn: str) -> None:
    """The claim statement before migration 0021 walked the ready index itself when
    claim_levered returned NULL (no lever); claim_levered now always returns the jobs, levers
    or none, held to the same levers as this code's claim."""
    with Client(dsn) as q:
        free = [q.enqueue("a") for _ in range(4)]
        held = q.enqueue("a", queue="held")
    with conn.transaction(force_rollback=True):
        row = conn.execute("SELECT jobtui.claim_levered(NULL, ARRAY['a'], 3)").fetchone()
        assert row is not None and row[0] == free[:3]
    queues.pause(conn, "queue", "held", actor="olga")
    with conn.transaction(force_rollback=True):
        row = conn.execute("SELECT jobtui.claim_levered(NULL, ARRAY['a'], 10)").fetchone()
        assert row is not None and sorted(row[0]) == free and held not in row[0]


def test_a_claim_of_every_queue_for_a_rated_type_leaves_paused_and_spent_queues_alone(conn: Conn, dsn: str) -> None:
    """Every job such a claim can take is under the type's bucket, so it walks as far as that
    bucket allows: still past the jobs of a paused queue and of a rated queue whose bucket is
    spent."""
    with Client(dsn) as q:
        q.enqueue("a", queue="held")
        q.enqueue("a", queue="slow")
        free = [q.enqueue("a") for _ in range(3)]
    queues.set_rate(conn, "type", "a", 10.0, actor="olga")
    queues.set_rate(conn, "queue", "slow", 0.001, actor="olga")
    queues.pause(conn, "queue", "held", actor="olga")
    conn.execute(  # the type's bucket holds 10, the queue's none; no refill while the test runs
        "UPDATE jobtui.rate_bucket SET tokens = CASE kind WHEN 'type' THEN 10 ELSE 0 END,"
        " refilled_at = now() + interval '1 hour'"
    )
    assert sorted(claim(conn, None, 10)) == free
    assert conn.execute("SELECT tokens FROM jobtui.rate_bucket WHERE kind = 'type'").fetchone() == (7.0,)


def test_a_rated_type_whose_bucket_row_is_gone_gets_one_and_its_tokens(conn: Conn, dsn: str) -> None:
    """A rate whose bucket has no row (set by a release that wrote none, or the row deleted)
    starts an empty bucket at the first claim, which then fills at the rate."""
    with Client(dsn) as q:
        ids = [q.enqueue("a") for _ in range(3)]
    queues.set_rate(conn, "type", "a", 1.0, actor="olga")
    conn.execute("DELETE FROM jobtui.rate_bucket")
    assert claim(conn, None, 10) == []  # the row is made, empty
    assert conn.execute("SELECT tokens FROM jobtui.rate_bucket").fetchone() == (0.0,)
    conn.execute("UPDATE jobtui.rate_bucket SET refilled_at = refilled_at - interval '2 seconds'")
    assert sorted(claim(conn, None, 10)) == ids[:2]  # two seconds at 1/s


@pytest.mark.parametrize(
    ("write", "left"),
    [
        # More tokens than were read (as an operator's resume or a new rate writes them).
        ("SET tokens = 7", lambda tokens: tokens == 2.0),
        # The same tokens, refilled from a second ago at 10/s: at least 15 now, 5 of them taken.
        ("SET refilled_at = now() - interval '1 second'", lambda tokens: 10.0 <= tokens <= 15.0),
    ],
    ids=["tokens", "refill-time"],
)
def test_a_bucket_written_since_the_read_is_charged_from_what_it_holds(
    conn: Conn, dsn: str, holder: Conn, write: str, left: Callable[[float], bool]
) -> None:
    """The charge of a claim under one bucket is fenced by the row as the claim read it, its
    tokens and its refill time: a write in between makes the charge start from the row as it
    is now, not from what was read; the claim keeps the jobs it walked, without claim_paced."""
    with Client(dsn) as q:
        ids = [q.enqueue("a") for _ in range(8)]
    queues.set_rate(conn, "type", "a", 10.0, actor="olga")
    conn.execute("UPDATE jobtui.rate_bucket SET tokens = 5, refilled_at = now() + interval '1 hour'")  # no refill
    holder.execute(f"UPDATE jobtui.rate_bucket {write}")  # committed after this claim read five
    taken, paced = claim_past_the_holder(conn, dsn, holder)
    assert (sorted(taken), paced) == (ids[:5], 0)  # five jobs, no call of claim_paced
    [tokens] = conn.execute("SELECT tokens FROM jobtui.rate_bucket").fetchone() or [None]
    assert left(tokens), tokens  # not 5 - 5, what the row as read would give
