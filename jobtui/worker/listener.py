"""The listener: LISTENs on the schema's channel and wakes the producers at every insert, and
after every reconnect (notifications may have been missed meanwhile). A notification
`cancel <id>` says an operator cancelled a running job: its worker stops the handler."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ..db import statements
from ..link import Connection

_CANCEL = re.compile(r"cancel ([0-9]{1,19})")


def subscriber(schema: str) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """What the listener's connection runs whenever it connects."""

    async def subscribe(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(statements(schema)["listen"])

    return subscribe


def cancelled_job(payload: str) -> int | None:
    """The job id of a cancel notification's payload, or None for any other payload."""
    match = _CANCEL.fullmatch(payload)
    return int(match.group(1)) if match else None


async def listen(conn: Connection, wake: Callable[[], None], cancel: Callable[[int], None]) -> None:
    """Call `wake` at every notification and `cancel` at every cancel, until cancelled."""
    try:
        while True:
            live = await conn.get()
            wake()  # notifications may have been missed while disconnected
            try:
                async for note in live.notifies():
                    job_id = cancelled_job(note.payload)
                    if job_id is not None:
                        cancel(job_id)
                    else:
                        wake()
            except psycopg.OperationalError as exc:
                conn.lost(exc)
    finally:
        await conn.close()
