"""Bulk actions against real PostgreSQL: requeue, discard and cancel over a filter, in
batches of their own transactions; a dry run that counts; a run that is stopped, or killed
half-way in a real process, and resumed, changing every job once; one audit row per
invocation; busy jobs passed over and tried again; and the same through PgBouncer in
transaction mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from jobtui import Client, JobFilter, NewJob
from jobtui.core.bulk import Bulk
from jobtui.kernel.errors import InvalidInput
from tests.conftest import scalar
from tests.integration.test_levers import jobtui
from tests.topology import PgBouncer
from tests.waits import wait_until
from tests.workers import ROOT

Conn = psycopg.Connection[Any]


def dead_jobs(dsn: str, conn: Conn, n: int, job_type: str = "x", **payload: Any) -> list[int]:
    with Client(dsn) as q:
        ids = q.enqueue_many([NewJob(job_type, {**payload, "n": i}) for i in range(n)])
    conn.execute(
        "UPDATE jobtui.job SET status = 'dead', attempts = 3, finished_at = now() - interval '1 second',"
        " last_error = 'KeyError: user ' || id WHERE id = ANY(%s)",
        (ids,),
    )
    return ids


def count(conn: Conn, where: str, *params: Any) -> int:
    row = conn.execute(f"SELECT count(*) FROM jobtui.job WHERE {where}", params).fetchone()
    return int(row[0]) if row else 0


def requeued_times(conn: Conn, ids: list[int]) -> dict[int, int]:
    rows = conn.execute(
        "SELECT id, (SELECT count(*) FROM jsonb_array_elements(errors) e WHERE e ->> 'kind' = 'requeued')"
        " FROM jobtui.job WHERE id = ANY(%s)",
        (ids,),
    ).fetchall()
    return {int(r[0]): int(r[1]) for r in rows}


def test_a_bulk_requeue_moves_the_filters_jobs_in_batches(conn: Conn, dsn: str) -> None:
    acme = dead_jobs(dsn, conn, 230, account="acme")
    other = dead_jobs(dsn, conn, 40, account="other")
    done = dead_jobs(dsn, conn, 5, account="acme")
    conn.execute("UPDATE jobtui.job SET status = 'done' WHERE id = ANY(%s)", (done,))
    job = Bulk(conn, "requeue", JobFilter(payload={"account": "acme"}), actor="olga", batch=50, window=60)
    assert job.count() == 230
    steps: list[tuple[float, int]] = []
    outcome = job.run(job.start(), progress=lambda d, n: steps.append((d, n)))
    assert (outcome.changed, outcome.busy, outcome.stopped, outcome.resumed) == (230, [], False, False)
    assert count(conn, "id = ANY(%s) AND status = 'ready' AND attempts = 0", acme) == 230
    assert count(conn, "id = ANY(%s) AND status = 'dead'", other) == 40
    assert set(requeued_times(conn, acme).values()) == {1}
    assert len(steps) > 5 and steps[-1] == (1.0, 230)
    [(action, target, rows, detail)] = conn.execute("SELECT action, target, rows, detail FROM jobtui.audit").fetchall()
    assert (action, rows, detail["requeued"], detail["filter"]) == (
        "bulk-requeue",
        230,
        230,
        {"payload": {"account": "acme"}},
    )
    assert target.startswith("bulk run ") and "acme" in target
    # Done with: a second run finds nothing pending and nothing to move.
    again = Bulk(conn, "requeue", JobFilter(payload={"account": "acme"}), actor="olga")
    assert again.pending() is None and again.count() == 0


def test_a_stopped_run_is_resumed_and_changes_nothing_twice(conn: Conn, dsn: str) -> None:
    ids = dead_jobs(dsn, conn, 400)
    stop = threading.Event()
    job = Bulk(conn, "requeue", JobFilter(types=("x",)), actor="olga", batch=40, window=40)
    first = job.run(job.start(), progress=lambda d, n: stop.set() if n >= 120 else None, stop=stop)
    assert first.stopped and 120 <= first.changed < 400
    moved = [i for i, n in requeued_times(conn, ids).items() if n == 1]
    # Some requeued jobs fail again before the rest is done: they are newer than the run.
    again_dead = moved[:10]
    conn.execute("UPDATE jobtui.job SET status = 'dead', finished_at = now() WHERE id = ANY(%s)", (again_dead,))
    second = Bulk(conn, "requeue", JobFilter(types=("x",)), actor="olga", batch=40, window=40)
    pending = second.pending()
    assert pending is not None and pending.state == "stopped" and pending.changed == first.changed
    outcome = second.run(second.start())
    assert outcome.resumed and outcome.changed == 400 - first.changed and outcome.changed_in_all == 400
    assert set(requeued_times(conn, ids).values()) == {1}  # every job once
    assert count(conn, "id = ANY(%s) AND status = 'dead'", again_dead) == 10
    audit = conn.execute("SELECT rows, detail FROM jobtui.audit ORDER BY id").fetchall()
    assert [r for r, _ in audit] == [first.changed, 400 - first.changed]
    assert audit[0][1]["stopped"] and audit[1][1]["resumed"] and audit[1][1]["requeued_in_all"] == 400


def test_an_interruption_as_a_batch_commits_leaves_no_batch_out_of_the_audit_row(
    conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that lands once a batch committed and before the run counted it (psycopg
    finishes the COMMIT it waits for, then raises): the audit row takes the count from the
    run's row, which the batch's own transaction wrote. Interrupted in the end's audit, the
    row is written once, as stopped, and the run resumes."""
    dead_jobs(dsn, conn, 40)
    batch = Bulk._batch
    calls = 0

    def interrupted_after_the_second(self: Bulk, *args: Any) -> dict[str, Any]:
        nonlocal calls
        got = batch(self, *args)
        calls += 1
        if calls == 2:
            raise KeyboardInterrupt
        return got

    monkeypatch.setattr(Bulk, "_batch", interrupted_after_the_second)
    job = Bulk(conn, "requeue", JobFilter(types=("x",)), actor="olga", batch=5, window=5, rest=0)
    with pytest.raises(KeyboardInterrupt):
        job.run(job.start())
    assert count(conn, "status = 'ready'") == 10
    assert conn.execute("SELECT rows FROM jobtui.audit").fetchall() == [(10,)]
    monkeypatch.undo()

    audit = Bulk._audit

    def interrupted_at_the_end(self: Bulk, *args: Any, end: bool, **kw: Any) -> None:
        if end:
            raise KeyboardInterrupt  # before the end's transaction commits anything
        audit(self, *args, end=end, **kw)

    monkeypatch.setattr(Bulk, "_audit", interrupted_at_the_end)
    again = Bulk(conn, "requeue", JobFilter(types=("x",)), actor="olga", batch=5, window=5, rest=0)
    with pytest.raises(KeyboardInterrupt):
        again.run(again.start())
    assert count(conn, "status = 'ready'") == 40
    rows = conn.execute("SELECT rows, detail FROM jobtui.audit ORDER BY id").fetchall()
    assert [r for r, _ in rows] == [10, 30] and rows[1][1]["stopped"]
    pending = again.pending()
    assert pending is not None and pending.changed == 40  # resumable; nothing left to change


