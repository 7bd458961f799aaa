"""`jobtui worker --loop`: the same worker on asyncio's loop and on uvloop's, in real processes."""

from __future__ import annotations

import signal
import sys
from typing import Any

import psycopg
import pytest

from jobtui import Client
from jobtui.cli.eventloop import loop_factory
from jobtui.kernel.errors import InvalidInput
from tests.integration.conftest import Spawn
from tests.waits import wait_until
from tests.workers import close_gate, open_gate

Conn = psycopg.Connection[Any]


def status(conn: Conn, job_id: int) -> tuple[str, int]:
    row = conn.execute("SELECT status::text, attempts FROM jobtui.job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row[0], row[1]


def events(conn: Conn, job_id: int) -> list[str]:
    return [r[0] for r in conn.execute("SELECT event FROM run_log WHERE job_id = %s ORDER BY id", (job_id,))]


def test_the_start_line_of_a_worker_without_sync_handlers_says_so(spawn: Spawn) -> None:
    worker = spawn("A", "--types", "effect_async")
    assert "no sync handlers, event loop uvloop" in worker.log(), worker.log()
    assert "sync handlers in" not in worker.log()


@pytest.mark.parametrize(("loop", "executor"), [("asyncio", "thread"), ("uvloop", "process"), ("auto", "thread")])
def test_a_worker_runs_every_kind_of_handler_and_stops_on_each_loop(
    loop: str, executor: str, spawn: Spawn, app_dsn: str, db: Conn
) -> None:
    worker = spawn("L", "--loop", loop, "--executor", executor, "--shutdown-timeout", "1s", "--poll", "0.2s")
    # uvloop is one of jobtui's dependencies: auto takes it.
    assert f"event loop {'uvloop' if loop == 'auto' else loop}" in worker.log(), worker.log()
    with Client(app_dsn) as q:
        sync_id = q.enqueue("effect", {"key": f"sync-{loop}"})
        async_id = q.enqueue("effect_async", {"key": f"async-{loop}"})
        failing_id = q.enqueue("permanent", {"why": "bad input"})
        wait_until(
            lambda: [status(db, i)[0] for i in (sync_id, async_id, failing_id)] == ["done", "done", "failed"],
            20,
            "the three jobs finished",
            worker.log,
        )
        effects = db.execute("SELECT key FROM effect_log ORDER BY key").fetchall()
        assert [r[0] for r in effects] == [f"async-{loop}", f"sync-{loop}"]
        # A job running at SIGTERM: given its shutdown timeout, then released, uncounted.
        gate = close_gate(db)
        try:
            held_id = q.enqueue("effect", {"key": f"held-{loop}", "hold_before": gate})
            wait_until(lambda: events(db, held_id) == ["start"], 20, "the held job to start", worker.log)
            worker.signal(signal.SIGTERM)
            assert worker.wait_exit(20) == 0, worker.log()
        finally:
            open_gate(db, gate)
    assert status(db, held_id) == ("ready", 0), worker.log()
    assert "Traceback" not in worker.log()


def test_the_loop_names(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop

    assert loop_factory("asyncio") is None
    assert loop_factory("uvloop") is uvloop.new_event_loop
    assert loop_factory("auto") is uvloop.new_event_loop
    must = r"--loop \(or JOBTUI_LOOP\) must be one of auto, asyncio, uvloop, got 'Asyncio'"
    with pytest.raises(InvalidInput, match=must):
        loop_factory("Asyncio")
    # Without uvloop, auto falls back to asyncio's loop and uvloop says what to do.
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert loop_factory("auto") is None
    with pytest.raises(InvalidInput, match=r"uvloop is not installed; install it \(pip install uvloop\)"):
        loop_factory("uvloop")
