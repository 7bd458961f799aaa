"""The pool of handler processes (jobtui/worker/children.py) on its own: real template and
child processes running the stoppable app's handlers, driven by a test that chooses the
moment the pool looks at their memory. No database: the pool never touches one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jobtui.domain import ClaimedJob
from jobtui.registry import Job
from jobtui.worker.child import Settings
from jobtui.worker.children import ChildPool, resident_bytes
from jobtui.worker.executor import PROCESS, InFlight
from tests.chaos.test_stoppable import alive, runs

APP = "tests.apps.stoppable_app:jobs"
_ids = iter(range(1, 1 << 30))


def attempt(type_: str, payload: dict[str, Any]) -> InFlight:
    """A claimed job as a worker hands it to its pool, its lease good for a minute."""
    now = datetime.now(UTC)
    claimed = ClaimedJob(next(_ids), type_, payload, 1, 1, 1, now, now, now)
    started = time.monotonic()
    return InFlight(Job(claimed, "P", "jobtui"), claimed, started, None, started + 60.0, executor=PROCESS)


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events.log"
    monkeypatch.setenv("JOBTUI_TEST_EVENTS", str(path))  # read by the handlers, in the children
    return path


@pytest.fixture
async def pool(events: Path) -> AsyncIterator[ChildPool]:
    children = ChildPool(Settings(APP, "jobtui", "P"), grace=1.0)
    await children.open()
    try:
        yield children
    finally:
        await children.close()


def wait_blocking(condition: Any, timeout: float, what: str) -> None:
    """Poll `condition` while the event loop is held: the pool sees nothing meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.01)


async def test_a_child_stopped_for_its_memory_as_its_job_returned_takes_no_other_job(
    pool: ChildPool, events: Path
) -> None:
    """The job returned just as the pool found its process over the limit: its outcome
    stands, and that process, being stopped, is never handed the next job."""
    [child] = pool.children
    baseline = resident_bytes(child.pid)
    assert baseline is not None
    # Set after open(): the pool's own periodic look is not running, the test looks instead.
    pool.max_memory = limit = baseline + (64 << 20)

    first = attempt("hog.brief", {"mib": 128, "linger": 0.5})
    running = asyncio.create_task(pool.run(first, None))
    while not child.busy:
        await asyncio.sleep(0)
    # From here the loop is held: the job's outcome reaches the pool only once it runs again.
    wait_blocking(lambda: any(r.ended for r in runs(events, first.job.id)), 10, "the handler to return")
    time.sleep(0.05)  # its outcome is on the socket
    over = resident_bytes(child.pid)
    assert over is not None and over > limit, (over, limit)
    pool._check_memory()  # over the limit, its job seemingly still running
    time.sleep(0.6)  # its memory is freed: between jobs it would be under the limit
    result = await asyncio.wait_for(running, 10)
    assert (result.outcome, result.error) == ("complete", "")
    assert pool.counts.killed == {"memory": 1}

    second = attempt("sleeper", {"seconds": 0})
    result = await asyncio.wait_for(pool.run(second, None), 10)
    assert (result.outcome, result.error) == ("complete", ""), result
    [run] = runs(events, second.job.id)
    assert run.pid != child.pid
    await asyncio.wait_for(child.gone.wait(), 5)
    assert not alive(child.pid)
    assert (pool.counts.started, dict(pool.counts.died), dict(pool.counts.recycled)) == (2, {}, {})
