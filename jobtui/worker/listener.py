"""The listener: LISTENs on the schema's channel and wakes the producers at every insert, and
after every reconnect (notifications may have been missed meanwhile). A notification
`cancel <id>` hints that an operator cancelled a running job, and `fleet <id>` that an
operator gave process <id> of the fleet an order. PostgreSQL checks no privilege for NOTIFY, so
a hint only makes the worker read a row (the job's, heartbeater.look; its own in the fleet,
fleet.Presence.look), and the row alone decides."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from jobtui.core import claims
from jobtui.kernel.link import Connection, Link

log = logging.getLogger("jobtui.worker")

_CANCEL = re.compile(r"cancel ([0-9]{1,19})")
_FLEET = re.compile(r"fleet ([0-9]{1,19})")


def subscriber(schema: str) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """What the listener's connection runs whenever it connects."""

    async def subscribe(conn: psycopg.AsyncConnection[Any]) -> None:
        await claims.subscribe(conn, schema)

    return subscribe


def listener_connection(dsn: str | None, link: Link, schema: str) -> Connection | None:
    """The listener's connection to `dsn`, or None without one (behind a transaction pooler,
    which would hand the listening session to other clients, only a direct DSN listens).
    It waits for the heartbeat after an outage, as claims do."""
    if dsn is None:
        return None
    return Connection(dsn, "listen", link=link, gated=True, on_connect=subscriber(schema))


def cancelled_job(payload: str) -> int | None:
    """The job id of a cancel notification's payload, or None for any other payload."""
    match = _CANCEL.fullmatch(payload)
    return int(match.group(1)) if match else None


def ordered_process(payload: str) -> int | None:
    """The fleet row of an order's notification, or None for any other payload."""
    match = _FLEET.fullmatch(payload)
    return int(match.group(1)) if match else None


async def listen(
    conn: Connection | None,
    wake: Callable[[], None],
    cancel: Callable[[int], None],
    poll_interval: float,
    fleet: Callable[[int], None] = lambda row: None,
) -> None:
    """Call `wake` at every notification, `cancel` at every cancel hint and `fleet` at every
    order's hint, until cancelled; without a connection, say once that the worker only polls
    (cancels then reach it with the heartbeats' answers, orders with its fleet refresh)."""
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
            wake()  # notifications may have been missed while disconnected
            try:
                async for note in live.notifies():
                    job_id = cancelled_job(note.payload)
                    row = None if job_id is not None else ordered_process(note.payload)
                    if job_id is not None:
                        cancel(job_id)
                    elif row is not None:
                        fleet(row)
                    else:
                        wake()
            except psycopg.OperationalError as exc:
                conn.lost(exc, live)
    finally:
        await conn.close()
