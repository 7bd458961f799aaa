"""OpenTelemetry spans, collected by the SDK's in-memory exporter: the enqueue's span, each
attempt's span linked to it, and a span per operator action."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import psycopg
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jobtui import Client, Job, Jobs, JobStatus, Permanent, Worker
from jobtui.core import otel
from tests.waits import until

EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)  # once per process; the tests read EXPORTER only


def _app() -> Jobs:
    jobs = Jobs()

    @jobs.handler("ok")
    async def ok(job: Job) -> None:
        return None

    @jobs.handler("bad")
    def bad(job: Job) -> None:
        raise Permanent("cannot")

    return otel.instrument(jobs)


def _named(prefix: str) -> list[ReadableSpan]:
    return [s for s in EXPORTER.get_finished_spans() if s.name.startswith(prefix)]


async def test_attempt_spans_link_to_the_span_that_enqueued_them(dsn: str) -> None:
    EXPORTER.clear()
    tracer = trace.get_tracer("app")
    with Client(dsn, middleware=[otel.trace_enqueue]) as queue:
        with tracer.start_as_current_span("signup request") as request:
            ok_id = queue.enqueue("ok", {}, queue="mail")
            bad_id = queue.enqueue("bad", {})
        row = queue.get(ok_id)
        assert row is not None
        worker = Worker(_app(), dsn, concurrency=2, scheduler=False, retention=None, poll_interval=0.05)
        task = asyncio.create_task(worker.run())
        await until(lambda: not queue.count(status=["ready", "running"]), 30, "both jobs finished")
        worker.stop()
        await task
        assert queue.get(bad_id) is not None and queue.get(bad_id).status is JobStatus.FAILED  # type: ignore[union-attr]
    enqueues = {s.attributes["jobtui.job.type"]: s for s in _named("enqueue ") if s.attributes}
    assert set(enqueues) == {"ok", "bad"}
    for span in enqueues.values():
        assert span.kind is trace.SpanKind.PRODUCER
        assert span.parent is not None and span.parent.span_id == request.get_span_context().span_id
    runs = {s.attributes["jobtui.job.type"]: s for s in _named("run ") if s.attributes}
    for job_type, job_id, outcome, queue_name in (
        ("ok", ok_id, "complete", "mail"),
        ("bad", bad_id, "permanent", "default"),
    ):
        span = runs[job_type]
        assert span.kind is trace.SpanKind.CONSUMER
        assert [link.context.span_id for link in span.links] == [enqueues[job_type].context.span_id]
        assert span.attributes is not None
        assert (span.attributes["jobtui.job.id"], span.attributes["jobtui.attempt"]) == (job_id, 1)
        assert (span.attributes["jobtui.queue"], span.attributes["jobtui.schema"]) == (queue_name, "jobtui")
        assert span.attributes["jobtui.outcome"] == outcome
        assert float(span.attributes["jobtui.pickup_wait_s"]) >= 0  # type: ignore[arg-type]
    assert runs["bad"].status.status_code is trace.StatusCode.ERROR
    assert runs["ok"].status.status_code is trace.StatusCode.UNSET


def test_operator_actions_get_a_span(dsn: str) -> None:
    EXPORTER.clear()
    with Client(dsn) as queue:
        job_id = queue.enqueue("bad", {})
        [claimed] = queue.claim(["bad"], worker="w")
        queue.fail_permanently([claimed.lease], ["no"])
        assert queue.requeue([job_id], actor="ops@host") == [job_id]
    [span] = _named("jobtui requeue")
    assert span.attributes is not None
    assert span.attributes["jobtui.actor"] == "ops@host" and span.attributes["jobtui.rows"] == 1
    assert span.attributes["jobtui.target"] == f"jobs {job_id}"


def test_jobs_without_trace_context_run_unlinked(dsn: str) -> None:
    EXPORTER.clear()
    from jobtui.testing import run_job

    ran = run_job(_app(), dsn, "ok", {})
    assert ran.outcome == "complete"
    [span] = _named("run ok")
    assert list(span.links) == []


def test_an_attempt_in_a_handler_process_has_its_span_middleware_and_effect(dsn: str, tmp_path: Path) -> None:
    from tests.waits import wait_until
    from tests.workers import APP_TABLES, WorkerProcess

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(APP_TABLES)
    spans = tmp_path / "spans.jsonl"
    env = {**os.environ, "JOBTUI_DSN": dsn, "JOBTUI_TEST_SPANS": str(spans), "PYTHONUNBUFFERED": "1"}
    worker = WorkerProcess("W", ["--executor", "process", "--no-scheduler"], env, tmp_path / "W.log",
                           app="tests.apps.otel_app:jobs")  # fmt: skip
    try:
        worker.wait_started()
        EXPORTER.clear()
        with Client(dsn, middleware=[otel.trace_enqueue]) as queue:
            job_id = queue.enqueue("traced", {}, queue="mail")
            wait_until(lambda: queue.get(job_id).status is JobStatus.DONE, 20, "the job done", worker.log)  # type: ignore[union-attr]
    finally:
        worker.kill()
    [enqueued] = _named("enqueue traced")
    [run] = [json.loads(line) for line in spans.read_text().splitlines() if json.loads(line)["name"] == "run traced"]
    # Made in the handler's process, by the middleware too, linked to the enqueue's span.
    assert run["pid"] not in (os.getpid(), worker.pid) and run["attributes"]["app.pid"] == run["pid"]
    assert run["links"] == [format(enqueued.context.span_id, "016x")]
    assert run["attributes"]["jobtui.outcome"] == "complete" and run["attributes"]["jobtui.job.id"] == job_id
    # The claim's queue came over the pipe: the job's named queue, and its schema apart.
    assert (run["attributes"]["jobtui.queue"], run["attributes"]["jobtui.schema"]) == ("mail", "jobtui")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM effect_log WHERE key = %s", (f"traced:{job_id}",)).fetchone() == (1,)
