"""The pool of handler processes (jobtui/worker/children.py) on its own: real template and
child processes running the stoppable app's handlers, driven by a test that chooses the
moment the pool looks at their memory. No database: the pool never touches one.
"""

from __future__ import annotations

import asyncio
import select
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jobtui.core.registry import Job
from jobtui.kernel.domain import ClaimedJob
from jobtui.worker.child import Settings
from jobtui.worker.children import ENDED_ITSELF, ChildDied, ChildEndedItself, ChildPool, resident_bytes
from jobtui.worker.executor import PROCESS, InFlight, run_handler
from jobtui.worker.outcome import Outcome
from tests.chaos.test_stoppable import alive, runs
from tests.waits import until, wait_until

APP = "tests.apps.stoppable_app:jobs"
_ids = iter(range(1, 1 << 30))


def attempt(type_: str, payload: dict[str, Any], lease: float = 60.0) -> InFlight:
    """A claimed job as a worker hands it to its pool, its lease good for `lease` seconds."""
    now = datetime.now(UTC)
    claimed = ClaimedJob(next(_ids), type_, payload, 1, 1, 1, now, now, now)
    started = time.monotonic()
    return InFlight(Job(claimed, "P", "jobtui"), claimed, started, None, started + lease, executor=PROCESS)


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
    await until(lambda: child.busy, 10, "the child busy with the job")
    # From here the loop is held: the job's outcome reaches the pool only once it runs again.
    # (wait_until blocks this thread, so the loop stays held: the pool sees nothing meanwhile.)
    wait_until(lambda: any(r.ended for r in runs(events, first.job.id)), 10, "the handler to return")
    # Its outcome is on the socket, unread while the loop is held.
    readable, _, _ = select.select([child.writer.get_extra_info("socket").fileno()], [], [], 10)
    assert readable, "the child's outcome never came"
    over = resident_bytes(child.pid)
    assert over is not None and over > limit, (over, limit)
    pool._check_memory()  # over the limit, its job seemingly still running
    # Its memory is freed: between jobs it would be under the limit.
    wait_until(lambda: (resident_bytes(child.pid) or 0) < limit, 10, "the child's memory freed")
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


async def test_a_child_that_ends_itself_at_its_leases_deadline_says_so(pool: ChildPool, events: Path) -> None:
    """Nothing extends the lease here, as when the worker is frozen: the child kills itself
    at the deadline, and the pool tells that death from the OOM killer's SIGKILL."""
    flight = attempt("sleeper", {"seconds": 30}, lease=1.0)
    with pytest.raises(ChildDied) as died:
        await asyncio.wait_for(pool.run(flight, None), 10)
    assert isinstance(died.value, ChildEndedItself) and str(died.value) == ENDED_ITSELF
    assert str(died.value) == (
        "ProcessDied: handler process ended itself at its lease's deadline: its worker did not answer"
    )
    [run] = runs(events, flight.job.id)
    assert run.ended is None and not alive(run.pid)
    assert (dict(pool.counts.died), dict(pool.counts.killed)) == ({"deadline": 1}, {})
    # The pool runs on with a new child.
    again = attempt("sleeper", {"seconds": 0})
    result = await asyncio.wait_for(pool.run(again, None), 10)
    assert result.outcome == "complete" and runs(events, again.job.id)[0].pid != run.pid


async def test_an_attempt_whose_child_ended_itself_is_released_uncounted(pool: ChildPool, events: Path) -> None:
    """The child ended at its lease's deadline because the worker did not extend the lease:
    the lease failed, not the job, so the executor hands the attempt back uncounted."""
    from tests.apps.stoppable_app import jobs

    flight = attempt("sleeper", {"seconds": 30}, lease=1.0)
    handler = jobs.handlers["sleeper"]
    outcome, error, delay = await asyncio.wait_for(run_handler(handler, flight, lambda h, j: 5.0, pool), 10)
    assert (outcome, delay) == (Outcome.ABANDONED, 0.0)
    assert error == f"attempt given up: {ENDED_ITSELF}"
    assert flight.job.lost
