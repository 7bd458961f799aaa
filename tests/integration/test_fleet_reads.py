"""What the fleet means for the queue, read from real rows: the findings, the lease holders
without a row, and the Prometheus families; and what a worker does on its own with the
registry (a clean exit, a refresh after its row was pruned)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from jobtui import Client, Jobs, Worker
from jobtui.core import queues
from jobtui.core.members import Member, Presence, Status, Target, give_order, register_call
from jobtui.kernel.db import run
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.link import Connection
from jobtui.reads.fleet import findings, holders, read_fleet
from jobtui.reads.metrics import running_groups_call
from jobtui.reads.overview import overview
from jobtui.service.prometheus import QueueCollector
from tests.waits import until

Conn = psycopg.Connection[Any]


def register(conn: Conn, name: str, **fields: Any) -> int:
    member = Member(name, fields.pop("kind", "worker"), 10.0, **fields)
    row, _ = run(conn, register_call(member, Status(fields.pop("state", "running"))))
    return row


def samples(dsn: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in QueueCollector(dsn).collect():
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def test_findings_name_what_waits_on_nothing_and_hold_back_where_old_workers_may_serve(conn: Conn) -> None:
    register(conn, "a", queues={"default": 4}, types=["email.send"])
    register(conn, "b", queues={"reports": 2}, types=["report.build"], version="9.9.9")
    with Client(conn.info.dsn) as q:
        q.enqueue("email.send", queue="emails")  # a queue nobody serves
        q.enqueue("pdf.render")  # a type nobody handles, in a served queue
        q.enqueue("report.build", queue="paused-q")
    queues.pause(conn, "queue", "paused-q", actor="ops")  # waiting by design: not named
    fleet = read_fleet(conn)
    lines = overview(conn).lines
    found = {(f.kind, f.name): f.text for f in findings(fleet, lines)}
    assert found == {
        ("queue", "emails"): "no live worker serves queue emails: 1 due",
        ("type", "pdf.render"): "type pdf.render has 1 due job and no handler",
        ("versions", ""): "2 versions running: 0.3.0 (1), 9.9.9 (1)",
    }
    # A worker of a release before the registry holds a lease of queue emails: it may serve
    # it, so the queue is not named while such a one holds leases there.
    conn.execute(
        "UPDATE jobtui.job SET status = 'running', locked_by = 'old:1', locked_until = now() + interval '1 hour',"
        " lease_token = 1, heartbeat_at = now() WHERE queue = 'emails'"
    )
    conn.execute("INSERT INTO jobtui.job (type, queue) VALUES ('email.send', 'emails')")
    groups = run(conn, running_groups_call())
    held = holders(read_fleet(conn), groups)
    assert [(h.name, h.jobs, h.lost) for h in held] == [("old:1", 1, False)]
    named = {(f.kind, f.name) for f in findings(fleet, overview(conn).lines, held)}
    assert ("queue", "emails") not in named and ("type", "pdf.render") in named


def test_prometheus_counts_the_fleet_by_kind_state_and_version_and_each_queues_workers(dsn: str, conn: Conn) -> None:
    register(conn, "a", every_queue=10, types=["email.send"])
    register(conn, "b", queues={"reports": 2, "default": 3}, types=["report.build"])
    register(conn, "s", kind="scheduler", scheduler=True)
    quiet = register(conn, "q", queues={"reports": 5}, types=["report.build"])
    with psycopg.connect(dsn) as c:
        give_order(c, "quiet", Target(ids=[quiet]), actor="ops")
    conn.execute("UPDATE jobtui.fleet SET state = 'quiet' WHERE id = %s", (quiet,))  # as it would write it
    lost = register(conn, "gone", every_queue=4)
    conn.execute("UPDATE jobtui.fleet SET seen_at = now() - interval '5 minutes' WHERE id = %s", (lost,))
    with Client(dsn) as q:
        q.enqueue("pdf.render")
        q.enqueue("pdf.render")
        q.enqueue("email.send", queue="emails")
    got = samples(dsn)
    assert got["jobtui_fleet_processes", (("kind", "worker"), ("state", "running"), ("version", "0.3.0"))] == 2
    assert got["jobtui_fleet_processes", (("kind", "worker"), ("state", "quiet"), ("version", "0.3.0"))] == 1
    assert got["jobtui_fleet_processes", (("kind", "scheduler"), ("state", "running"), ("version", "0.3.0"))] == 1
    assert got["jobtui_fleet_lost_processes", (("kind", "worker"),)] == 1
    # Workers claiming from each queue now, and their slots: a's 10 count in every queue.
    assert got["jobtui_queue_workers", (("queue", "reports"),)] == 2  # a and b; q is quiet
    assert got["jobtui_queue_slots", (("queue", "reports"),)] == 12
    assert got["jobtui_queue_slots", (("queue", "default"),)] == 13
    assert got["jobtui_queue_workers", (("queue", "emails"),)] == 1
    assert got["jobtui_unhandled_due_jobs", (("type", "pdf.render"),)] == 2
    assert ("jobtui_unhandled_due_jobs", (("type", "email.send"),)) not in got
    assert got["jobtui_unregistered_lease_holders", ()] == 0


async def test_an_embedded_worker_registers_leaves_and_registers_again_after_a_prune(dsn: str) -> None:
    jobs = Jobs()

    @jobs.handler("x")
    async def x(job: Any) -> None:
        return None

    worker = Worker(jobs, dsn, concurrency=3, lease=3.0, worker_id="emb", scheduler=False)
    task = asyncio.create_task(worker.run())
    await until(lambda: worker.started.is_set(), 10, "the worker started")
    with psycopg.connect(dsn, autocommit=True) as conn:
        [p] = read_fleet(conn).processes
        assert (p.name, p.every_queue, p.executor, p.scheduler) == ("emb", 3, "async", False)
        # Pruned while it was away (deleted here): its next refresh registers it again.
        conn.execute("DELETE FROM jobtui.fleet")
        await until(lambda: [q.name for q in read_fleet(conn).processes] == ["emb"], 10, "registered again")
        worker.stop()
        await asyncio.wait_for(task, 15)
        assert read_fleet(conn).processes == []


async def test_a_row_hinted_and_cancelled_in_one_turn_stops_refreshing(dsn: str) -> None:
    """A process's stop hints its row (the state changed) and cancels the row's refresh loop in
    the same turn of the loop: the loop ends, and the process's exit is not held up by it."""
    conn = Connection(dsn, "fleet")
    presence = Presence(conn, "jobtui", Member("hinted", "scheduler", 60.0, scheduler=True),
                        status=lambda: Status("stopping"), obey=lambda wanted, by: None)  # fmt: skip
    await presence.register()
    refreshing = asyncio.create_task(presence.run())
    await asyncio.sleep(0)  # one turn: the loop reaches its wait for a hint or its interval
    presence.look()
    refreshing.cancel()
    done, _ = await asyncio.wait([refreshing], timeout=5)
    assert refreshing in done and refreshing.cancelled(), f"refreshing on ({presence.refreshes} refreshes)"
    await presence.leave()
    await conn.close()
    with psycopg.connect(dsn, autocommit=True) as check:
        assert read_fleet(check).processes == []


