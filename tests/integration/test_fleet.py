"""The fleet with real worker and scheduler processes on real PostgreSQL: each registers as it
starts with what it serves, reads as lost once killed and is pruned later, obeys a quiet
(its claims stop, its jobs in flight finish), a resume and a stop (it exits 0), and nothing
but an operator's row gives an order: not a read-only role, not a forged notification.

Workers run with a 2 s lease, so they refresh every 2/3 s and read as lost after 2 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui.cli.main import main
from jobtui.core.members import Target, give_order, prune_call
from jobtui.kernel.db import run
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.version import installed_version
from jobtui.reads.fleet import Fleet, read_fleet
from tests.integration.conftest import Spawn
from tests.integration.test_worker import enqueue, runs, statuses
from tests.waits import wait_until
from tests.workers import ROOT, close_gate, open_gate

Conn = psycopg.Connection[Any]


def fleet(db: Conn) -> Fleet:
    return read_fleet(db)


def row(db: Conn, name: str) -> Any:
    found = [p for p in fleet(db).processes if p.name == name]
    return found[0] if len(found) == 1 else None


def cli(capsys: pytest.CaptureFixture[str], dsn: str, *args: str) -> tuple[int, str, str]:
    code = main(["--dsn", dsn, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_worker_appears_as_it_starts_with_what_it_serves_and_leaves_at_exit(db: Conn, spawn: Spawn) -> None:
    w = spawn("W", "--queues", "default=3,reports=2", "--executor", "process")
    # Registered before it says it started: there at once, no refresh awaited.
    p = row(db, "W")
    assert p is not None, fleet(db)
    assert (p.kind, p.host, p.pid, p.version, p.state) == ("worker", os.uname().nodename, w.pid, installed_version(),
                                                           "running")  # fmt: skip
    assert p.queues == {"default": 3, "reports": 2, "jobtui.builtin": 1}
    assert p.every_queue is None and p.slots == 6
    assert {"effect", "effect_async", "nap", "jobtui.archive"} <= set(p.types)
    assert p.executor == "process" and p.scheduler and not p.lost
    assert p.lost_after == pytest.approx(2.0)
    # Refreshed on its timer: what it holds, by the database's clock.
    gate = close_gate(db)
    job = enqueue(db, "effect", {"key": "k-fleet", "hold_after": gate})
    wait_until(lambda: (r := row(db, "W")) is not None and r.in_flight == 1, 10, "one job in flight", w.log)
    assert row(db, "W").seen_ago < 1.5
    open_gate(db, gate)
    wait_until(lambda: statuses(db, [job]) == {job: "done"}, 10, "the job done", w.log)
    w.signal(signal.SIGTERM)
    assert w.wait_exit(15) == 0
    assert row(db, "W") is None  # a clean exit removes it


def test_a_scheduler_registers_too(app_dsn: str, db: Conn, tmp_path: Path) -> None:
    env = {**os.environ, "JOBTUI_DSN": app_dsn}
    log = tmp_path / "s.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jobtui.cli", "scheduler"], cwd=ROOT, env=env, stderr=out)
    try:
        wait_until(lambda: "started" in log.read_text(), 15, "the scheduler started", log.read_text)
        [p] = fleet(db).processes
        assert (p.kind, p.pid, p.scheduler, p.queues, p.every_queue) == ("scheduler", proc.pid, True, {}, None)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert fleet(db).processes == []
    finally:
        proc.kill()
        proc.wait(10)


def test_a_killed_worker_reads_as_lost_within_its_bound_then_is_pruned(db: Conn, spawn: Spawn) -> None:
    w = spawn("K")
    w.signal(signal.SIGKILL)
    w.wait_exit(5)
    # Lost once not refreshed for three intervals (2 s with a 2 s lease), by the database's clock.
    p = wait_until(lambda: (r := row(db, "K")) is not None and r.lost and r, 10, "K lost")
    assert 2.0 <= p.seen_ago < 6.0
    assert run(db, prune_call()) == 0  # lost for less than the prune bound: kept, and shown
    db.execute("UPDATE jobtui.fleet SET seen_at = now() - interval '61 minutes' WHERE name = 'K'")
    assert run(db, prune_call()) == 1
    assert row(db, "K") is None


def test_quiet_stops_the_claims_while_the_jobs_in_flight_finish_and_resume_starts_them(
    db: Conn, spawn: Spawn, dsn: str
) -> None:
    w = spawn("Q", "--poll", "0.2s")
    gate = close_gate(db)
    held = enqueue(db, "effect", {"key": "k-held", "hold_after": gate})
    wait_until(lambda: runs(db, held), 10, "the held job started", w.log)
    with psycopg.connect(dsn) as conn:
        give_order(conn, "quiet", Target(name="Q"), actor="ops@test")
    wait_until(lambda: row(db, "Q").state == "quiet", 5, "Q quiet", w.log)
    assert "worker Q quieted by ops@test" in w.log()
    later = enqueue(db, "nap", {"sleep": 0})
    # Several polls go by without a claim; the job in flight finishes meanwhile.
    open_gate(db, gate)
    wait_until(lambda: statuses(db, [held]) == {held: "done"}, 10, "the job in flight done", w.log)
    wait_until(lambda: row(db, "Q").in_flight == 0, 5, "nothing in flight")
    assert statuses(db, [later]) == {later: "ready"}
    audit = db.execute("SELECT actor, action, target, rows FROM jobtui.audit WHERE action LIKE 'fleet-%'").fetchall()
    assert audit == [("ops@test", "fleet-quiet", "name Q", 1)]
    with psycopg.connect(dsn) as conn:
        give_order(conn, "resume", Target(name="Q"), actor="ops@test")
    wait_until(lambda: statuses(db, [later]) == {later: "done"}, 10, "the later job done after resume", w.log)
    assert row(db, "Q").state == "running"


def test_stop_shuts_a_worker_down_as_sigterm_does(db: Conn, spawn: Spawn, dsn: str) -> None:
    w = spawn("S", "--shutdown-timeout", "10s")
    job = enqueue(db, "nap", {"sleep": 1.0})
    wait_until(lambda: runs(db, job), 10, "the job started", w.log)
    with psycopg.connect(dsn) as conn:
        result = give_order(conn, "stop", Target(name="S"), actor="ops@test")
    assert [m.name for m in result.changed] == ["S"]
    assert w.wait_exit(20) == 0
    assert statuses(db, [job]) == {job: "done"}  # in flight: it finished first
    assert "ordered it to stop" in w.log()
    assert row(db, "S") is None


def test_bad_orders_are_one_line_and_change_nothing(
    db: Conn, spawn: Spawn, app_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    b1 = spawn("B1", "--shutdown-timeout", "30s")
    gate = close_gate(db)
    held = enqueue(db, "effect", {"key": "k-b1", "hold_after": gate})
    wait_until(lambda: runs(db, held), 10, "B1 holding a job", b1.log)
    gone = spawn("B2")
    gone.signal(signal.SIGKILL)
    gone.wait_exit(5)
    wait_until(lambda: (r := row(db, "B2")) is not None and r.lost, 10, "B2 lost")
    for args, said in [
        (["quiet", "nobody"], "no process of the fleet matches name nobody"),
        (["stop", "--host", "no-such-host"], "no process of the fleet matches host no-such-host"),
        (["resume", "--version", "0.0.1"], "no process of the fleet matches version 0.0.1"),
        (["quiet", "B2"], "every process matching name B2 is lost"),
        (["resume", "B1"], "nothing to resume: B1: not quiet"),
        (["quiet"], "needs a NAME, --host HOST or --version VERSION"),
    ]:
        code, out, err = cli(capsys, app_dsn, "workers", *args)
        assert (code, out) == (2, ""), (args, out, err)
        assert said in err and err.count("\n") == 1, (args, err)
    code, out, _ = cli(capsys, app_dsn, "workers", "stop", "B1")
    assert code == 0 and "told to stop: 'B1'" in out
    wait_until(lambda: row(db, "B1").state == "stopping", 5, "B1 stopping (its job holds it)", b1.log)
    code, _, err = cli(capsys, app_dsn, "workers", "stop", "B1")
    assert code == 2 and "B1: already stopping" in err
    open_gate(db, gate)
    assert b1.wait_exit(20) == 0
    audit = db.execute("SELECT action, rows FROM jobtui.audit WHERE action LIKE 'fleet-%' ORDER BY id").fetchall()
    assert audit == [("fleet-stop", 1)]  # the refused ones wrote nothing
    code, _, err = cli(capsys, app_dsn, "--read-only", "workers", "quiet", "B1")
    assert code == 2 and "--read-only forbids" in err


def test_the_list_and_its_json(db: Conn, spawn: Spawn, app_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    spawn("L1", "--queues", "reports=2")
    spawn("L2")
    code, out, _ = cli(capsys, app_dsn, "workers", "--json")
    assert code == 0
    listed = json.loads(out)
    assert [p["name"] for p in listed["processes"]] == ["L1", "L2"]
    assert listed["processes"][0]["queues"] == {"reports": 2, "jobtui.builtin": 1}
    code, out, _ = cli(capsys, app_dsn, "workers", "--json", "--queue", "reports")
    assert [p["name"] for p in json.loads(out)["processes"]] == ["L1", "L2"]  # L2 serves every queue
    code, out, _ = cli(capsys, app_dsn, "workers", "--queue", "emails", "--sort", "name")
    assert code == 0 and "L2" in out and "L1" not in out
    # A type no worker's app handles; a queue with due jobs that no live worker serves.
    enqueue(db, "no.such.handler", {}, queue="reports")
    code, out, _ = cli(capsys, app_dsn, "workers", "--kind", "worker")
    assert "type no.such.handler has 1 due job and no handler" in out
    assert "serves queue" not in out
    with psycopg.connect(app_dsn) as conn:
        give_order(conn, "quiet", Target(name="L2"), actor="ops")
    wait_until(lambda: row(db, "L2").state == "quiet", 5, "L2 quiet")
    enqueue(db, "nap", {"sleep": 0}, queue="emails")
    code, out, _ = cli(capsys, app_dsn, "workers")
    assert "no live worker serves queue emails: 1 due (1 quiet or stopping)" in out
    assert "serves queue reports" not in out  # L1 does


def test_neither_a_read_only_role_nor_a_forged_notification_gives_an_order(
    db: Conn, spawn: Spawn, app_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.roles import grant_roles

    w = spawn("F", "--poll", "0.2s")
    p = row(db, "F")
    with grant_roles(app_dsn) as roles:
        code, _, err = cli(capsys, roles.readonly_dsn, "workers", "stop", "F")
        assert code == 2 and "lacks a privilege" in err
        with psycopg.connect(roles.readonly_dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            give_order(conn, "quiet", Target(name="F"), actor="mallory")
        # The read-only role reads the fleet, though.
        code, out, _ = cli(capsys, roles.readonly_dsn, "workers", "--json")
        assert code == 0 and json.loads(out)["processes"][0]["name"] == "F"
    # Anyone who can connect may notify: the worker reads its row, which asks nothing.
    seen = row(db, "F").orders
    for _ in range(20):
        db.execute("SELECT pg_notify('jobtui.job', %s)", (f"fleet {p.id}",))
    job = enqueue(db, "nap", {"sleep": 0})
    wait_until(lambda: statuses(db, [job]) == {job: "done"}, 10, "a job done after the forged hints", w.log)
    after = row(db, "F")
    assert (after.state, after.wanted, after.orders) == ("running", "running", seen)
    assert db.execute("SELECT count(*) FROM jobtui.audit").fetchone() == (0,)
    with pytest.raises(InvalidInput), psycopg.connect(app_dsn) as conn:
        give_order(conn, "resume", Target(name="F"), actor="ops")


def test_a_bad_open_is_one_line_and_exit_code_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", "postgresql://x@127.0.0.1:1/x", "--open", "job:nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "job:ID, ID a whole number" in done.stderr, done.stderr


def test_the_fleet_shows_while_the_job_table_is_locked_and_says_what_it_could_not_read(
    db: Conn, app_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.integration.test_fleet_reads import register

    register(db, "w-locked", every_queue=4, types=["nap"])
    with psycopg.connect(app_dsn) as holder:
        holder.execute("LOCK TABLE jobtui.job IN ACCESS EXCLUSIVE MODE")  # an ALTER TABLE, a VACUUM FULL
        code, out, err = cli(capsys, app_dsn, "workers", "--json")
        assert code == 0, err
        listed = json.loads(out)
        assert [p["name"] for p in listed["processes"]] == ["w-locked"]
        assert "stayed locked" in listed["job_table_locked"]
        code, out, err = cli(capsys, app_dsn, "workers")
        assert code == 0 and "w-locked" in out and "the leases held and the findings were not read" in out, out
    code, out, _ = cli(capsys, app_dsn, "workers", "--json")
    assert json.loads(out)["job_table_locked"] is None
