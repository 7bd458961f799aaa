"""Fixtures of the chaos tests that run `jobtui worker` processes of a test app of their own
(tests/apps/outage_app.py, stoppable_app.py): a proxy to cut, the file the
handlers log their events to, and `start`, which starts workers that are all killed when the
test ends (a frozen one too). tests/chaos/conftest.py offers them; a test module names its
app in `APP` and makes its own `db` with the app's tables:

    APP = "tests.apps.outage_app:jobs"
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg
import pytest

from tests.proxy import Proxy
from tests.workers import WorkerProcess

LEASE = 2.0
Start = Callable[..., WorkerProcess]


class Attempt(Protocol):
    """An attempt as its handler's events show it: when it started, and when it surely ran no
    more (None: not known to have stopped)."""

    @property
    def started(self) -> float: ...

    @property
    def stopped(self) -> float | None: ...


A = TypeVar("A", bound=Attempt)


def db_with(tables: str) -> Any:
    """A `db` fixture for a test module: a connection to the test's database, in which
    `tables` (those its app's handlers write) are made."""

    @pytest.fixture
    def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(tables)
            yield conn

    return db


def overlapping(found: list[A]) -> list[tuple[A, A]]:
    """Pairs of attempts that may have run at the same time (one not known to have stopped
    runs on)."""
    pairs = []
    for i, a in enumerate(found):
        for b in found[i + 1 :]:
            a_end = a.stopped if a.stopped is not None else float("inf")
            b_end = b.stopped if b.stopped is not None else float("inf")
            if a.started < b_end and b.started < a_end:
                pairs.append((a, b))
    return pairs


@pytest.fixture
def proxy(server_dsn: str) -> Iterator[Proxy]:
    with Proxy(server_dsn) as through:
        yield through


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events.log"


@pytest.fixture
def start(request: pytest.FixtureRequest, tmp_path: Path, events: Path) -> Iterator[Start]:
    """Start workers of the module's `APP` on a DSN (`lease=`, and `wait=False` not to wait
    for their start line); all killed at the end."""
    app: str = request.module.APP
    started: list[WorkerProcess] = []

    def spawn(name: str, dsn: str, *args: str, lease: float = LEASE, wait: bool = True) -> WorkerProcess:
        env = {**os.environ, "JOBTUI_DSN": dsn, "JOBTUI_TEST_EVENTS": str(events), "PYTHONUNBUFFERED": "1"}
        env.pop("DATABASE_URL", None)
        flags = ["--lease", f"{lease:g}s", "--no-scheduler", "--poll", "0.5s", *args]
        worker = WorkerProcess(name, flags, env, tmp_path / f"{name}.log", app=app)
        started.append(worker)
        if wait:
            worker.wait_started()
        return worker

    try:
        yield spawn
    finally:
        for worker in started:
            if worker.proc.poll() is None:
                os.kill(worker.pid, signal.SIGCONT)  # a frozen worker must die too
            worker.kill()
