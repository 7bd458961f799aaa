"""What `conn=` takes besides a psycopg connection: a SQLAlchemy `Connection` or `Session`
(2.x, on the psycopg 3 driver) and a Django connection (its psycopg 3 backend), unwrapped
to the psycopg connection under them, so that a job commits or rolls back with the
application's own rows. Neither library is imported unless such an object is passed.

    with Session(engine) as session, session.begin():
        session.add(User(name="ada"))
        client.enqueue("email.welcome", {"name": "ada"}, conn=session)
"""

from __future__ import annotations

from typing import Any

import psycopg

from jobtui.kernel.errors import InvalidInput

TAKES = "conn= takes a psycopg connection, a SQLAlchemy Connection or Session, or a Django connection"


def _library(conn: object) -> str:
    return type(conn).__module__.partition(".")[0]


def sync_connection(conn: object) -> psycopg.Connection[Any]:
    """The psycopg connection under `conn`, in the transaction `conn` is in."""
    if isinstance(conn, psycopg.Connection):
        return conn
    library = _library(conn)
    raw: object = None
    if library == "sqlalchemy":
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session

        if isinstance(conn, Session):
            conn = conn.connection()  # begins the session's transaction when none is open
        if isinstance(conn, Connection):
            # SQLAlchemy commits only a transaction it knows it began: a statement run on the
            # driver's connection alone would be rolled back when the connection goes back.
            if not conn.in_transaction():
                conn.begin()
            raw = conn.connection.driver_connection
    elif library == "django":
        ensure = getattr(conn, "ensure_connection", None)
        if callable(ensure):
            ensure()
            raw = getattr(conn, "connection", None)
    else:
        raise InvalidInput(f"{TAKES}; got a {type(conn).__name__}")
    if not isinstance(raw, psycopg.Connection):
        raise InvalidInput(
            f"{TAKES}; this {library} {type(conn).__name__} does not run on psycopg 3 "
            "(SQLAlchemy: a postgresql+psycopg:// URL; Django: the postgresql backend with psycopg 3 installed)"
        )
    return raw


async def async_connection(conn: object) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection under `conn`: itself, or a SQLAlchemy `AsyncConnection`
    or `AsyncSession` on the psycopg driver."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    raw: object = None
    if _library(conn) == "sqlalchemy":
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(conn, AsyncSession):
            conn = await conn.connection()
        if isinstance(conn, AsyncConnection):
            if not conn.in_transaction():  # see sync_connection
                await conn.begin()
            raw = (await conn.get_raw_connection()).driver_connection
    if not isinstance(raw, psycopg.AsyncConnection):
        raise InvalidInput(
            "the async client's conn= takes a psycopg AsyncConnection, or a SQLAlchemy AsyncConnection or "
            f"AsyncSession on the psycopg driver; got a {type(conn).__name__}"
        )
    return raw
