"""Helpers for the tests of applications that use jobtui, against a real test database.

    def test_signup_enqueues_the_welcome(conn):            # a psycopg connection, in a transaction
        signup(conn, "ada")                                 # the app's code, enqueueing with conn=
        assert_enqueued(conn, "email.welcome", {"name": "ada"})

    def test_welcome_handler(dsn):
        ran = run_job(app.jobs, dsn, "email.welcome", {"name": "ada"})
        assert ran.outcome == "complete" and ran.row.status == "done"

    def test_everything_queued_runs(dsn):
        drain(app.jobs, dsn)                                # every due job, one at a time, here

`run_job` and `drain` claim real rows and write real outcomes, through the handler's
middleware, as a worker would, but in the calling code: no worker, no threads left behind,
no waiting for a poll. Their `a`-prefixed twins are for async tests.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jobtui.clients.client import Client
from jobtui.core import jobs
from jobtui.core.claims import claim_call
from jobtui.core.middleware import prepared
from jobtui.core.registry import Handler, Job, Jobs
from jobtui.kernel.backoff import delay as backoff_delay
from jobtui.kernel.domain import DEFAULT_SCHEMA, ClaimedJob, Failure, JobRow
from jobtui.kernel.errors import InvalidInput
from jobtui.worker.executor import InFlight, run_handler
from jobtui.worker.outcome import Outcome

# run_job's job is due before anything a test enqueued, so that the claim takes it first.
FIRST = datetime(1970, 1, 1, tzinfo=UTC)


def enqueued(conn: Any, job_type: str, payload: Any = None, *, schema: str = DEFAULT_SCHEMA) -> list[dict[str, Any]]:
    """The jobs of `job_type` that `conn` sees (its own transaction's included) whose payload
    holds `payload` (JSON containment: the keys given, with these values)."""
    from jobtui.core.adapters import sync_connection

    return jobs.enqueued(sync_connection(conn), job_type, payload, schema)


def assert_enqueued(conn: Any, job_type: str, payload: Any = None, *, schema: str = DEFAULT_SCHEMA) -> dict[str, Any]:
    """The one job of `job_type` with `payload` that `conn` sees; AssertionError naming what
    there is otherwise."""
    found = enqueued(conn, job_type, payload, schema=schema)
    if len(found) != 1:
        others = [j["payload"] for j in enqueued(conn, job_type, schema=schema)][:10]
        raise AssertionError(
            f"expected one {job_type!r} job with payload {payload!r}, found {len(found)}; "
            f"{job_type!r} jobs there: {others}"
        )
    return found[0]


def refute_enqueued(conn: Any, job_type: str, payload: Any = None, *, schema: str = DEFAULT_SCHEMA) -> None:
    found = enqueued(conn, job_type, payload, schema=schema)
    if found:
        raise AssertionError(
            f"expected no {job_type!r} job with payload {payload!r}, found ids {[j['id'] for j in found]}"
        )


@dataclass(frozen=True, slots=True)
class Ran:
    """What became of one attempt: the outcome's name (complete, permanent, fail, timeout,
    retry, db_error), the error text, and the job's row once the outcome was written."""

    outcome: str
    error: str
    row: JobRow


def _handler(jobs: Jobs, job_type: str) -> Handler:
    handler = prepared(jobs).handlers.get(job_type)
    if handler is None:
        raise InvalidInput(f"no handler for job type {job_type!r}; registered: {', '.join(jobs.handlers) or 'none'}")
    return handler


async def _attempt(client: Client, handler: Handler, claimed: ClaimedJob) -> Ran:
    job = Job(claimed, "jobtui.testing", client.schema)
    flight = InFlight(job, claimed, time.monotonic(), None)
    outcome, error, delay = await run_handler(handler, flight, lambda h, j: backoff_delay(j.attempt, h.backoff))
    lease = claimed.lease
    if outcome is Outcome.COMPLETE:
        client.complete([lease])
    elif outcome is Outcome.PERMANENT:
        client.fail_permanently([lease], [error])
    elif outcome in (Outcome.FAIL, Outcome.TIMEOUT):
        client.fail([Failure(lease, error, delay)])
    else:
        client.release([lease], [delay], kinds=[outcome.value], reasons=[error])
    row = client.get(claimed.id)
    assert row is not None
    return Ran(outcome.value, error, row)


async def arun_job(jobs: Jobs, dsn: str, job_type: str, payload: Any = None, *, schema: str = DEFAULT_SCHEMA) -> Ran:
    """Enqueue a job, claim it and run its handler here, writing its outcome as a worker does."""
    handler = _handler(jobs, job_type)
    with Client(dsn, schema=schema) as client:
        job_id = client.enqueue(job_type, payload, run_at=FIRST)
        limits = {job_type: handler.max_attempts}  # as a worker claims: the handler's limit
        claimed = client.run(claim_call([job_type], worker="jobtui.testing", limit=1, lease=3600, max_attempts=limits))
        if [c.id for c in claimed] != [job_id]:
            client.release([c.lease for c in claimed])
            raise AssertionError(f"job {job_id} was not claimed first: another {job_type!r} job was due before 1970")
        return await _attempt(client, handler, claimed[0])


def run_job(jobs: Jobs, dsn: str, job_type: str, payload: Any = None, *, schema: str = DEFAULT_SCHEMA) -> Ran:
    """`arun_job` for sync tests."""
    return asyncio.run(arun_job(jobs, dsn, job_type, payload, schema=schema))


async def adrain(jobs: Jobs, dsn: str, *, schema: str = DEFAULT_SCHEMA, limit: int = 1000) -> list[Ran]:
    """Run every due job of the registry's types, one at a time, until none is due (a job
    retried later is not due yet) or `limit` attempts ran; what became of each attempt."""
    handlers = prepared(jobs).handlers
    limits = {t: h.max_attempts for t, h in handlers.items()}
    ran: list[Ran] = []
    with Client(dsn, schema=schema) as client:
        while len(ran) < limit:
            call = claim_call(list(handlers), worker="jobtui.testing", limit=1, lease=3600, max_attempts=limits)
            claimed = client.run(call)
            if not claimed:
                break
            ran.append(await _attempt(client, handlers[claimed[0].type], claimed[0]))
    return ran


def drain(jobs: Jobs, dsn: str, *, schema: str = DEFAULT_SCHEMA, limit: int = 1000) -> list[Ran]:
    """`adrain` for sync tests."""
    return asyncio.run(adrain(jobs, dsn, schema=schema, limit=limit))
