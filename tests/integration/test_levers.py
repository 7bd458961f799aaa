"""The incident levers against real PostgreSQL and real worker processes: named queues,
fleet-wide pauses of a queue or a type, global concurrency limits, and cancelling a
running job.

Workers run `python -m jobtui.cli worker --app tests.apps.worker_app:jobs`; the `nap` (async)
and `nap_sync` handlers log each start, end and cancellation to `run_log`.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui.clients.client import Client
from jobtui.core import queues
from jobtui.core.claims import claim_call
from jobtui.core.registry import Jobs
from jobtui.kernel.db import Call, int_list, run
from jobtui.kernel.domain import NewJob
from jobtui.reads.overview import overview
from tests.cli import clean_env, run_cli
from tests.waits import wait_until
from tests.workers import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.worker_app:jobs"

Conn = psycopg.Connection[Any]
Spawn = Callable[..., WorkerProcess]


@pytest.fixture
def spawn(spawn: Spawn) -> Spawn:
    """Worker processes with a 3 s lease and no scheduler of their own."""
    return lambda name, *args: spawn(name, "--no-scheduler", *args, lease="3s")


def jobtui(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = run_cli("--dsn", dsn, "--actor", "olga", *args, env=clean_env())
    assert "Traceback" not in result.stderr, result.stderr
    return result


@contextlib.contextmanager
def sampled(dsn: str, where: str) -> Iterator[list[int]]:
    """`count(where)`, sampled about every 10 ms on a connection of its own for as long as
    the block runs; the counts, filled in meanwhile."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                samples.append(count(conn, where))
                stop.wait(0.01)  # the sampling's pace; the stop ends it at once

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield samples
    finally:
        stop.set()
        sampler.join()


def enqueue(dsn: str, queue: str, n: int, job_type: str = "nap", **payload: Any) -> list[int]:
    with Client(dsn) as q:
        return q.enqueue_many([NewJob(job_type, payload, queue=queue) for _ in range(n)])


def count(conn: Conn, where: str, *params: Any) -> int:
    row = conn.execute(f"SELECT count(*) FROM jobtui.job WHERE {where}", params).fetchone()
    return int(row[0]) if row else 0


def events(conn: Conn, job_id: int) -> list[str]:
    rows = conn.execute("SELECT event FROM run_log WHERE job_id = %s ORDER BY id", (job_id,)).fetchall()
    return [str(r[0]) for r in rows]


# -- the claim statement ------------------------------------------------------------------


def claim(conn: Conn, queue: str | None, limit: int = 10, types: tuple[str, ...] = ("a", "b")) -> list[int]:
    return [j.id for j in run(conn, claim_call(types, worker="w", limit=limit, queue=queue))]


