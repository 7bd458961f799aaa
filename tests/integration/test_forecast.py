"""The drain forecast against real PostgreSQL and a real worker process: the archiver's
spans count what was enqueued and what finished, and a backlog drained at a known rate
while jobs come in at a known rate reads back the forecast those rates give."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from jobtui.clients.client import Client
from jobtui.core import queues
from jobtui.core.history import record_flow
from jobtui.kernel.db import run
from jobtui.kernel.domain import NewJob
from jobtui.reads.flows import line_forecasts, recent_call
from jobtui.reads.metrics import snapshot
from jobtui.reads.overview import overview
from jobtui.service.prometheus import forecast_families
from tests.integration.test_levers import jobtui
from tests.waits import hold, wait_until
from tests.workers import WorkerProcess

Conn = psycopg.Connection[Any]
Spawn = Callable[..., WorkerProcess]

DRAIN = 60.0  # jobs per second, the worker's rate
# A rate's bucket starts full, with two seconds' worth (rate_burst, migration 0013).
BURST = 2 * DRAIN
INFLOW = 30.0  # jobs per second, enqueued meanwhile


def db_now(conn: Conn) -> Any:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def ready(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM jobtui.job WHERE queue = 'fq' AND status = 'ready'").fetchone()
    return int(row[0]) if row else 0


def enqueue_steadily(dsn: str, per_second: float, stop: threading.Event, queue: str = "fq") -> None:
    with Client(dsn) as q:
        start, n = time.monotonic(), 0
        while not stop.is_set():
            due = int((time.monotonic() - start) * per_second)
            if due > n:
                q.enqueue_many([NewJob("quick", {}, queue=queue) for _ in range(due - n)])
                n = due
            stop.wait(0.02)  # the pace of the inflow; a stop ends it at once


def drain_with_inflow(db: Conn, app_dsn: str, spawn: Spawn, backlog: int, seconds: float) -> None:
    """A worker drains queue fq at DRAIN jobs/s while INFLOW jobs/s come in, for `seconds`;
    a span is recorded at the start and at the end."""
    with Client(app_dsn) as q:
        q.enqueue_many([NewJob("quick", {}, queue="fq") for _ in range(backlog)])
    queues.set_rate(db, "queue", "fq", DRAIN, actor="olga")
    spawn("A", "--no-scheduler", "--concurrency", "50")
    # The window opens once the burst is taken, so that it sees the rate alone: a burst inside
    # it would read as a faster drain, by up to a quarter over 8 s.
    wait_until(lambda: backlog == 0 or ready(db) <= backlog - BURST, 15, "the worker past the rate's burst")
    assert record_flow(db, until=db_now(db))  # the first span: its enqueues are not known
    stop = threading.Event()
    inflow = threading.Thread(target=enqueue_steadily, args=(app_dsn, INFLOW, stop))
    inflow.start()
    try:
        hold(seconds, "the window the drain and the inflow are measured over")
    finally:
        stop.set()
        inflow.join()
    assert record_flow(db, until=db_now(db))


def test_the_forecast_reads_back_a_known_drain_and_inflow(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    drain_with_inflow(db, app_dsn, spawn, 3000, 8.0)
    lines = overview(db).lines
    by_line = line_forecasts(lines, run(db, recent_call()))
    due = next(q.due for q in lines if (q.kind, q.name) == ("queue", "fq"))
    expected = due / (DRAIN - INFLOW)
    f = by_line[("queue", "fq")]
    assert f.state == "drains" and abs(f.seconds - expected) <= 0.2 * expected, (f, expected)
    assert abs(f.done_per_minute - DRAIN * 60) <= 0.2 * DRAIN * 60, f
    assert abs(f.enqueued_per_minute - INFLOW * 60) <= 0.2 * INFLOW * 60, f
    # The type's line and the header's figure read the same jobs.
    assert abs(by_line[("type", "quick")].seconds - f.seconds) <= 0.05 * f.seconds
    snap = snapshot(db)
    assert snap.forecast.state == "drains" and abs(snap.forecast.seconds - expected) <= 0.2 * expected
    stats = json.loads(jobtui(app_dsn, "stats", "--json").stdout)
    assert stats["forecast"]["state"] == "drains" and stats["forecast"]["seconds"] > 0
    fq = next(q for q in stats["queues"] if (q["kind"], q["name"]) == ("queue", "fq"))
    assert fq["forecast"]["state"] == "drains" and "drains in ~" in fq["forecast"]["text"]
    assert "drains in ~" in jobtui(app_dsn, "queue", "list").stdout


def test_a_growing_backlog_is_nan_seconds_for_prometheus(db: Conn, app_dsn: str) -> None:
    first = db_now(db)
    record_flow(db, until=first)
    with Client(app_dsn) as q:
        q.enqueue_many([NewJob("quick", {}, queue="fq") for _ in range(500)])
    # The next span lasts at least 0.2s by the database's clock, which the spans are cut by.
    wait_until(lambda: db_now(db) >= first + timedelta(seconds=0.2), 30, "0.2s on the database's clock")
    record_flow(db, until=db_now(db))
    snap = snapshot(db)
    lines = overview(db).lines
    assert snap.forecast.state == "stalled" and "nothing done" in snap.forecast.text  # nothing finished
    with Client(app_dsn) as q:
        done = q.claim(["quick"], worker="w", limit=100)
        q.complete([j.lease for j in done])
        q.enqueue_many([NewJob("quick", {}, queue="fq") for _ in range(500)])
    record_flow(db, until=db_now(db))
    snap = snapshot(db)
    forecasts = line_forecasts(lines, snap.flows)
    assert forecasts[("queue", "fq")].state == "growing" and forecasts[("queue", "fq")].text.startswith("growing +")
    metrics = {m.name: m for m in forecast_families(snap, forecasts)}
    assert math.isnan(metrics["jobtui_drain_seconds"].samples[0].value)
    queue_sample = next(s for s in metrics["jobtui_queue_drain_seconds"].samples if s.labels["name"] == "fq")
    assert math.isnan(queue_sample.value)


@pytest.mark.slow
def test_the_forecast_comes_true(db: Conn, app_dsn: str, spawn: Spawn) -> None:
    """The long version: the forecast made after 20 s of flows, against the time the backlog
    then takes to drain at the same pace."""
    with Client(app_dsn) as q:
        q.enqueue_many([NewJob("quick", {}, queue="fq") for _ in range(3000)])
    drain_with_inflow(db, app_dsn, spawn, 0, 20.0)
    lines = overview(db).lines
    f = line_forecasts(lines, run(db, recent_call()))[("queue", "fq")]
    assert f.state == "drains"
    stop = threading.Event()
    inflow = threading.Thread(target=enqueue_steadily, args=(app_dsn, INFLOW, stop))
    started = time.monotonic()
    inflow.start()
    try:
        wait_until(lambda: ready(db) < INFLOW, f.seconds * 2 + 30, "the backlog drained")
    finally:
        stop.set()
        inflow.join()
    took = time.monotonic() - started
    assert abs(took - f.seconds) <= 0.2 * f.seconds, (took, f)
