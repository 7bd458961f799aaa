"""Retention: done jobs move to job_archive (or are deleted), old dead ones are deleted,
in bounded batches, so the queue table stays small under steady traffic."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from jobtui import Client, Failure, NewJob
from jobtui.core import maintenance
from jobtui.core.maintenance import ARCHIVE_TYPE, BATCH, Retention, Swept, sweep
from jobtui.core.registry import Job, Jobs
from jobtui.core.scheduler import run_now
from jobtui.worker import Worker
from tests.waits import until

Conn = psycopg.Connection[Any]


def job_columns(conn: Conn) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = 'jobtui' AND table_name = 'job' ORDER BY ordinal_position"
    ).fetchall()
    return [r[0] for r in rows]


def snapshot(conn: Conn, table: str, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Every job column of the rows `ids` of `table`, by id."""
    cols = job_columns(conn)
    cur = conn.execute(
        f"SELECT {', '.join(cols)} FROM jobtui.{table} WHERE id = ANY(%s)",
        (ids,),
    )
    return {row[0]: dict(zip(cols, row, strict=True)) for row in cur.fetchall()}


def ids_in(conn: Conn, table: str) -> set[int]:
    return {r[0] for r in conn.execute(f"SELECT id FROM jobtui.{table}").fetchall()}


def age(conn: Conn, ids: list[int], interval: str) -> None:
    """Pretend these jobs finished `interval` ago."""
    conn.execute(
        "UPDATE jobtui.job SET finished_at = now() - %s::interval WHERE id = ANY(%s)",
        (interval, ids),
    )


def make_done(q: Client, n: int, job_type: str = "t", *, fail_first: bool = False) -> list[int]:
    ids = [q.enqueue(job_type, {"n": i, "text": "é"}, key=f"{job_type}-{i}", max_attempts=5) for i in range(n)]
    claimed = q.claim([job_type], worker="w1", limit=n)
    assert len(claimed) == n
    if fail_first:
        q.fail([Failure(c.lease, "ValueError: boom 42", 0.0) for c in claimed])
        claimed = q.claim([job_type], worker="w2", limit=n)
        assert len(claimed) == n
    assert q.complete([c.lease for c in claimed]) == set(ids)
    return ids


@pytest.fixture
def queue(dsn: str) -> Any:
    with Client(dsn) as q:
        yield q


def test_sweep_archives_old_done_jobs_with_their_columns_and_leaves_the_rest(conn: Conn, queue: Client) -> None:
    old_done = make_done(queue, 3, "old") + make_done(queue, 2, "retried", fail_first=True)
    recent_done = make_done(queue, 2, "recent")
    ready = [queue.enqueue("waiting", {"i": i}) for i in range(2)]
    queue.enqueue("busy", {})
    running = [c.id for c in queue.claim(["busy"], worker="w3")]
    dead = [queue.enqueue("doomed", {"i": i}, max_attempts=1) for i in range(3)]
    queue.fail([Failure(c.lease, "RuntimeError: no", 0.0) for c in queue.claim(["doomed"], worker="w4", limit=3)])
    queue.enqueue("hopeless", {})
    [hopeless] = queue.claim(["hopeless"], worker="w5")
    assert queue.fail_permanently([hopeless.lease], ["bad input"]) == {hopeless.id}
    failed = [hopeless.id]

    age(conn, old_done, "2 days")
    age(conn, dead[:1], "2 days")  # dead, but within the dead retention
    age(conn, dead[1:] + failed, "31 days")
    # Also old in its own way, but not finished: must stay whatever its timestamps.
    conn.execute("UPDATE jobtui.job SET created_at = now() - interval '90 days' WHERE id = ANY(%s)", (ready + running,))
    before = snapshot(conn, "job", old_done)
    assert {row["status"] for row in before.values()} == {"done"}

    swept = sweep(conn, Retention())
    assert swept == Swept(archived=5, deleted_done=0, deleted_dead=3, deleted_archive=0)
    assert ids_in(conn, "job") == set(recent_done + ready + running + dead[:1])
    assert ids_in(conn, "job_archive") == set(old_done)
    after = snapshot(conn, "job_archive", old_done)
    assert after == before  # every column, the error history of the retried ones included
    assert all(after[i]["errors"] for i in old_done[3:])
    archived_at = conn.execute("SELECT bool_and(archived_at > now() - interval '1 minute') FROM jobtui.job_archive")
    assert archived_at.fetchone() == (True,)

    assert sweep(conn, Retention()) == Swept(0, 0, 0, 0)  # nothing left to do


