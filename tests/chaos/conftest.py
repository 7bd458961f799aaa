"""Fixtures of the chaos tests: a test database with the chaos app's tables, and processes
(workers, schedulers) that are all killed when the test ends, whatever happened."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.apps.chaos_app import APP_TABLES
from tests.chaos.app_workers import events, proxy, start  # noqa: F401 (fixtures offered here)
from tests.chaos.harness import Procs, child_env


@pytest.fixture
def chaos_dsn(dsn: str) -> str:
    """The test's own migrated database, with the tables the chaos handlers write."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(APP_TABLES)
    return dsn


@pytest.fixture
def db(chaos_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(chaos_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def procs(chaos_dsn: str, tmp_path: Path) -> Iterator[Procs]:
    """Start `python -m jobtui.cli ...` processes on the test database; all killed at the end."""
    started = Procs(tmp_path, child_env(chaos_dsn))
    try:
        yield started
    finally:
        started.close()
