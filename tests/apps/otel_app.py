"""An app traced with OpenTelemetry, for the test of spans made in handler processes
(tests/integration/test_otel.py): its SDK writes each finished span as a JSON line to the
file named by JOBTUI_TEST_SPANS, from whichever process ends it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence

import psycopg
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from jobtui import Job, Jobs
from jobtui.core import otel


class LinesExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(os.environ["JOBTUI_TEST_SPANS"], "a") as out:
            for span in spans:
                entry = {
                    "name": span.name,
                    "attributes": dict(span.attributes or {}),
                    "links": [format(link.context.span_id, "016x") for link in span.links],
                    "pid": os.getpid(),
                }
                out.write(json.dumps(entry) + "\n")
        return SpanExportResult.SUCCESS


if "JOBTUI_TEST_SPANS" in os.environ:  # a worker of the test; not pytest collecting this module
    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(LinesExporter()))
    trace.set_tracer_provider(_provider)

jobs = otel.instrument(Jobs())


@jobs.middleware
def where(job: Job) -> Iterator[None]:
    """Middleware, inside the attempt's span: says which process ran it."""
    trace.get_current_span().set_attribute("app.pid", os.getpid())
    yield


@jobs.handler("traced")
def traced(job: Job) -> None:
    with psycopg.connect(os.environ["JOBTUI_DSN"]) as conn:
        if job.once(conn, f"traced:{job.id}"):
            conn.execute("INSERT INTO effect_log (key, job_id, attempt, worker) VALUES (%s, %s, %s, %s)",
                         (f"traced:{job.id}", job.id, job.attempt, job.worker_id))  # fmt: skip
