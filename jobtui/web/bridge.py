"""One browser tab's console: a process running the `jobtui` console on Textual's web driver,
and the two protocols it joins.

With the process (Textual's web driver, over its stdin and stdout), packets: one byte of kind,
four bytes of length (big-endian), the payload. `D` is terminal data (the screen, down; the
keys and mouse, up), `M` a JSON meta message (`resize`, `focus`, `blur`, `quit` up; `exit`
down), `P` a packed file delivery (down; unused here). The process first writes the line
`__GANGLION__`.

With the browser (textual-serve's client), WebSocket messages: binary frames are the screen;
text frames are JSON lists, `["stdin", text]`, `["resize", {"width": W, "height": H}]`,
`["ping", x]` (answered `["pong", x]`), `["focus"]`, `["blur"]`. Nothing else is passed on:
the browser can type into the console and resize it, and that is all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from jobtui.kernel.safetext import line, shorten

log = logging.getLogger("jobtui.serve")

READY = b"__GANGLION__\n"
MAX_PACKET = 16 * 1024 * 1024  # a full screen of truecolor cells is well under 1 MiB
MAX_INPUT = 64 * 1024  # characters in one stdin message (a paste)
MAX_CELLS = 1000  # columns or rows a resize may ask for
START_TIMEOUT = 30.0  # seconds for the console to start (connect, check the schema, draw)
QUIT_GRACE = 5.0  # seconds a console gets to quit when asked, before it is terminated


def packet(kind: bytes, payload: bytes) -> bytes:
    """
    >>> packet(b"D", b"q")
    b'D\\x00\\x00\\x00\\x01q'
    """
    return kind + len(payload).to_bytes(4, "big") + payload


class ConsoleProcess:
    """The console process of one WebSocket. `run` starts it and pumps its screen to `send`
    until it exits; `stop` ends it (asked, then terminated, then killed)."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        send: Callable[[bytes], Awaitable[None]],
        label: str,
    ) -> None:
        self.argv = argv
        self.env = env
        self.send = send
        self.label = label  # who and which tab, for the log
        self.process: asyncio.subprocess.Process | None = None
        self.started = asyncio.Event()
        self.why_not = ""  # why it did not start or ended early: its last line on stderr
        self._stderr_tail = b""

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def run(self, width: int, height: int) -> None:
        env = {**self.env, "COLUMNS": str(width), "ROWS": str(height)}
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group: a ^C to the server is the server's
        )
        log.info("console %s started (pid %d)", self.label, self.process.pid)
        stderr = asyncio.create_task(self._read_stderr())
        try:
            await self._pump()
        finally:
            await self._wait_or_end()
            with contextlib.suppress(asyncio.CancelledError):
                await stderr
            self.why_not = self._last_error_line()
            log.info("console %s ended (exit %s)", self.label, self.process.returncode)

    async def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        stdout = self.process.stdout
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while (first := await stdout.readline()) != READY:
                    if not first:
                        return  # ended before it started (no database, say): why_not says why
        except TimeoutError:
            self.why_not = f"the console did not start within {START_TIMEOUT:.0f}s"
            return
        self.started.set()
        try:
            while True:
                kind = await stdout.readexactly(1)
                size = int.from_bytes(await stdout.readexactly(4), "big")
                if size > MAX_PACKET:
                    log.error("console %s: a packet of %d bytes; ending it", self.label, size)
                    return
                payload = await stdout.readexactly(size)
                if kind == b"D":
                    await self.send(payload)
                elif kind == b"M" and _meta_type(payload) == "exit":
                    return
                # Anything else (open_url, file deliveries) is not offered by the web console.
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the console ended, or the browser went (a send to a closed socket)

    async def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        while chunk := await self.process.stderr.read(4096):
            self._stderr_tail = (self._stderr_tail + chunk)[-4096:]

    def _last_error_line(self) -> str:
        lines = [x for x in self._stderr_tail.decode("utf-8", "replace").splitlines() if x.strip()]
        return line(shorten(lines[-1])) if lines else ""

    # -- the browser's messages, passed on --------------------------------------------------

    async def from_browser(self, text: str) -> tuple[bool, str | None]:
        """Pass one text message of the browser on: whether it was the user's input (keys, the
        mouse, a paste), and the reply to send back, if any. Anything else is dropped."""
        try:
            message = json.loads(text)
        except ValueError:
            return False, None
        if not isinstance(message, list) or not message or not isinstance(message[0], str):
            return False, None
        kind, args = message[0], message[1:]
        if kind == "stdin" and args and isinstance(args[0], str) and len(args[0]) <= MAX_INPUT:
            await self._write(packet(b"D", args[0].encode("utf-8", "replace")))
            return True, None
        if kind == "resize" and args and isinstance(args[0], dict):
            width, height = args[0].get("width"), args[0].get("height")
            if _cells(width) and _cells(height):
                await self._meta({"type": "resize", "width": width, "height": height})
        elif kind in ("focus", "blur"):
            await self._meta({"type": kind})
        elif kind == "ping" and args and isinstance(args[0], str) and len(args[0]) <= 64:
            return False, json.dumps(["pong", args[0]])
        return False, None

    async def _meta(self, data: dict[str, Any]) -> None:
        await self._write(packet(b"M", json.dumps(data).encode("utf-8")))

    async def _write(self, data: bytes) -> None:
        process = self.process
        if process is None or process.stdin is None or process.returncode is not None:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            process.stdin.write(data)
            await process.stdin.drain()

    # -- ending ------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Ask the console to quit; terminate it if it has not within QUIT_GRACE, then kill it."""
        if self.process is None or self.process.returncode is not None:
            return
        await self._meta({"type": "quit"})
        await self._wait_or_end()

    async def _wait_or_end(self) -> None:
        process = self.process
        if process is None:
            return
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)  # the console and any thread it left
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(QUIT_GRACE):
                    await process.wait()
                    return


def _meta_type(payload: bytes) -> str:
    try:
        data = json.loads(payload)
    except ValueError:
        return ""
    kind = data.get("type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else ""


def _cells(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CELLS
