"""The heartbeater: extends every lease the worker holds in one statement per interval, and
gives up each lease it could not extend in time. Its answer also names the leases an operator
cancelled: that row is what stops a cancelled job's handler, never a notification alone.

Each job in flight knows until when its lease surely holds: the moment its claim or last
successful heartbeat was sent, plus the lease the database granted from its own now(). The
lease watch needs no database: when that moment (less a margin) passes, the attempt is given
up, so its handler has stopped before any reaper can take the job back: a handler process
is given up `stop_grace` earlier still, the time the worker gives it between SIGTERM and
SIGKILL. After an outage the heartbeat goes first, before claims, reaping, LISTEN and the
scheduler (see link.Link).

A sync handler's thread cannot be stopped: once its attempt was given up (or ran over its
timeout) its lease is still extended, even past its expiry while no one else took the job,
so that the row stays this worker's until the thread returns. Each beat also writes what
runs each job (job.runner: the executor, a child's pid and resident memory) for the
console; a job that started since the last beat gets its first one within REPORT_AFTER.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import psycopg

from jobtui.core.claims import heartbeat_beat_call
from jobtui.kernel.errors import DatabaseUnavailable
from jobtui.kernel.link import Connection, Link
from jobtui.kernel.server import now_call
from jobtui.worker.config import Timing
from jobtui.worker.events import Events
from jobtui.worker.executor import ASYNC, PROCESS, THREAD, InFlight
from jobtui.worker.producer import Denied, round_failed

log = logging.getLogger("jobtui.worker")

# Beats that cancel hints bring are at least this far apart: a flood of forged notifications
# costs each worker at most a few small statements a second.
HINT_GAP = 0.2
# A job running this long without a heartbeat yet gets one early, so that the console can say
# what runs it; at most one such extra beat per REPORT_AFTER.
REPORT_AFTER = 1.0


class Heartbeater:
    def __init__(
        self,
        conn: Connection,
        link: Link,
        schema: str,
        timing: Timing,
        *,
        flights: Callable[[], Iterable[InFlight]],
        give_up: Callable[[InFlight, str, bool], None],
        cancelled: Callable[[int], None],
        denied: Denied,
        events: Events,
    ) -> None:
        self._conn = conn
        self._link = link
        self._schema = schema
        self._lease = timing.lease
        self._interval = timing.heartbeat_interval
        self._margin = timing.margin
        self._stop_grace = timing.stop_grace
        self._events = events
        self._last_beat = 0.0
        self._flights = flights
        self._give_up = give_up
        self._cancelled = cancelled
        self._denied = denied
        self._hinted = asyncio.Event()
        self._last_hinted = 0.0

    def look(self) -> None:
        """Beat soon: a notification hints that a job here was cancelled. Anyone may send one,
        so only the beat's answer, read from the job's row, stops a handler; hints close
        together share a beat, and beats they bring come at most every HINT_GAP."""
        self._hinted.set()

    async def _until_due(self) -> None:
        """Every interval, at once when the database is back after an outage, soon after a
        hint, and early for a job that runs without having been reported yet."""
        link = self._link
        due = time.monotonic() + self._interval
        while not self._hinted.is_set():
            back = asyncio.ensure_future(link.wait_for(lambda: link.heartbeat_due, timeout=self._next_wait(due)))
            waits = [back, asyncio.ensure_future(self._hinted.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
            if back.done() and not back.cancelled() and back.result():
                break  # the database is back
            now = time.monotonic()
            if now >= due or self._report_due(now):
                break
        if self._hinted.is_set():
            await asyncio.sleep(max(0.0, self._last_hinted + HINT_GAP - time.monotonic()))
            self._last_hinted = time.monotonic()
            self._hinted.clear()

    async def run(self) -> None:
        link = self._link
        while True:
            await self._until_due()
            await link.wait(False)
            generation = link.generation
            try:
                await self.beat(answer=link.heartbeat_due)
            except (psycopg.OperationalError, DatabaseUnavailable):
                continue  # the link is down: the heartbeat is due again once the database is back
            except psycopg.Error as exc:
                round_failed(exc, self._denied, "the heartbeat")
                continue
            link.opened(generation)

    async def beat(self, *, answer: bool = False) -> None:
        """Extend every in-flight lease in one statement; give up the ones lost. With
        `answer` (after an outage), the heartbeat's connection answers a statement even with
        no lease to extend: claims wait for it.

        Raises connection errors (the caller waits for the database, then tries again with
        the jobs in flight then, rather than with this statement's).
        """
        now = time.monotonic()
        self._last_beat = now
        flights = [f for f in self._flights() if beats(f, now)]
        if not flights:
            if answer:
                await self._conn.run(now_call(), self._schema, retry=False)
            return
        # Threads given up or over their timeout run on: their leases are kept even if expired.
        keep = [f.claimed.id for f in flights if f.job.marked_lost]
        runners = {f.claimed.id: f.runner() for f in flights}
        call = heartbeat_beat_call([f.claimed.lease for f in flights], self._lease, keep=keep, runners=runners)
        beat, sent = await self._conn.run_timed(call, self._schema, retry=False)
        lease_until = sent + self._lease
        kept = set(keep)
        for flight in flights:
            if flight.writing or flight.gone or (flight.job.marked_lost and flight.executor != THREAD):
                continue  # finished (or given up) while the heartbeat ran
            if flight.job.marked_lost and flight.claimed.id not in kept:
                # Given up while this statement waited (through an outage, say): it did not
                # ask to keep the expired lease, so its answer says nothing; the next one will.
                continue
            if flight.claimed.id in beat.held:
                flight.lease_until = lease_until
                flight.reported = True
                if flight.child is not None:  # a handler process gives itself up by then too
                    flight.child.extend(lease_until - self._margin)
            elif flight.claimed.id in beat.cancelled:
                # The cancel notification was lost (or is late): the answer says it instead.
                self._cancelled(flight.claimed.id)
            else:
                self._give_up(flight, "its lease was lost (expired, reaped, killed or cancelled)", True)
        if self._events.watched:
            self._events.tell("heartbeat", beat.held)

    def _next_wait(self, due: float) -> float:
        """Until the next look: the regular beat, or a job to report; at most REPORT_AFTER."""
        now = time.monotonic()
        waiting = [f.started for f in self._flights() if not f.reported and beats(f, now)]
        if waiting:
            due = min(due, max(min(waiting), self._last_beat) + REPORT_AFTER)
        return max(0.0, min(due - now, REPORT_AFTER))

    def _report_due(self, now: float) -> bool:
        if now < self._last_beat + REPORT_AFTER:
            return False
        return any(not f.reported and now >= f.started + REPORT_AFTER and beats(f, now) for f in self._flights())

    async def watch(self) -> None:
        """Give up every lease that was not extended in time."""
        while True:
            now = time.monotonic()
            earliest: float | None = None
            for flight in list(self._flights()):
                if flight.writing or flight.job.marked_lost:
                    continue
                give_up_at = flight.lease_until - self._margin
                if flight.executor == PROCESS:
                    give_up_at -= self._stop_grace
                if now >= give_up_at:
                    ago = now - (flight.lease_until - self._lease)
                    self._give_up(flight, f"its lease was not extended in time (last extended {ago:.1f}s ago)", False)
                elif earliest is None or give_up_at < earliest:
                    earliest = give_up_at
            wait = 0.5 if earliest is None else earliest - now
            await asyncio.sleep(min(0.5, max(0.02, wait)))


def _nothing(rows: object) -> None:
    return None


def beats(flight: InFlight, now: float) -> bool:
    """Whether the heartbeat extends the flight's lease: while its handler runs and no
    outcome was handed to the writer. An async handler over its timeout gets no more (it
    is being cancelled, and a stuck one must not keep its job); a thread keeps its row until
    it returns, given up or not; a handler process being stopped is gone within its grace."""
    if flight.writing or flight.gone:
        return False
    if flight.executor == THREAD:
        return True
    if flight.job.marked_lost:
        return False
    return flight.executor != ASYNC or flight.deadline is None or now < flight.deadline
