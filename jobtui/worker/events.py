"""What the worker's parts did, told to whoever waits: tests wait on these instead of
sleeping and hoping.

    seen = worker.events.expect("completed", ids=[job_id])   # before what makes it happen
    client.enqueue(...)
    await seen.wait(10)                                        # TimeoutError naming what is missing

The parts tell every event (`claimed`, `idle`, `heartbeat`, `completed`, `failed`, `dead`,
`released`, `lost`, `reap round`, `reaped`, each with job ids), but only after checking
`watched`: with nobody waiting, telling costs one attribute read in the claim and outcome
paths. Not public API.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Iterable

from jobtui.kernel.timeouts import within

# What an outcome written tells (outcome.Outcome's value): completed, failed (counted, retried
# or dead), released (back to ready, uncounted).
OUTCOME_EVENTS = {
    "complete": "completed",
    "permanent": "failed",
    "fail": "failed",
    "timeout": "failed",
    "retry": "released",
    "db_error": "released",
    "abandoned": "released",
    "shutdown": "released",
}


class Expectation:
    """Events of one kind, awaited: done once `count` of them came, or every id of `ids`."""

    def __init__(self, events: Events, kind: str, ids: Collection[int] | None, count: int) -> None:
        self._events = events
        self.kind = kind
        self.missing = set(ids) if ids is not None else None
        self.left = count
        self.seen: list[int] = []  # the ids the awaited events carried
        self._done = threading.Event()  # the worker may run on a loop in another thread
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def _saw(self, kind: str, ids: Iterable[int]) -> None:
        if kind != self.kind:
            return
        ids = list(ids)
        self.seen.extend(ids)
        if self.missing is not None:
            self.missing.difference_update(ids)
            done = not self.missing
        else:
            self.left -= 1
            done = self.left <= 0
        if done:
            self._events.forget(self)
            self._done.set()
            for loop, future in self._futures:
                loop.call_soon_threadsafe(_settle, future)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait_blocking(self, timeout: float) -> list[int]:
        """Block this thread until done; the ids seen. TimeoutError saying what did not come."""
        if not self._done.wait(timeout):
            self._events.forget(self)
            raise TimeoutError(self._why(timeout))
        return self.seen

    async def wait(self, timeout: float) -> list[int]:
        """`wait_blocking` for a coroutine: the worker's loop goes on meanwhile."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._futures.append((loop, future))
        if self._done.is_set():  # done before the future was there to be told
            _settle(future)
        try:
            await within(future, timeout)
        except TimeoutError:
            self._events.forget(self)
            raise TimeoutError(self._why(timeout)) from None
        return self.seen

    def _why(self, timeout: float) -> str:
        if self.missing is not None:
            return f"no {self.kind!r} event for job(s) {sorted(self.missing)} within {timeout}s"
        return f"{self.left} {self.kind!r} event(s) still missing after {timeout}s"


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Events:
    """The worker's events, passed to the parts; tests `expect` them."""

    def __init__(self) -> None:
        self._expected: list[Expectation] = []
        self._lock = threading.Lock()
        self.watched = False  # checked by the parts before they build an event's ids

    def expect(self, kind: str, ids: Collection[int] | None = None, count: int = 1) -> Expectation:
        """Start watching for `kind` now (before doing what makes it happen)."""
        expectation = Expectation(self, kind, ids, count)
        with self._lock:
            self._expected.append(expectation)
            self.watched = True
        return expectation

    def forget(self, expectation: Expectation) -> None:
        with self._lock:
            if expectation in self._expected:
                self._expected.remove(expectation)
            self.watched = bool(self._expected)

    def tell(self, kind: str, ids: Iterable[int] = ()) -> None:
        """Event `kind` happened for `ids`; callers check `watched` first."""
        with self._lock:
            expected = list(self._expected)
        ids = list(ids)
        for expectation in expected:
            expectation._saw(kind, ids)
