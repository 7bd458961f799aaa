"""Middleware around handlers (sync and async alike) and around enqueue, in order, on a real
worker and real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

import jobtui
from jobtui import Client, Job, Jobs, JobStatus, NewJob, Worker
from tests.waits import until

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="-")


def _app(events: list[tuple[str, ...]]) -> Jobs:
    jobs = Jobs()

    @jobs.middleware
    def reported(job: Job) -> Iterator[None]:
        events.append(("outer in", job.type))
        try:
            yield
        except Exception as exc:
            events.append(("outer error", job.type, type(exc).__name__))
            raise
        events.append(("outer out", job.type))

    @jobs.middleware
    def tenant(job: Job) -> Iterator[None]:
        events.append(("inner in", job.type))
        token = TENANT.set(job.payload["tenant"])
        try:
            yield
        finally:
            TENANT.reset(token)
            events.append(("inner out", job.type))

    @jobs.handler("sync")
    def sync(job: Job) -> None:
        events.append(("handler", job.type, TENANT.get()))

    @jobs.handler("async")
    async def run_async(job: Job) -> None:
        await asyncio.sleep(0)  # a suspension, no wait: the tenant must survive the handler's await
        events.append(("handler", job.type, TENANT.get()))

    @jobs.handler("boom", max_attempts=1)
    def boom(job: Job) -> None:
        raise ValueError("boom")

    return jobs


def tenant_hook(job: NewJob) -> Iterator[NewJob]:
    """Stamps the enqueuing code's tenant into the payload."""
    yield replace(job, payload={**(job.payload or {}), "tenant": TENANT.get()})


async def _run_until(worker: Worker, queue: Client, ids: list[int], timeout: float = 20) -> None:
    task = asyncio.create_task(worker.run())

    def finished() -> bool:
        rows = [queue.get(i) for i in ids]
        return all(r is not None and r.status in (JobStatus.DONE, JobStatus.DEAD) for r in rows)

    try:
        await until(finished, timeout, f"jobs {ids} done or dead")
    finally:
        worker.stop()
        await task


async def test_handler_hooks_wrap_sync_and_async_handlers_in_order(dsn: str) -> None:
    events: list[tuple[str, ...]] = []
    jobs = _app(events)
    with Client(dsn, middleware=[tenant_hook]) as queue:
        ids = []
        for job_type, tenant in (("sync", "acme"), ("async", "globex"), ("boom", "initech")):
            token = TENANT.set(tenant)
            ids.append(queue.enqueue(job_type, {}))
            TENANT.reset(token)
        worker = Worker(jobs, dsn, concurrency=1, scheduler=False, retention=None, poll_interval=0.05)
        await _run_until(worker, queue, ids)
        rows = [queue.get(i) for i in ids]
    assert [r.status if r else None for r in rows] == [JobStatus.DONE, JobStatus.DONE, JobStatus.DEAD]
    assert [r.payload["tenant"] if r else None for r in rows] == ["acme", "globex", "initech"]
    by_type: dict[str, list[tuple[str, ...]]] = {}
    for event in events:
        by_type.setdefault(event[1], []).append(event)
    assert by_type["sync"] == [
        ("outer in", "sync"),
        ("inner in", "sync"),
        ("handler", "sync", "acme"),
        ("inner out", "sync"),
        ("outer out", "sync"),
    ]
    assert by_type["async"][2] == ("handler", "async", "globex")
    assert by_type["boom"] == [
        ("outer in", "boom"),
        ("inner in", "boom"),
        ("inner out", "boom"),
        ("outer error", "boom", "ValueError"),
    ]
    assert worker.counts["done"] == 2 and worker.counts["dead"] == 1


def test_enqueue_hooks_see_the_insert_and_its_failure(dsn: str) -> None:
    seen: list[Any] = []

    def timed(job: NewJob) -> Iterator[None]:
        seen.append(("in", job.type))
        try:
            yield
        except jobtui.InvalidInput as exc:
            seen.append(("failed", str(exc)[:20]))
            raise
        seen.append(("out", job.type))

    with Client(dsn, middleware=[timed, tenant_hook]) as queue:
        queue.enqueue_many([NewJob("a", {}), NewJob("b", {})])
        with pytest.raises(jobtui.InvalidInput):
            queue.enqueue("", {})
        payloads = [j.type for j in queue.jobs()]
    assert payloads == ["b", "a"]
    assert seen[:4] == [("in", "a"), ("in", "b"), ("out", "b"), ("out", "a")]
    assert seen[4][0] == "in" and seen[5][0] == "failed"


async def test_the_archiver_counts_apart_from_the_apps_jobs(dsn: str) -> None:
    events: list[tuple[str, ...]] = []
    with Client(dsn) as queue:
        ids = [queue.enqueue(jobtui.core.maintenance.ARCHIVE_TYPE, {}), queue.enqueue("sync", {"tenant": "t"})]
        worker = Worker(_app(events), dsn, scheduler=False, poll_interval=0.05)
        await _run_until(worker, queue, ids)
    assert worker.counts["done"] == 1 and worker.builtin_counts["done"] == 1
    assert ("handler", "sync", "t") in events and not any(e[1] == jobtui.core.maintenance.ARCHIVE_TYPE for e in events)
