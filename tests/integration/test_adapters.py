"""`conn=` with SQLAlchemy and Django: the job commits or rolls back with the application's
rows, against real PostgreSQL with each library installed; the examples the docs show run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from jobtui import AsyncClient, Client, InvalidInput, NewJob

ROOT = Path(__file__).resolve().parents[2]


def _jobs(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        return [(str(r[0]), str(r[1])) for r in conn.execute("SELECT type, payload->>'n' FROM jobtui.job ORDER BY id")]


def test_sqlalchemy_session_and_connection_share_the_transaction(dsn: str) -> None:
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    with Client(dsn) as queue:
        with Session(engine) as session:
            queue.enqueue("s", {"n": "session-rolled-back"}, conn=session)
            session.rollback()
        with Session(engine) as session, session.begin():
            queue.enqueue("s", {"n": "session"}, conn=session)
        with engine.connect() as conn:
            queue.enqueue_many([NewJob("c", {"n": "many-rolled-back"})], conn=conn)
            conn.rollback()
            queue.enqueue_many([NewJob("c", {"n": "many"})], conn=conn)
            # Inside the transaction, before commit, another connection sees nothing yet.
            assert _jobs(dsn) == [("s", "session")]
            conn.commit()
    assert _jobs(dsn) == [("s", "session"), ("c", "many")]
    engine.dispose()


async def test_sqlalchemy_async_connection(dsn: str) -> None:
    async def connect() -> psycopg.AsyncConnection[tuple[object, ...]]:
        return await psycopg.AsyncConnection.connect(dsn)

    engine = create_async_engine("postgresql+psycopg://", async_creator=connect)
    async with AsyncClient(dsn) as queue, engine.connect() as conn:
        await queue.enqueue("a", {"n": "rolled-back"}, conn=conn)
        await conn.rollback()
        # Nothing but the job in this transaction: it must commit all the same.
        await queue.enqueue("a", {"n": "kept"}, conn=conn)
        await conn.commit()
    await engine.dispose()
    assert _jobs(dsn) == [("a", "kept")]


def test_a_connection_of_another_kind_is_one_clear_error(dsn: str) -> None:
    with Client(dsn) as queue, pytest.raises(InvalidInput, match="conn= takes a psycopg connection"):
        queue.enqueue("x", {}, conn=object())
    engine = create_engine("sqlite://")
    with engine.connect() as conn, Client(dsn) as queue, pytest.raises(InvalidInput, match="psycopg 3"):
        queue.enqueue("x", {}, conn=conn)


@pytest.mark.parametrize("example", ["sqlalchemy_enqueue.py", "django_enqueue.py"])
def test_the_examples_run(dsn: str, example: str) -> None:
    env = {**os.environ, "JOBTUI_DSN": dsn}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example)], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("kept job ")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT array_agg(name ORDER BY name) FROM app_user").fetchone() == (["ada"],)
        assert conn.execute("SELECT count(*) FROM jobtui.job").fetchone() == (1,)