def test_quiet_is_not_for_a_server(conn: Conn) -> None:
    register(conn, "web", kind="serve")
    with pytest.raises(InvalidInput, match="serve claims no jobs"):
        give_order(conn, "quiet", Target(name="web"), actor="ops")
    assert [m.name for m in give_order(conn, "stop", Target(name="web"), actor="ops").changed] == ["web"]


def test_a_restarted_process_replaces_its_lost_row_and_a_live_namesake_stays(conn: Conn) -> None:
    from jobtui.core.members import refresh_call

    old = register(conn, "fixed-id")
    conn.execute("UPDATE jobtui.fleet SET started_at = now() - interval '1 hour' WHERE id = %s", (old,))
    twin = register(conn, "fixed-id")  # live: two processes given one name
    new = register(conn, "fixed-id")
    run(conn, refresh_call(new, Status("running")))
    assert {p.id for p in read_fleet(conn).processes} == {old, twin, new}  # none lost yet
    conn.execute("UPDATE jobtui.fleet SET seen_at = now() - interval '1 minute' WHERE id IN (%s, %s)", (old, twin))
    conn.execute("UPDATE jobtui.fleet SET started_at = now() - interval '30 seconds' WHERE id = %s", (new,))
    run(conn, refresh_call(new, Status("running")))
    # Both were lost and last seen before `new` started: both were this name's earlier lives.
    assert {p.id for p in read_fleet(conn).processes} == {new}
    # One lost but last seen after `new` started is another process of the name: it stays.
    other = register(conn, "fixed-id")
    conn.execute("UPDATE jobtui.fleet SET seen_at = now() - interval '20 seconds' WHERE id = %s", (other,))
    run(conn, refresh_call(new, Status("running")))
    assert {p.id for p in read_fleet(conn).processes} == {new, other}


def test_with_no_live_worker_at_all_one_finding_says_so(conn: Conn) -> None:
    with Client(conn.info.dsn) as q:
        q.enqueue("email.send")
        q.enqueue("pdf.render", queue="reports")
    register(conn, "s", kind="scheduler")  # no worker: a scheduler claims nothing
    found = findings(read_fleet(conn), overview(conn).lines)
    assert [(f.kind, f.text) for f in found] == [("fleet", "no live worker: 2 due in 2 queues")]