def test_a_claim_takes_its_own_queue_and_skips_paused_ones(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        in_x = [q.enqueue("a", queue="x") for _ in range(3)]
        in_y = [q.enqueue("b", queue="y") for _ in range(3)]
        default = q.enqueue("a")
    assert sorted(claim(conn, "x", 2)) == in_x[:2]
    assert queues.pause(conn, "queue", "y", actor="olga")
    assert not queues.pause(conn, "queue", "y", actor="olga")  # already paused: no change
    assert claim(conn, "y") == []
    assert sorted(claim(conn, None)) == [in_x[2], default]  # every queue but the paused one
    assert queues.resume(conn, "queue", "y", actor="olga")
    assert queues.pause(conn, "type", "b", actor="olga")
    assert claim(conn, "y") == []  # the type is paused now
    queues.resume(conn, "type", "b", actor="olga")
    assert sorted(claim(conn, "y")) == in_y
    audit = conn.execute("SELECT action, target, rows FROM jobtui.audit ORDER BY id").fetchall()
    assert audit == [
        ("queue-pause", "queue y", 1),
        ("queue-pause", "queue y", 0),
        ("queue-resume", "queue y", 1),
        ("type-pause", "type b", 1),
        ("type-resume", "type b", 1),
    ]


def test_a_limit_counts_what_runs_in_its_queue(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        ids = [q.enqueue("a", queue="lim") for _ in range(6)]
        other = q.enqueue("a", queue="free")
    assert queues.set_limit(conn, "lim", 2, actor="olga").was is None
    assert sorted(claim(conn, "lim", 10)) == ids[:2]
    assert claim(conn, "lim", 10) == []  # two run: the limit is reached
    # A claim of every queue takes the free queue's job and none of the limited one's.
    assert claim(conn, None, 10) == [other]
    conn.execute("UPDATE jobtui.job SET status = 'done', locked_until = NULL WHERE id = %s", (ids[0],))
    assert claim(conn, None, 10) == [ids[2]]  # one slot freed
    change = queues.set_limit(conn, "lim", 4, actor="olga", expected=2, fenced=True)
    assert change.changed and change.was == 2
    assert not queues.set_limit(conn, "lim", 9, actor="olga", expected=2, fenced=True).changed  # it is 4 now
    assert sorted(claim(conn, "lim", 10)) == ids[3:5]
    queues.set_limit(conn, "lim", None, actor="olga")
    assert claim(conn, "lim", 10) == [ids[5]]


def test_queue_overview_counts_per_queue_and_type(conn: Conn, dsn: str) -> None:
    with Client(dsn) as q:
        for _ in range(3):
            q.enqueue("a", queue="x")
        q.enqueue("b", queue="x", delay=3600)
        q.enqueue("b")
    claim(conn, "x", 1, types=("a",))
    queues.set_limit(conn, "idle", 5, actor="olga")
    queues.pause(conn, "type", "b", actor="olga")
    lines = {(q.kind, q.name): q for q in overview(conn).lines}
    x = lines[("queue", "x")]
    assert (x.ready, x.due, x.running, x.max_running, x.paused) == (3, 2, 1, None, False)
    assert x.oldest_age is not None and x.oldest_age >= 0
    assert (lines[("queue", "idle")].ready, lines[("queue", "idle")].max_running) == (0, 5)
    b = lines[("type", "b")]
    assert (b.ready, b.due, b.paused, b.paused_by) == (2, 1, True, "olga")
    assert lines[("queue", "default")].ready == 1


def test_a_job_goes_to_its_handlers_declared_queue_unless_given_one(conn: Conn, dsn: str) -> None:
    jobs = Jobs()
    jobs.handler("mail.send", queue="mail")(lambda job: None)
    jobs.handler("other")(lambda job: None)
    with Client(dsn, jobs=jobs) as q:
        declared = q.enqueue("mail.send")
        given = q.enqueue("mail.send", queue="urgent")
        undeclared = q.enqueue("other")
        many = q.enqueue_many([NewJob("mail.send"), NewJob("mail.send", queue="urgent"), NewJob("other")])
    with Client(dsn) as q:  # without the registry: the default queue
        plain = q.enqueue("mail.send")
    rows = dict(conn.execute("SELECT id, queue FROM jobtui.job").fetchall())
    assert [rows[i] for i in (declared, given, undeclared, *many, plain)] == [
        "mail", "urgent", "default", "mail", "urgent", "default", "default",
    ]  # fmt: skip


def test_queue_limit_says_and_audits_what_it_replaced(app_dsn: str, conn: Conn) -> None:
    said = [jobtui(app_dsn, "queue", "limit", "reports", value).stdout for value in ("5", "7", "none")]
    assert ["(was none)" in said[0], "(was 5)" in said[1], "(was 7)" in said[2]] == [True, True, True], said
    audit = json.loads(jobtui(app_dsn, "audit", "--json").stdout)
    assert [(e["action"], e["detail"]) for e in reversed(audit)] == [
        ("queue-limit", {"limit": 5, "was": None}),
        ("queue-limit", {"limit": 7, "was": 5}),
        ("queue-limit", {"limit": None, "was": 7}),
    ]
    # The console's change is fenced by what the operator saw: refused, it says what is there now.
    refused = queues.set_limit(conn, "reports", 9, actor="olga", expected=5, fenced=True)
    assert (refused.changed, refused.was) == (False, None)


# -- real workers -------------------------------------------------------------------------


def test_a_paused_queue_stops_on_every_worker_while_others_flow(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    workers = [spawn(name, "--queues", "hot=2,calm=2", "--verbose") for name in ("A", "B")]
    enqueue(app_dsn, "hot", 120, sleep=0.05)
    enqueue(app_dsn, "calm", 300, sleep=0.05)
    wait_until(lambda: count(db, "queue = 'hot' AND status = 'done'") >= 10, 15, "hot jobs done")
    assert "paused" in jobtui(app_dsn, "queue", "pause", "hot").stdout
    paused = time.monotonic()
    # The pause takes hold at each worker's next claim of the queue (at most a poll, 1s, away):
    # from then on no worker claims from it, and the jobs it runs finish.
    marks = [w.claims("hot") for w in workers]
    for worker, mark in zip(workers, marks, strict=True):
        worker.wait_claims(mark + 2, 10, "hot")
    wait_until(lambda: count(db, "queue = 'hot' AND status = 'running'") == 0, 10, "the hot jobs in flight done")
    started = count(db, "queue = 'hot' AND status <> 'ready'")
    assert started < 120, "the hot queue drained: the pause did not take hold"
    # Three more claims of the queue by each worker, while the other queue flows on: none
    # may start a hot job.
    marks = [w.claims("hot") for w in workers]
    calm_before = count(db, "queue = 'calm' AND status = 'done'")
    wait_until(lambda: count(db, "queue = 'calm' AND status = 'done'") > calm_before + 10, 10, "the other queue")
    for worker, mark in zip(workers, marks, strict=True):
        worker.wait_claims(mark + 3, 10, "hot")
    assert count(db, "queue = 'hot' AND status <> 'ready'") == started
    assert count(db, "queue = 'hot' AND status = 'running'") == 0
    assert time.monotonic() - paused < 10
    # The pause survives a restart (it is a row), and resuming drains the queue.
    fresh = spawn("C", "--queues", "hot=4", "--verbose")
    fresh.wait_claims(2, 10, "hot")  # each after the pause: claims that must not start a hot job
    assert count(db, "queue = 'hot' AND status <> 'ready'") == started
    assert "resumed" in jobtui(app_dsn, "queue", "resume", "hot").stdout
    wait_until(lambda: count(db, "queue = 'hot' AND status <> 'done'") == 0, 60, "the hot queue drained")


def test_a_limit_of_3_is_never_exceeded_across_two_workers(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    assert "3 running at once" in jobtui(app_dsn, "queue", "limit", "lim", "3").stdout
    # Each worker alone runs at most 2 at once, so reaching 3 takes both, claiming at once:
    # A from its pool for the queue, B from its one pool for every queue.
    spawn("A", "--queues", "lim=2,other=2")
    spawn("B", "--concurrency", "2")
    ids = enqueue(app_dsn, "lim", 40, sleep=0.1)
    with sampled(app_dsn, "queue = 'lim' AND status = 'running'") as samples:
        wait_until(lambda: count(db, "id = ANY(%s) AND status = 'done'", ids) == len(ids), 60, "the limited queue done")
    assert max(samples) == 3, f"running jobs of the limited queue, sampled: max {max(samples)}"
    workers = db.execute("SELECT DISTINCT locked_by FROM jobtui.job WHERE id = ANY(%s)", (ids,)).fetchall()
    assert {str(w[0]) for w in workers} == {"A", "B"}


def test_a_cancelled_running_job_stops_within_2s_on_its_worker(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    worker = spawn("A", "--concurrency", "4")
    [async_job] = enqueue(app_dsn, "default", 1, "nap", sleep=60)
    [sync_job] = enqueue(app_dsn, "default", 1, "nap_sync", sleep=60, key="never-done")
    ids = [async_job, sync_job]
    wait_until(lambda: all(events(db, i) == ["start"] for i in ids), 15, "both jobs running", worker.log)
    out = jobtui(app_dsn, "cancel", str(async_job), str(sync_job))
    assert out.returncode == 0 and "cancelled 2 job(s)" in out.stdout, out
    # Both handlers stop within 2s of the command's commit (the command's own start-up,
    # a Python process, is not the worker's to count).
    wait_until(
        lambda: "cancelled" in events(db, async_job) and "effect refused: LeaseLost" in events(db, sync_job),
        2,
        "both handlers stopped",
        worker.log,
    )
    assert events(db, sync_job) == ["start", "cancelled", "effect refused: LeaseLost"]
    # No later outcome lands: the jobs stay failed with the reason, and the worker moves on.
    [again] = enqueue(app_dsn, "default", 1, "nap", sleep=0)
    wait_until(lambda: count(db, "id = %s AND status = 'done'", again), 10, "the next job done", worker.log)
    # Its clean stop writes what it still would: after it, nothing of this worker may land.
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(30) == 0, worker.log()
    rows = db.execute(
        "SELECT status, last_error, errors -> -1 ->> 'kind' FROM jobtui.job WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert rows == [("failed", "cancelled by olga", "cancelled")] * 2
    assert db.execute("SELECT count(*) FROM effect_log").fetchone() == (0,)


def test_a_lost_cancel_notification_is_caught_by_the_heartbeat(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    worker = spawn("A")
    [job] = enqueue(app_dsn, "default", 1, "nap", sleep=60)
    wait_until(lambda: events(db, job) == ["start"], 15, "the job running", worker.log)
    # The cancel statement itself, its notification sent to a channel no worker listens on.
    call = Call("action_cancel", {"ids": [job], "actor": "olga", "channel": "nobody.listens"}, int_list)
    assert run(db, call) == [job]
    # The heartbeat runs every third of the 3s lease; its answer says the job was cancelled.
    wait_until(lambda: "cancelled" in events(db, job), 3, "the handler cancelled by the heartbeat", worker.log)
    assert db.execute("SELECT status FROM jobtui.job WHERE id = %s", (job,)).fetchone() == ("failed",)


def test_queue_commands_refuse_bad_input_in_one_line(app_dsn: str) -> None:
    for args, says in (
        (("queue", "limit", "q", "lots"), "is not a number of jobs"),
        (("queue", "limit", "q", "-1"), "must be between 0"),
        (("queue", "pause", ""), "bad queue name"),
        (("worker", "--app", APP, "--queues", "a=1,a=2"), "given twice"),
        (("worker", "--app", APP, "--queues", "a"), "NAME=CONCURRENCY"),
        (("enqueue", "t", "--queue", ""), "bad queue name"),
    ):
        result = jobtui(app_dsn, *args)
        assert result.returncode == 2, (args, result)
        assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    listed = jobtui(app_dsn, "queue", "list", "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]"


def test_stats_show_the_queues_once_a_lever_is_pulled(app_dsn: str) -> None:
    assert "Queues and job types" not in jobtui(app_dsn, "stats").stdout  # one default queue: nothing to add
    enqueue(app_dsn, "mail", 2)
    enqueue(app_dsn, "default", 1)
    assert jobtui(app_dsn, "queue", "pause", "mail").returncode == 0
    shown = jobtui(app_dsn, "stats").stdout
    assert "Queues and job types" in shown and "by olga" in shown
    data = json.loads(jobtui(app_dsn, "stats", "--json").stdout)
    mail = next(q for q in data["queues"] if (q["kind"], q["name"]) == ("queue", "mail"))
    assert (mail["ready"], mail["paused"], mail["paused_by"]) == (2, True, "olga")
    audit = jobtui(app_dsn, "audit", "--json").stdout
    assert [(e["action"], e["target"]) for e in json.loads(audit)] == [("queue-pause", "queue mail")]
