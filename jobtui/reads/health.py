"""Whether a worker or a scheduler is alive and whether it is ready: what /healthz and /readyz
answer on its metrics port (endpoints.py), and `jobtui health` reads.

    health = Health("jobtui")
    worker = Worker(jobs, dsn, health=health)     # the worker runs health.watch(...) on its loop
    health.live(), health.ready()                 # from any thread: Verdict(ok, text)

Liveness is the process's event loop answering: it stays true through a database outage,
since restarting a process does not bring a database back. Readiness is the database
answering through the process's own link (the connections its work uses, after the heartbeat
went), with every migration of this code applied (as the worker checks before it starts;
a newer schema fits too), and the process not draining. A probe
statement runs every PROBE_EVERY; readiness goes false once the last answer is older than
ANSWER_WITHIN, however the database went away (a refused connection fails at once, a silent
network only by that age), and true at the first answer after it is back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

import psycopg

from jobtui.kernel.db import first_line
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import DatabaseUnavailable
from jobtui.kernel.link import Connection, Link
from jobtui.kernel.migrate import Migration, available, lacking, versions_call
from jobtui.kernel.timeouts import wait_event

log = logging.getLogger("jobtui.health")

PROBE_EVERY = 1.0
# Readiness needs an answer this recent: with a probe every second, a database that stops
# answering turns readiness false within 3 s.
ANSWER_WITHIN = 2.5
# How long /healthz waits for the event loop to run a callback.
LOOP_ANSWER_WITHIN = 2.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """A probe's answer: whether it passes, and one line saying why."""

    ok: bool
    text: str


class Health:
    """The state behind the probes of one process, written on its event loop and read from
    the HTTP listener's threads (plain values: each read sees a whole one)."""

    def __init__(self, schema: str = DEFAULT_SCHEMA, *, needs: list[Migration] | None = None) -> None:
        self.schema = schema
        self.needs = available() if needs is None else needs  # the migrations this code needs applied
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link: Link | None = None
        self._stopping: asyncio.Event | None = None
        self._answered_at: float | None = None  # monotonic time of the last probe's answer
        self._applied: set[int] | None = None  # the applied migrations; None: no migration table
        self._started = time.monotonic()
        self._failed: str | None = None  # the probe's last error, logged once

    # -- read from any thread ------------------------------------------------------------

    def live(self, wait: float = LOOP_ANSWER_WITHIN) -> Verdict:
        """Whether the event loop runs a callback within `wait` seconds."""
        loop = self._loop
        if loop is None:
            return Verdict(True, f"alive: starting for {time.monotonic() - self._started:.0f}s")
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop is closed: the process is on its way out
            return Verdict(False, "not alive: the event loop has stopped")
        if answered.wait(wait):
            return Verdict(True, "alive")
        return Verdict(False, f"not alive: the event loop did not answer within {wait:g}s")

    def ready(self) -> Verdict:
        """Whether the process can do its work now, and why not."""
        if self._loop is None:
            return Verdict(False, f"not ready: starting for {time.monotonic() - self._started:.0f}s")
        stopping = self._stopping
        if stopping is not None and stopping.is_set():
            return Verdict(False, "not ready: draining (stopping after the jobs in flight)")
        now = time.monotonic()
        link = self._link
        if link is not None and not link.up and link.down_since is not None:
            return Verdict(False, f"not ready: the database is not answering (for {now - link.down_since:.1f}s)")
        answered = self._answered_at
        if answered is None:
            return Verdict(False, "not ready: waiting for the database's first answer")
        age = now - answered
        if age > ANSWER_WITHIN:
            return Verdict(False, f"not ready: the database is not answering (last answer {age:.1f}s ago)")
        applied = self._applied
        version = None if applied is None else max(applied, default=0)
        todo = [m for m in self.needs if applied is None or m.version not in applied]
        if version is None or todo:
            return Verdict(False, f"not ready: {lacking(self.schema, version, todo)}: run `jobtui migrate`")
        return Verdict(True, f"ready: the database answered {age:.1f}s ago; schema {self.schema!r} is at {version}")

    # -- on the process's event loop -----------------------------------------------------

    def attach(self, stopping: asyncio.Event) -> None:
        """The process runs on this loop from now; `stopping` set means draining."""
        self._loop = asyncio.get_running_loop()
        self._stopping = stopping

    async def watch(self, conn: Connection, stopping: asyncio.Event) -> None:
        """Probe the database through `conn`, a connection on the process's link, every
        PROBE_EVERY until `stopping` is set. A probe stuck on a silent network is left to
        finish (cancelling it would wait on that network too): readiness reads its age."""
        self.attach(stopping)
        self._link = conn.link
        probe: asyncio.Task[None] | None = None
        try:
            while not stopping.is_set():
                if probe is None or probe.done():
                    probe = asyncio.create_task(self._probe(conn, stopping), name="jobtui-health-probe")
                await wait_event(stopping, PROBE_EVERY)
        finally:
            if probe is not None and not probe.done():
                probe.cancel()
            await conn.close()

    async def _probe(self, conn: Connection, stopping: asyncio.Event) -> None:
        try:
            applied = await conn.run(versions_call(), self.schema, stopping, retry=False)
        except (psycopg.OperationalError, DatabaseUnavailable):
            return  # the connection told the link; readiness says so
        except psycopg.Error as exc:  # the schema or its migration table is gone, a privilege revoked
            if first_line(exc) != self._failed:
                log.warning("readiness probe failed: %s", first_line(exc))
                self._failed = first_line(exc)
            self._applied = None
            self._answered_at = time.monotonic()
            return
        self._failed = None
        self._applied = applied
        self._answered_at = time.monotonic()
