"""The heartbeater: extends every lease the worker holds in one statement per interval, and
gives up each lease it could not extend in time. Its answer also names the leases an operator
cancelled: that row is what stops a cancelled job's handler, never a notification alone.

Each job in flight knows until when its lease surely holds: the moment its claim or last
successful heartbeat was sent, plus the lease the database granted from its own now(). The
lease watch needs no database: when that moment (less a margin) passes, the attempt is given
up, so its handler has stopped before any reaper can take the job back. After an outage the
heartbeat goes first, before claims, reaping, LISTEN and the scheduler (see link.Link).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import psycopg

from ..db import first_line
from ..errors import DatabaseUnavailable
from ..link import Connection, Link
from ..queue import heartbeat_beat_call
from .executor import InFlight
from .producer import Denied

log = logging.getLogger("jobtui.worker")

# Beats that cancel hints bring are at least this far apart: a flood of forged notifications
# costs each worker at most a few small statements a second.
HINT_GAP = 0.2


class Heartbeater:
    def __init__(
        self,
        conn: Connection,
        link: Link,
        schema: str,
        *,
        lease: float,
        interval: float,
        margin: float,
        flights: Callable[[], Iterable[InFlight]],
        give_up: Callable[[InFlight, str], None],
        cancelled: Callable[[int], None],
        denied: Denied,
    ) -> None:
        self._conn = conn
        self._link = link
        self._schema = schema
        self._lease = lease
        self._interval = interval
        self._margin = margin
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
        """Every interval, at once when the database is back after an outage, and soon after
        a hint."""
        link = self._link
        waits = [
            asyncio.ensure_future(link.wait_for(lambda: link.heartbeat_due, timeout=self._interval)),
            asyncio.ensure_future(self._hinted.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
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
                await self.beat()
            except (psycopg.OperationalError, DatabaseUnavailable):
                continue  # the link is down: the heartbeat is due again once the database is back
            except psycopg.errors.InsufficientPrivilege as exc:
                self._denied(exc, "the heartbeat")
                continue
            except psycopg.Error as exc:
                log.warning("heartbeat failed: %s", first_line(exc))
                continue
            link.opened(generation)

    async def beat(self) -> None:
        """Extend every in-flight lease in one statement; give up the ones lost.

        Raises connection errors (the caller waits for the database, then tries again with
        the jobs in flight then, rather than with this statement's).
        """
        now = time.monotonic()
        # A job over its timeout gets no more heartbeats: its lease may expire and be reaped.
        flights = [
            f for f in self._flights() if not f.job.lost and not f.writing and (f.deadline is None or now < f.deadline)
        ]
        if not flights:
            return
        beat, sent = await self._conn.run_timed(
            heartbeat_beat_call([f.claimed.lease for f in flights], self._lease), self._schema, retry=False
        )
        lease_until = sent + self._lease
        for flight in flights:
            if flight.writing or flight.job.lost:
                continue  # finished (or given up) while the heartbeat ran
            if flight.claimed.id in beat.held:
                flight.lease_until = lease_until
            elif flight.claimed.id in beat.cancelled:
                # The cancel notification was lost (or is late): the answer says it instead.
                self._cancelled(flight.claimed.id)
            else:
                self._give_up(flight, "its lease was lost (expired, reaped, killed or cancelled)")

    async def watch(self) -> None:
        """Give up every lease that was not extended in time."""
        while True:
            now = time.monotonic()
            earliest: float | None = None
            for flight in list(self._flights()):
                if flight.writing or flight.job.lost:
                    continue
                give_up_at = flight.lease_until - self._margin
                if now >= give_up_at:
                    ago = now - (flight.lease_until - self._lease)
                    self._give_up(flight, f"its lease was not extended in time (last extended {ago:.1f}s ago)")
                elif earliest is None or give_up_at < earliest:
                    earliest = give_up_at
            wait = 0.5 if earliest is None else earliest - now
            await asyncio.sleep(min(0.5, max(0.02, wait)))
