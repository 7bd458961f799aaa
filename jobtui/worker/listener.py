"""The listener: LISTENs on the schema's channel and wakes the producer at every insert, and
after every reconnect (notifications may have been missed meanwhile)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ..db import statements
from ..link import Connection


def subscriber(schema: str) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """What the listener's connection runs whenever it connects."""

    async def subscribe(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(statements(schema)["listen"])

    return subscribe


async def listen(conn: Connection, kick: asyncio.Event) -> None:
    """Set `kick` at every notification, until cancelled."""
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
