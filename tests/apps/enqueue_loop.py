"""An application that enqueues in a loop through `Client` and through `AsyncClient` at once,
until its stdin closes, printing one JSON line per call: which client, when the call began
and ended (this machine's monotonic clock, the same in every network namespace), and how it
went (the exception's type and first line when it failed).

    python -m tests.apps.enqueue_loop DSN [GAP_SECONDS] < /dev/null

tests/chaos/test_client_outages.py runs it while the database is stopped or cut off.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

from jobtui import AsyncClient, Client

_print_lock = threading.Lock()


def _say(client: str, began: float, exc: BaseException | None) -> None:
    line: dict[str, Any] = {"client": client, "began": began, "ended": time.monotonic(), "ok": exc is None}
    if exc is not None:
        line["error"] = type(exc).__name__
        line["message"] = str(exc).splitlines()[0][:300] if str(exc) else ""
    # One write of the whole line: the clients' log lines share the pipe (stderr joins
    # stdout), and print's two writes (the text, then its newline) let one land between them.
    with _print_lock:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


def _sync_loop(dsn: str, gap: float, stop: threading.Event) -> None:
    with Client(dsn) as queue:
        while not stop.is_set():
            began = time.monotonic()
            try:
                queue.enqueue("client.loop", {"client": "sync"})
            except Exception as exc:
                _say("Client", began, exc)
            else:
                _say("Client", began, None)
            stop.wait(gap)


async def _async_loop(dsn: str, gap: float, stop: threading.Event) -> None:
    async with AsyncClient(dsn) as queue:
        while not stop.is_set():
            began = time.monotonic()
            try:
                await queue.enqueue("client.loop", {"client": "async"})
            except Exception as exc:
                _say("AsyncClient", began, exc)
            else:
                _say("AsyncClient", began, None)
            await asyncio.to_thread(stop.wait, gap)  # as the sync loop: ends at once on stop


def main() -> None:
    dsn = sys.argv[1]
    gap = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
    stop = threading.Event()
    loops = [
        threading.Thread(target=_sync_loop, args=(dsn, gap, stop)),
        threading.Thread(target=lambda: asyncio.run(_async_loop(dsn, gap, stop))),
    ]
    for loop in loops:
        loop.start()
    sys.stdin.read()  # until the test closes it
    stop.set()
    for loop in loops:
        loop.join(30)


if __name__ == "__main__":
    main()
