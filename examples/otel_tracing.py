"""OpenTelemetry: the enqueue's span, each attempt's span linked to it, operator actions.
Run: JOBTUI_DSN=postgresql://... python examples/otel_tracing.py (with jobtui[otel] and an SDK)"""

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import jobtui
from jobtui import otel
from jobtui.testing import drain

exporter = InMemorySpanExporter()  # in production: an OTLP exporter
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

jobs = otel.instrument(jobtui.Jobs())  # a span per attempt


@jobs.handler("email.send")
def send(job: jobtui.Job) -> None:
    pass


dsn = os.environ["JOBTUI_DSN"]
request = trace.get_tracer("app").start_as_current_span("POST /signup")
with jobtui.Client(dsn, middleware=[otel.trace_enqueue]) as client, request:  # a span per enqueue
    client.enqueue("email.send", {"to": "ada@example.com"})
drain(jobs, dsn)  # a worker, here

spans = {s.name: s for s in exporter.get_finished_spans()}
run = spans["run email.send"]
assert run.links[0].context.span_id == spans["enqueue email.send"].context.span_id
print(sorted(spans), run.attributes["jobtui.outcome"] if run.attributes else None)
