"""The application's tests with jobtui.testing: run with JOBTUI_DSN set to a migrated test
database (`jobtui migrate`)."""

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from app import jobs, sent, signup

import jobtui
from jobtui.testing import assert_enqueued, drain, refute_enqueued, run_job

DSN = os.environ["JOBTUI_DSN"]


@pytest.fixture
def conn() -> Iterator[psycopg.Connection[Any]]:
    """A connection in a transaction that the test rolls back: nothing it enqueues stays."""
    with psycopg.connect(DSN) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS app_user (name text PRIMARY KEY)")
        yield connection
        connection.rollback()


def test_signup_enqueues_the_welcome_in_its_transaction(conn: psycopg.Connection[Any]) -> None:
    with jobtui.Client(DSN) as client:
        signup(conn, client, "ada")
    assert_enqueued(conn, "email.welcome", {"name": "ada"})
    refute_enqueued(conn, "email.welcome", {"name": "bob"})


def test_the_handler_runs_on_a_real_job() -> None:
    ran = run_job(jobs, DSN, "email.welcome", {"name": "ada"})
    assert ran.outcome == "complete" and ran.row.status == "done"
    assert "welcome, ada" in sent
    failed = run_job(jobs, DSN, "email.welcome", {"name": ""})
    assert failed.outcome == "permanent" and failed.row.status == "failed"


def test_drain_runs_everything_due() -> None:
    with jobtui.Client(DSN) as client:
        client.enqueue_many([jobtui.NewJob("email.welcome", {"name": n}) for n in ("x", "y")])
    ran = drain(jobs, DSN)
    assert {r.row.payload["name"] for r in ran} >= {"x", "y"}
    assert all(r.outcome == "complete" for r in ran)