def test_delete_done_mode_deletes_instead_of_archiving(conn: Conn, queue: Client) -> None:
    old = make_done(queue, 4, "old")
    recent = make_done(queue, 1, "recent")
    age(conn, old, "25 hours")
    swept = sweep(conn, Retention(delete_done=True))
    assert swept == Swept(archived=0, deleted_done=4, deleted_dead=0, deleted_archive=0)
    assert ids_in(conn, "job") == set(recent)
    assert ids_in(conn, "job_archive") == set()


def test_short_retentions_and_old_archive_rows(conn: Conn, queue: Client) -> None:
    done = make_done(queue, 3, "t")
    dead = [queue.enqueue("d", {}, max_attempts=1)]
    queue.fail([Failure(c.lease, "x", 0.0) for c in queue.claim(["d"], worker="w")])
    age(conn, done + dead, "0.3 seconds")
    swept = sweep(conn, Retention(done=0.1, dead=0.1, archive=None))
    assert swept == Swept(archived=3, deleted_done=0, deleted_dead=1, deleted_archive=0)
    assert ids_in(conn, "job") == set()

    conn.execute("UPDATE jobtui.job_archive SET archived_at = now() - interval '31 days' WHERE id = %s", (done[0],))
    assert sweep(conn, Retention(archive=None)).deleted_archive == 0  # None keeps archived rows forever
    assert sweep(conn, Retention()).deleted_archive == 1
    assert ids_in(conn, "job_archive") == set(done[1:])
    assert dead[0] not in ids_in(conn, "job_archive")


