"""Middleware: timing, a tenant context and error reporting around every attempt, and a
tenant stamped on every enqueue. Run: JOBTUI_DSN=postgresql://... python examples/middleware.py"""

import contextvars
import os
import time
from collections.abc import Iterator
from dataclasses import replace

import jobtui
from jobtui.testing import drain

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")
jobs = jobtui.Jobs()
report: list[str] = []


@jobs.middleware
def timed(job: jobtui.Job) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        report.append(f"{job.type} took {time.monotonic() - started:.3f}s")


@jobs.middleware
def errors_reported(job: jobtui.Job) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        report.append(f"reported {type(exc).__name__} from job {job.id}")  # e.g. to Sentry
        raise  # the worker still records the failure and retries


@jobs.middleware
def tenant_context(job: jobtui.Job) -> Iterator[None]:
    token = TENANT.set(job.payload["tenant"])
    try:
        yield
    finally:
        TENANT.reset(token)


@jobs.handler("report.build", max_attempts=1)
def build(job: jobtui.Job) -> None:  # sync and async handlers get the same hooks
    if job.payload.get("broken"):
        raise ValueError("no data")
    report.append(f"built for {TENANT.get()}")


def stamp_tenant(job: jobtui.NewJob) -> Iterator[jobtui.NewJob]:
    """An enqueue hook: the enqueuing request's tenant goes into the payload."""
    yield replace(job, payload={**(job.payload or {}), "tenant": TENANT.get()})


dsn = os.environ["JOBTUI_DSN"]
with jobtui.Client(dsn, middleware=[stamp_tenant]) as client:
    TENANT.set("acme")
    client.enqueue("report.build", {})
    client.enqueue("report.build", {"broken": True})
drain(jobs, dsn)  # as a worker would run them
print("\n".join(line for line in report if "took" not in line))