def test_a_run_begun_at_its_counts_mark_leaves_the_jobs_that_matched_after_the_count(conn: Conn, dsn: str) -> None:
    """Jobs that die while the operator reads the question (a new one, and one that was ready
    when counted) are not requeued, and the count after the run finds them; a run stopped
    half-way and resumed keeps the count's mark."""
    counted = dead_jobs(dsn, conn, 100)
    with Client(dsn) as q:
        [was_ready] = q.enqueue_many([NewJob("x", {"n": -1})])
    job = Bulk(conn, "requeue", JobFilter(types=("x",)), actor="olga", batch=20, window=30)
    tally = job.tally()
    assert (tally.jobs, tally.later, tally.mark.last_id) == (100, 0, was_ready)
    # Meanwhile: the ready job dies, and a new one dies.
    conn.execute("UPDATE jobtui.job SET status = 'dead', finished_at = now() WHERE id = %s", (was_ready,))
    late = dead_jobs(dsn, conn, 1)
    conn.execute("UPDATE jobtui.job SET finished_at = now() WHERE id = ANY(%s)", (late,))
    assert job.count() == 102  # a new count sees them
    stop = threading.Event()
    started = job.start(tally.mark)
    assert (started.cutoff, started.last_id) == (tally.mark.cutoff, tally.mark.last_id)
    first = job.run(started, progress=lambda d, n: stop.set() if n >= 40 else None, stop=stop)
    assert first.stopped and first.changed < 100
    again = Bulk(conn, "requeue", JobFilter(types=("x",)), actor="olga", batch=20, window=30)
    resumed = again.start()
    assert resumed.resumed and (resumed.cutoff, resumed.last_id) == (tally.mark.cutoff, tally.mark.last_id)
    outcome = again.run(resumed)
    assert outcome.changed_in_all == 100
    assert count(conn, "id = ANY(%s) AND status = 'ready'", counted) == 100
    assert count(conn, "id = ANY(%s) AND status = 'dead'", [was_ready, *late]) == 2
    assert again.tally(resumed.mark).later == 2
    [(rows,)] = conn.execute("SELECT sum(rows) FROM jobtui.audit WHERE action = 'bulk-requeue'").fetchall()
    assert rows == 100


