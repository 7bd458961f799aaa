"""Middleware: hooks around each handler's attempt and around each enqueue, in order.

A hook is a generator function that yields once (or a function returning a context
manager). What comes before `yield` runs before the handler (or the insert), what comes
after runs once it returned; an exception it raised is raised at the `yield`, so a hook
can time, set a context variable, or report errors and re-raise. The first hook registered
is the outermost. Handler hooks are sync code for sync and async handlers alike: for a sync
handler they run in its thread, for an async one on the worker's loop. examples/middleware.py
(shown in docs/integrations.md) times attempts, sets a tenant and reports errors.

An enqueue hook gets the `NewJob` and may yield another one in its place (a payload with a
tenant added, say): `Client(dsn, middleware=[tenant])`. A worker without handler hooks or
payload models runs its handlers as they are: nothing here costs it anything.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any

from jobtui.core.registry import Handler, HandlerHook, Job, Jobs
from jobtui.core.typed import decode_payload
from jobtui.kernel.domain import NewJob

# Called with the NewJob: a generator function yielding once (a NewJob in its place, or
# None to keep it), or a function returning such a context manager.
EnqueueHook = Callable[[NewJob], Any]


def as_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A generator function made a context manager factory; anything else as it is."""
    return contextmanager(fn) if inspect.isgeneratorfunction(fn) else fn


def _wrapped(handler: Handler, hooks: Sequence[HandlerHook]) -> Handler:
    fn, model = handler.fn, handler.payload

    if handler.is_async:

        async def run_async(job: Job) -> Any:
            with ExitStack() as stack:
                for hook in hooks:
                    stack.enter_context(hook(job))
                if model is not None:
                    decode_payload(job, model)
                return await fn(job)

        return replace(handler, fn=run_async)

    def run_sync(job: Job) -> Any:
        with ExitStack() as stack:
            for hook in hooks:
                stack.enter_context(hook(job))
            if model is not None:
                decode_payload(job, model)
            return fn(job)

    return replace(handler, fn=run_sync)


def prepared(jobs: Jobs) -> Jobs:
    """`jobs` with each handler run inside the registry's hooks, and its payload decoded
    into its model; `jobs` itself when it has neither."""
    wrapped = {t: _wrapped(h, jobs.hooks) for t, h in jobs.handlers.items() if jobs.hooks or h.payload is not None}
    if not wrapped:
        return jobs
    return Jobs({**jobs.handlers, **wrapped}, dict(jobs.schedules), list(jobs.dead_callbacks), list(jobs.hooks))


@contextmanager
def entered(hooks: Sequence[EnqueueHook], jobs: Sequence[NewJob]) -> Iterator[list[NewJob]]:
    """The jobs as the enqueue hooks leave them; the hooks stay entered until the insert is
    done, and see its exception if it failed."""
    if not hooks:
        yield list(jobs)
        return
    with ExitStack() as stack:
        out = []
        for job in jobs:
            for hook in hooks:
                job = stack.enter_context(hook(job)) or job
            out.append(job)
        yield out
