"""What `Client` and `AsyncClient` share (clients/base.py), and the one audited path of the
operator's actions (core/audit.operate), against a real database."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from jobtui import AsyncClient, Client, InvalidInput, JobStatus
from jobtui.core.actions import ids_target, requeue_call
from jobtui.core.audit import Audit, moved, operate

Conn = psycopg.Connection[Any]


def _failed(queue: Client, job_type: str = "t") -> int:
    job_id = queue.enqueue(job_type, max_attempts=1)
    [claimed] = queue.claim([job_type], worker="w1")
    queue.fail_permanently([claimed.lease], ["boom"])
    return job_id


def _audit_rows(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT actor, action, target, job_ids, rows FROM jobtui.audit ORDER BY id").fetchall()


async def test_both_clients_migrate_through_the_pooler_they_were_given(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A JOBTUI_POOLER the clients were told to ignore: a migration that read it would fail.
    monkeypatch.setenv("JOBTUI_POOLER", "no-such-pooler")
    with Client(dsn, pooler="none") as queue:
        assert queue.migrate() == []
        assert queue.check_schema() > 0
    async with AsyncClient(dsn, pooler="none") as aqueue:
        assert await aqueue.migrate() == []
        assert await aqueue.check_schema() > 0


async def test_both_clients_refuse_an_unknown_enqueue_option_and_write_nothing(dsn: str, conn: Conn) -> None:
    with Client(dsn) as queue, pytest.raises(TypeError, match="unexpected keyword argument 'delai'"):
        queue.enqueue("t", {}, delai=5)  # type: ignore[call-arg]
    async with AsyncClient(dsn) as aqueue:
        with pytest.raises(TypeError, match="unexpected keyword argument 'delai'"):
            await aqueue.enqueue("t", {}, delai=5)  # type: ignore[call-arg]
    assert conn.execute("SELECT count(*) FROM jobtui.job").fetchone() == (0,)


async def test_both_clients_filter_jobs_and_counts_alike(dsn: str) -> None:
    with Client(dsn) as queue:
        failed = _failed(queue)
        ready = queue.enqueue("t", queue="mail")
        async with AsyncClient(dsn) as aqueue:
            for status in ("failed", JobStatus.FAILED, ["dead", "failed"]):
                assert [j.id for j in queue.jobs(status=status)] == [failed]
                assert [j.id for j in await aqueue.jobs(status=status)] == [failed]
                assert queue.count(status=status) == await aqueue.count(status=status) == 1
            assert (
                [j.id for j in queue.jobs(queue="mail")] == [j.id for j in await aqueue.jobs(queue="mail")] == [ready]
            )
            with pytest.raises(InvalidInput, match="unknown status 'gone'"):
                queue.jobs(status="gone")
            with pytest.raises(InvalidInput, match="unknown status 'gone'"):
                await aqueue.count(status="gone")


def test_an_operation_whose_change_fails_leaves_neither_the_change_nor_its_audit_row(dsn: str, conn: Conn) -> None:
    with Client(dsn) as queue:
        failed = _failed(queue)

    def requeued_then_failed(c: Conn) -> list[int]:
        c.execute("SELECT 1")  # a statement of the change's own, before it fails
        ids = queue.run(requeue_call([failed], "alice"), conn=c)
        assert ids == [failed]
        raise RuntimeError("the change failed after its first statement")

    with psycopg.connect(dsn) as c, pytest.raises(RuntimeError):
        operate(c, requeued_then_failed, Audit("alice", "requeue", ids_target([failed])), moved)
    assert conn.execute("SELECT status FROM jobtui.job WHERE id = %s", [failed]).fetchone() == ("failed",)
    assert _audit_rows(conn) == []

    with psycopg.connect(dsn) as c:
        assert operate(c, requeue_call([failed], "alice"), Audit("alice", "requeue", ids_target([failed])), moved) == [
            failed
        ]
    assert conn.execute("SELECT status FROM jobtui.job WHERE id = %s", [failed]).fetchone() == ("ready",)
    assert _audit_rows(conn) == [("alice", "requeue", f"jobs {failed}", [failed], 1)]


def test_the_clients_operator_actions_write_their_audit_rows(dsn: str, conn: Conn) -> None:
    with Client(dsn) as queue:
        first, second = _failed(queue), _failed(queue, "u")
        assert queue.requeueable(job_type="t", actor="bob") == [first]
        assert queue.requeue_matching(job_type="t", actor="bob") == [first]
        fingerprint = conn.execute("SELECT error_fingerprint FROM jobtui.job WHERE id = %s", [second]).fetchone()
        assert fingerprint is not None
        assert queue.requeue_dead_group("failed", "u", fingerprint[0], actor="bob") == [second]
        assert queue.cancel([first], actor="bob") == [first]
        assert queue.kill_lease([second], actor="bob") == []  # ready, not running
    assert _audit_rows(conn) == [
        ("bob", "requeue-dry-run", "type=t error=*", [], 1),
        ("bob", "requeue", "type=t error=*", [first], 1),
        ("bob", "requeue", f"failed group type=u error={fingerprint[0]}", [second], 1),
        ("bob", "cancel", f"jobs {first}", [first], 1),
        ("bob", "kill-lease", f"jobs {second}", [], 0),
    ]
