"""The listener: LISTENs on the schema's channel and wakes the producer at every insert, and
after every reconnect (notifications may have been missed meanwhile)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ..db import statements
from ..link import Connection, Link

log = logging.getLogger("jobtui.worker")


def subscriber(schema: str) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """What the listener's connection runs whenever it connects."""

    async def subscribe(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(statements(schema)["listen"])

    return subscribe


def listener_connection(dsn: str | None, link: Link, schema: str) -> Connection | None:
    """The listener's connection to `dsn`, or None without one (behind a transaction pooler,
    which would hand the listening session to other clients, only a direct DSN listens).
    It waits for the heartbeat after an outage, as claims do."""
    if dsn is None:
        return None
    return Connection(dsn, "listen", link=link, gated=True, on_connect=subscriber(schema))


async def listen(conn: Connection | None, kick: asyncio.Event, poll_interval: float) -> None:
    """Set `kick` at every notification, until cancelled; without a connection, say once
    that the worker only polls."""
    if conn is None:
        log.info(
            "behind a transaction pooler LISTEN cannot work: polling every %gs "
            "(give --listen-dsn, a direct DSN, for wake-ups on new jobs)",
            poll_interval,
        )
        await asyncio.Event().wait()  # until cancelled, as a listener
        return
    try:
        while True:
            live = await conn.get()
            kick.set()  # notifications may have been missed while disconnected
            try:
                async for _ in live.notifies():
                    kick.set()
            except psycopg.OperationalError as exc:
                conn.lost(exc)
    finally:
        await conn.close()