def test_a_cancel_begun_at_its_counts_mark_leaves_the_jobs_enqueued_after_the_count(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        counted = q.enqueue_many([NewJob("y", {"n": i}) for i in range(5)])
        job = Bulk(conn, "cancel", JobFilter(types=("y",)), actor="olga")
        tally = job.tally()
        late = q.enqueue_many([NewJob("y", {"n": i}) for i in range(3)])
    outcome = job.run(job.start(tally.mark))
    assert (tally.jobs, outcome.changed) == (5, 5)
    assert count(conn, "id = ANY(%s) AND status = 'failed'", counted) == 5
    assert count(conn, "id = ANY(%s) AND status = 'ready'", late) == 3
    assert job.tally(tally.mark).later == 3


def test_discard_and_cancel_and_the_busy_jobs(conn: Conn, dsn: str) -> None:
    dead = dead_jobs(dsn, conn, 30, queue_name="q")
    with Client(dsn) as q:
        ready = q.enqueue_many([NewJob("y", {"n": i}) for i in range(20)])
    job = Bulk(conn, "discard", JobFilter(error="user <n>"), actor="olga", batch=7)
    assert job.run(job.start()).changed == 30 and count(conn, "id = ANY(%s)", dead) == 0
    # A job whose row another transaction holds (a handler inside job.once()) is passed over.
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM jobtui.job WHERE id = %s FOR KEY SHARE", (ready[3],))
        cancel = Bulk(conn, "cancel", JobFilter(types=("y",)), actor="olga", batch=5)
        outcome = cancel.run(cancel.start())
        assert outcome.changed == 19 and outcome.busy == [ready[3]]
    assert count(conn, "id = ANY(%s) AND status = 'failed' AND errors -> -1 ->> 'kind' = 'cancelled'", ready) == 19
    again = Bulk(conn, "cancel", JobFilter(types=("y",)), actor="olga")
    assert again.run(again.start()).changed == 1
    with pytest.raises(InvalidInput, match="applies to dead and failed"):
        Bulk(conn, "requeue", JobFilter(statuses=("ready",)), actor="olga")


def test_bulk_from_the_shell_dry_run_and_bad_input(conn: Conn, dsn: str) -> None:
    dead_jobs(dsn, conn, 12, account="acme")
    out = jobtui(dsn, "bulk", "requeue", "--payload-path", "account=acme", "--dry-run")
    assert out.returncode == 0 and "would requeue 12 dead and failed jobs" in out.stdout, out
    assert count(conn, "status = 'dead'") == 12
    asked = jobtui(dsn, "bulk", "requeue", "--type", "x")  # stdin is no terminal: it will not guess
    assert asked.returncode == 2 and "--yes" in asked.stderr
    done = jobtui(dsn, "bulk", "requeue", "--type", "x", "--yes", "--batch", "5")
    assert done.returncode == 0 and "requeued 12 job(s)" in done.stdout, done
    for args, says in (
        (("bulk", "requeue"), "say which jobs"),
        (("bulk", "cancel", "--status", "dead", "--yes"), "applies to ready and running"),
        (("bulk", "discard", "--error", "(", "--yes"), "regular expression"),
        (("bulk", "requeue", "--older-than", "soon", "--yes"), "bad duration"),
    ):
        result = jobtui(dsn, *args)
        assert result.returncode == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1, (
            args,
            result,
        )


def bulk_process(dsn: str, *args: str, **env: str) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    return subprocess.Popen(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "--actor", "olga", "bulk", *args],
        env={**environ, **env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def others(conn: Conn) -> int:
    """Client sessions of this test's database other than `conn`'s."""
    sessions = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    return int(scalar(conn, f"{sessions} AND backend_type = 'client backend' AND pid <> pg_backend_pid()"))


def test_a_bulk_requeue_killed_half_way_and_run_again_requeues_every_job_once(conn: Conn, dsn: str) -> None:
    ids = dead_jobs(dsn, conn, 3000)
    first = bulk_process(dsn, "requeue", "--type", "x", "--yes", "--batch", "20")
    wait_until(lambda: count(conn, "status = 'ready'") >= 1000, 60, "the first run half-way")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # A COMMIT the run sent before it died still commits: count once its session has ended.
    wait_until(lambda: others(conn) == 0, 30, "the killed run's session to end")
    halfway = count(conn, "status = 'ready'")
    assert 1000 <= halfway < 3000
    second = bulk_process(dsn, "requeue", "--type", "x", "--yes", "--batch", "500")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert f"requeued {3000 - halfway:,} job(s)" in out and "3,000 in all" in out and "resuming bulk run" in err
    assert set(requeued_times(conn, ids).values()) == {1}
    audit = conn.execute("SELECT rows FROM jobtui.audit WHERE action = 'bulk-requeue'").fetchall()
    assert audit == [(3000 - halfway,)]  # the killed run wrote none; its batches are in its run


@pytest.fixture
def bouncer(dsn: str) -> Iterator[PgBouncer]:
    params = conninfo_to_dict(dsn)
    host, port = str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))
    with PgBouncer.start(upstream_host=host, upstream_port=port, pool_size=2) as running:
        yield running


def test_a_bulk_requeue_through_pgbouncer_in_transaction_mode(conn: Conn, dsn: str, bouncer: PgBouncer) -> None:
    ids = dead_jobs(dsn, conn, 300)
    pooled = bouncer.dsn(str(conninfo_to_dict(dsn)["dbname"]))
    run = bulk_process(pooled, "requeue", "--type", "x", "--yes", "--batch", "25", JOBTUI_POOLER="transaction")
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0 and "requeued 300 job(s)" in out, (out, err)
    assert set(requeued_times(conn, ids).values()) == {1}
    found = json.loads(jobtui(pooled, "jobs", "--payload-path", "n=7", "--json").stdout)
    assert [j["id"] for j in found["jobs"]] == [ids[7]]
