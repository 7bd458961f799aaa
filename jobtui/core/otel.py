"""OpenTelemetry spans, with the `otel` extra (opentelemetry-api; your SDK exports them).

- `trace_enqueue`, an enqueue hook: a PRODUCER span per job enqueued, whose context is
  stored with the job (its `meta`);
- `instrument(jobs)`: a CONSUMER span per attempt, linked to the span that enqueued the
  job, with its type, queue, attempt, outcome and how long it waited to be picked up;
- a span per operator action (requeue, kill-lease, cancel), made by the clients whenever
  opentelemetry is installed: a no-op until an SDK is configured.

    jobs = otel.instrument(jobtui.Jobs())
    client = jobtui.Client(dsn, middleware=[otel.trace_enqueue])

Without the extra nothing here is imported by the worker or the clients, and an action's
span is a `nullcontext`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from jobtui.core.registry import Job, Jobs, Permanent, Retry
from jobtui.kernel.domain import NewJob

TRACER = "jobtui"
_api: Any = None  # the opentelemetry modules once looked up; False when not installed


def _otel() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import propagate, trace

            _api = (trace, propagate)
        except ImportError:
            _api = False
    return _api


def _require() -> Any:
    api = _otel()
    if not api:
        from jobtui.kernel.errors import InvalidInput

        raise InvalidInput("tracing needs OpenTelemetry: pip install 'jobtui[otel]'")
    return api


@contextmanager
def _enqueue_span(job: NewJob) -> Iterator[NewJob]:
    trace, propagate = _require()
    tracer = trace.get_tracer(TRACER)
    attributes = {"messaging.system": "jobtui", "jobtui.job.type": job.type}
    with tracer.start_as_current_span(f"enqueue {job.type}", kind=trace.SpanKind.PRODUCER, attributes=attributes):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield replace(job, meta={**(job.meta or {}), "trace": carrier}) if carrier else job


def trace_enqueue(job: NewJob) -> AbstractContextManager[NewJob]:
    """Enqueue hook: a span per job enqueued, its context kept with the job."""
    return _enqueue_span(job)


def _outcome(exc: BaseException | None) -> str:
    if exc is None:
        return "complete"
    if isinstance(exc, Permanent):
        return "permanent"
    if isinstance(exc, Retry):
        return "retry"
    if isinstance(exc, asyncio.CancelledError | TimeoutError):
        return "cancelled"  # a timeout, a lost lease or a shutdown: the worker's log says which
    return "fail"


@contextmanager
def attempt_span(job: Job) -> Iterator[None]:
    """Handler hook: a span per attempt, linked to its enqueue's span."""
    trace, propagate = _require()
    links = []
    carrier = (job.meta or {}).get("trace")
    if isinstance(carrier, dict):
        enqueued = trace.get_current_span(propagate.extract(carrier)).get_span_context()
        if enqueued.is_valid:
            links.append(trace.Link(enqueued))
    attributes = {
        "messaging.system": "jobtui",
        "jobtui.job.id": job.id,
        "jobtui.job.type": job.type,
        "jobtui.queue": job.queue,
        "jobtui.schema": job.schema,
        "jobtui.attempt": job.attempt,
        "jobtui.max_attempts": job.max_attempts,
        # From when the job was due to this attempt's start, by this worker's clock.
        "jobtui.pickup_wait_s": max(0.0, (datetime.now(UTC) - job.run_at).total_seconds()),
        "jobtui.waited_since_enqueue_s": max(0.0, (datetime.now(UTC) - job.created_at).total_seconds()),
    }
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(
        f"run {job.type}",
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except BaseException as exc:
            outcome = _outcome(exc)
            span.set_attribute("jobtui.outcome", outcome)
            if outcome in ("fail", "permanent"):
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200]))
            raise
        span.set_attribute("jobtui.outcome", "complete")


def instrument(jobs: Jobs) -> Jobs:
    """Add the attempt span to `jobs` as its next middleware; returns `jobs`."""
    _require()
    jobs.middleware(attempt_span)
    return jobs


def action_span(action: str, actor: str, target: str) -> AbstractContextManager[Any]:
    """A span around one operator action when OpenTelemetry is installed, else nothing."""
    api = _otel()
    if not api:
        return nullcontext()
    attributes = {"jobtui.action": action, "jobtui.actor": actor, "jobtui.target": target}
    span: AbstractContextManager[Any] = (
        api[0].get_tracer(TRACER).start_as_current_span(f"jobtui {action}", attributes=attributes)
    )
    return span
