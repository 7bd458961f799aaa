"""Fixtures of the integration tests that run real worker processes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.web import write_users
from tests.workers import APP_TABLES, WorkerProcess

APP = "tests.apps.worker_app:jobs"

Conn = psycopg.Connection[Any]
Spawn = Callable[..., WorkerProcess]


@pytest.fixture
def users(tmp_path: Path) -> Path:
    """`jobtui serve`'s users file: alice an operator, bob a viewer."""
    write_users(tmp_path / "users")
    return tmp_path / "users"


@pytest.fixture
def app_dsn(dsn: str) -> str:
    """The test database with the app's tables."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(APP_TABLES)
    return dsn


@pytest.fixture
def db(app_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(app_dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def holder(dsn: str) -> Iterator[Conn]:
    """A connection whose open transaction the test takes locks in; rolled back at the end."""
    with psycopg.connect(dsn) as connection:
        yield connection
        connection.rollback()


@pytest.fixture
def spawn(app_dsn: str, tmp_path: Path) -> Iterator[Spawn]:
    """Start worker processes; every one is killed at the end of the test."""
    started: list[WorkerProcess] = []
    env = {**os.environ, "JOBTUI_DSN": app_dsn, "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)

    def start(name: str, *args: str, lease: str = "2s", wait: bool = True) -> WorkerProcess:
        worker = WorkerProcess(name, ["--lease", lease, *args], env, tmp_path / f"{name}.log", app=APP)
        started.append(worker)
        if wait:
            worker.wait_started()
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()
