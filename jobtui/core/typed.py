"""Typed payloads: a handler registered with `payload=Model` (a pydantic model) gets its
payload checked at enqueue, with one clear line when it does not fit, and decoded into the
model for the handler. Pydantic is never imported here: only the model's own
`model_validate` and `model_dump` are called, so jobtui needs it only when a handler uses it.

    class Welcome(pydantic.BaseModel):
        user_id: int

    @jobs.handler("email.welcome", payload=Welcome)
    def welcome(job: jobtui.Job) -> None:
        send(job.payload.user_id)                       # a Welcome

    client = jobtui.Client(dsn, middleware=[jobtui.checked_payloads(jobs)])
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jobtui.kernel.domain import NewJob
from jobtui.kernel.errors import InvalidInput, first_line
from jobtui.kernel.safetext import line, shorten

if TYPE_CHECKING:
    from collections.abc import Callable

    from jobtui.core.registry import Job, Jobs


def _first_problem(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        found = errors()
        if found:
            first = found[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "payload"
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            return f"{where}: {first.get('msg', 'invalid')}{more}"
    return first_line(exc)


def check_payload(job_type: str, model: Any, payload: Any) -> Any:
    """The payload as JSON-ready data once `model` accepted it; InvalidInput in one line if not."""
    try:
        value = payload if isinstance(payload, model) else model.model_validate(payload)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidInput(
            line(shorten(f"payload for {job_type!r} does not fit {model.__name__}: {_first_problem(exc)}"))
        ) from None
    return value.model_dump(mode="json")


def checked_payloads(jobs: Jobs) -> Callable[[NewJob], AbstractContextManager[NewJob | None]]:
    """An enqueue hook that checks each job's payload against its handler's model."""
    models = {t: h.payload for t, h in jobs.handlers.items() if h.payload is not None}

    @contextmanager
    def check(job: NewJob) -> Iterator[NewJob | None]:
        model = models.get(job.type)
        yield None if model is None else replace(job, payload=check_payload(job.type, model, job.payload))

    return check


def decode_payload(job: Job, model: Any) -> None:
    """Give the handler its payload as `model`; one that does not fit (it was enqueued
    without the check) fails the job for good: no retry can fix it."""
    from jobtui.core.registry import Permanent

    try:
        job.payload = model.model_validate(job.payload)
    except ValueError as exc:
        raise Permanent(f"payload does not fit {model.__name__}: {_first_problem(exc)}") from None
