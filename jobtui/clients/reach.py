"""Whether the database answers, as a client (`Client`, `AsyncClient`) sees it, and its pools
of connections from one outage to the next.

A call that finds the database unreachable (a connection refused or reset, a socket gone
silent past its TCP bounds, no connection within the client's timeout) turns the client
down: its pool is dropped, and every call from then on raises DatabaseUnavailable at once,
without waiting on a socket or on the pool. A probe in a thread of its own tries to reach
the database, a new attempt at most every second (link.until_answering, as a worker's link
does); once one runs a statement, the next call opens a new pool. So enqueues work again
within about a second of the database's return after an outage of any length, loud or
silent, where a pool's own reconnect back-off (doubling up to minutes) would keep them
failing long after.

    reach = Reach(dsn, pooler)
    reach.check()                 # DatabaseUnavailable at once while the database is away
    reach.failed(exc)             # a call found it away: True when that turned it down
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from jobtui.kernel.db import DEAD_SOCKET_SECONDS, describe_dsn, first_line
from jobtui.kernel.errors import DatabaseUnavailable
from jobtui.kernel.link import until_answering

log = logging.getLogger("jobtui.client")

# A call waiting for a pooled connection looks this often whether the client turned down
# meanwhile: its pool, dropped, does not tell the calls waiting in its check loop.
WAIT_SLICE = 0.1


class Reach:
    """The client's view of the database: up, or down since when and why; thread-safe."""

    def __init__(self, dsn: str, pooler: str | None, within: float = DEAD_SOCKET_SECONDS) -> None:
        self.dsn = dsn
        self.pooler = pooler
        self.within = within
        self.generation = 0  # how many times the database came back: a pool serves one
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._why = ""
        self._closed = threading.Event()
        self._probe: threading.Thread | None = None

    @property
    def up(self) -> bool:
        return self._down_since is None

    def check(self) -> None:
        """Raise DatabaseUnavailable at once while the database is unreachable."""
        since = self._down_since
        if since is not None:
            raise DatabaseUnavailable(
                f"cannot reach PostgreSQL at {describe_dsn(self.dsn)} ({self._why}; not answering for "
                f"{time.monotonic() - since:.1f}s, retried in the background every second); "
                "check that the server runs and --dsn / JOBTUI_DSN is right"
            )

    def failed(self, exc: BaseException) -> bool:
        """A call found the database unreachable; True when that turned the client down
        (its caller drops the pool), False when it was down already."""
        with self._lock:
            if self._down_since is not None or self._closed.is_set():
                return False
            self._down_since = time.monotonic()
            self._why = first_line(exc)
            log.warning("cannot reach PostgreSQL (%s): client calls fail at once until it answers", self._why)
            self._probe = threading.Thread(target=self._until_back, name="jobtui-client-probe", daemon=True)
            self._probe.start()
            return True

    def _until_back(self) -> None:
        back = asyncio.run(
            until_answering(self.dsn, pooler=self.pooler, within=self.within, stopped=self._closed.is_set)
        )
        with self._lock:
            since, self._down_since = self._down_since, None
            self.generation += 1
        if back and since is not None:
            log.warning("PostgreSQL answers again after %.1fs", time.monotonic() - since)

    def close(self) -> None:
        """Stop the probe (the client is closing)."""
        self._closed.set()
        probe = self._probe
        if probe is not None and probe is not threading.current_thread():
            probe.join(5)


def reporting_connection(failed: Callable[[BaseException], None]) -> type[psycopg.Connection[Any]]:
    """A connection class for a sync pool whose failed connection attempts `failed` hears:
    the pool itself only retries them, with its back-off, while callers wait."""

    class Reporting(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().connect(*args, **kwargs)
            except psycopg.OperationalError as exc:
                failed(exc)
                raise

    return Reporting


def reporting_async_connection(failed: Callable[[BaseException], None]) -> type[psycopg.AsyncConnection[Any]]:
    """`reporting_connection` for an async pool."""

    class Reporting(psycopg.AsyncConnection[Any]):
        @classmethod
        async def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                return await super().connect(*args, **kwargs)
            except psycopg.OperationalError as exc:
                failed(exc)
                raise

    return Reporting
