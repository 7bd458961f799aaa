"""The event loop of a `jobtui worker` process: uvloop's where it is installed, else asyncio's.

uvloop runs the same asyncio code with less CPU per task, callback and socket wait, which a
worker spends several times per job. `--loop asyncio` (or JOBTUI_LOOP=asyncio) keeps the
standard loop. An embedded `jobtui.Worker` runs on whatever loop its program runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote

LOOPS = ("auto", "asyncio", "uvloop")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(name: str) -> LoopFactory | None:
    """The factory of the loop `name` asks for; None: asyncio's own. `auto` takes uvloop
    when it can be imported."""
    if name not in LOOPS:
        raise InvalidInput(f"--loop (or JOBTUI_LOOP) must be one of {', '.join(LOOPS)}, got {quote(name)}")
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if name == "auto":
            return None
        raise InvalidInput(
            "--loop uvloop: uvloop is not installed; install it (pip install uvloop), or run with --loop asyncio"
        ) from None
    return uvloop.new_event_loop


def run_on(factory: LoopFactory | None, main: Coroutine[Any, Any, None]) -> None:
    """Run `main` to its end on a new loop made by `factory`, as asyncio.run does."""
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)