def test_batches_are_bounded_and_one_run_stops_at_its_limit(conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 2 * BATCH + 1
    conn.execute(
        "INSERT INTO jobtui.job (type, status, attempts, started_at, finished_at)"
        " SELECT 'bulk', 'done', 1, now() - interval '3 days', now() - interval '2 days' - g * interval '1 ms'"
        " FROM generate_series(1, %s) AS g",
        (n,),
    )
    monkeypatch.setattr(maintenance, "MAX_ROWS_PER_RUN", 2 * BATCH)
    assert sweep(conn, Retention()).archived == 2 * BATCH
    assert conn.execute("SELECT count(*) FROM jobtui.job").fetchone() == (1,)
    assert sweep(conn, Retention()).archived == 1

    # Rows archived in one transaction share its xmin: each batch was its own transaction.
    sizes = conn.execute(
        "SELECT count(*) FROM jobtui.job_archive GROUP BY xmin::text ORDER BY min(finished_at) DESC"
    ).fetchall()
    assert sorted(s[0] for s in sizes) == [1, BATCH, BATCH]
    # Oldest first: the single row left for the second run is the most recently finished.
    newest = conn.execute("SELECT max(finished_at) FROM jobtui.job_archive").fetchone()
    last = conn.execute("SELECT finished_at FROM jobtui.job_archive ORDER BY archived_at DESC, id LIMIT 1").fetchone()
    assert newest == last


def test_sweep_skips_locked_rows_instead_of_waiting(dsn: str, conn: Conn, queue: Client) -> None:
    ids = make_done(queue, 3, "t")
    age(conn, ids, "2 days")
    conn.execute("SET lock_timeout = '5s'")
    with psycopg.connect(dsn) as other:
        other.execute("SELECT id FROM jobtui.job WHERE id = %s FOR UPDATE", (ids[0],))
        assert sweep(conn, Retention()).archived == 2
        assert ids_in(conn, "job") == {ids[0]}
        other.rollback()
    assert sweep(conn, Retention()).archived == 1
    assert ids_in(conn, "job_archive") == set(ids)


def test_steady_enqueue_and_drain_keeps_the_job_table_bounded(conn: Conn, queue: Client) -> None:
    rounds, per_round = 15, 200
    retention = Retention(done=0.5)
    sizes, archived = [], []
    for r in range(rounds):
        ids = queue.enqueue_many([NewJob("steady", {"round": r, "i": i}) for i in range(per_round)])
        claimed = queue.claim(["steady"], worker="w", limit=per_round)
        assert len(claimed) == per_round
        assert queue.complete([c.lease for c in claimed]) == set(ids)
        age(conn, ids, "0.55 seconds")
        sweep(conn, retention)
        sizes.append(conn.execute("SELECT count(*) FROM jobtui.job").fetchone()[0])  # type: ignore[index]
        archived.append(conn.execute("SELECT count(*) FROM jobtui.job_archive").fetchone()[0])  # type: ignore[index]
    assert max(sizes) <= per_round, f"job table grew: {sizes}"
    assert sizes[-1] <= sizes[0] or sizes[-1] == 0
    assert archived == [per_round * (r + 1) for r in range(rounds)]


async def test_built_in_archive_job_runs_in_a_worker(dsn: str, conn: Conn) -> None:
    with Client(dsn) as q:
        ids = make_done(q, 5, "t")
    age(conn, ids, "10 seconds")
    jobs = Jobs()

    @jobs.handler("unused")
    def unused(job: Job) -> None:
        raise AssertionError("not enqueued")

    worker = Worker(jobs, dsn, concurrency=1, poll_interval=0.2, shutdown_timeout=5, retention=Retention(done=5))
    task = asyncio.create_task(worker.run())
    try:
        scheduled = "SELECT 1 FROM jobtui.schedule WHERE name = %s"
        await until(lambda: task.done() or conn.execute(scheduled, (ARCHIVE_TYPE,)).fetchone(), 30, "the schedule")
        job_id = run_now(conn, ARCHIVE_TYPE)

        def finished() -> bool:
            status = conn.execute("SELECT status FROM jobtui.job WHERE id = %s", (job_id,)).fetchone()
            return status is None or status[0] in ("done", "dead", "failed")

        await until(lambda: task.done() or finished(), 30, "the archive job finished")
    finally:
        worker.stop()
        await asyncio.wait_for(task, 20)
    assert set(ids) <= ids_in(conn, "job_archive")
    assert not set(ids) & ids_in(conn, "job")
    row = conn.execute("SELECT status, payload FROM jobtui.job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None and row[0] == "done", row
    assert row[1]["done"] == 5


def test_effects_are_pruned_once_no_retry_of_their_job_can_need_them(conn: Conn, queue: Client) -> None:
    from jobtui.core.registry import Job as HandlerJob

    done = queue.enqueue("t")
    dead = queue.enqueue("t", max_attempts=1)
    kept_running = queue.enqueue("t")
    claimed = {j.id: j for j in queue.claim(["t"], worker="w", limit=3)}
    for job_id, claim in claimed.items():
        with psycopg.connect(conn.info.dsn) as tx:
            assert HandlerJob(claim, "w", "jobtui").once(tx, f"effect:{job_id}")
    queue.complete([claimed[done].lease])
    queue.fail([Failure(claimed[dead].lease, "boom", 0)])
    conn.execute("INSERT INTO jobtui.effect (key, job_id) VALUES ('free', NULL), ('gone', 999999)")
    conn.execute("UPDATE jobtui.effect SET created_at = now() - interval '40 days'")
    conn.execute("INSERT INTO jobtui.effect (key, job_id) VALUES ('recent', NULL)")

    swept = sweep(conn, Retention(done=86400, dead=86400 * 60))
    keys = {r[0] for r in conn.execute("SELECT key FROM jobtui.effect")}
    # The dead job may be requeued and the running one may run again: their effects stay.
    assert keys == {f"effect:{dead}", f"effect:{kept_running}", "recent"}
    assert swept.deleted_effects == 3  # the done job's, one with no job, one whose job is gone
    # Within its retention nothing goes, whatever its job.
    conn.execute("UPDATE jobtui.effect SET created_at = now() - interval '1 day'")
    queue.requeue([dead], actor="t")
    assert sweep(conn, Retention()).deleted_effects == 0


def test_stats_show_the_effect_and_audit_tables(conn: Conn, queue: Client) -> None:
    import contextlib
    import io

    from jobtui.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--dsn", conn.info.dsn, "stats"]) == 0
    text = out.getvalue()
    assert "effect:" in text and "audit:" in text, text
