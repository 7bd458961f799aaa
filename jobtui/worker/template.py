"""The worker's side of the template process (template_process.py) its handler processes are forked from.

template = await Template.start(settings)        # NoChild if the app cannot be loaded
pid = await template.fork(data_end, control_end)   # the child's ends of its two sockets
template.on_exit = pool_callback                    # (pid, exit code) of each child that ended
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

from jobtui.kernel.timeouts import within
from jobtui.worker.child import Settings

log = logging.getLogger("jobtui.worker")

COMMAND = "from jobtui.worker.template_process import main; main()"
MESSAGE = 1 << 16


class NoChild(Exception):
    """No handler process could be started (the message says why)."""


class Template:
    def __init__(self, process: subprocess.Popen[bytes], requests: socket.socket, reports: socket.socket) -> None:
        self.process = process
        self._requests = requests
        self._reports = reports
        self._numbers = itertools.count(1)
        self._forks: dict[int, asyncio.Future[int]] = {}
        self._ready: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.alive = True
        # (pid, exit code: negative for a signal, None when unknown) of each child that ended.
        self.on_exit: Callable[[int, int | None], None] = lambda pid, code: None
        self.on_gone: Callable[[], None] = lambda: None  # the template itself ended

    @classmethod
    async def start(cls, settings: Settings, timeout: float) -> Template:
        """Start the template: a fresh interpreter that imports the app, whose registry it
        prepares once. NoChild, saying why, when it cannot."""
        requests, requests_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        reports, reports_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ends = (requests_end.fileno(), reports_end.fileno())
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", COMMAND, *map(str, ends)], pass_fds=ends, stdin=subprocess.DEVNULL
            )
        except OSError as exc:
            requests.close()
            reports.close()
            raise NoChild(f"could not start the handler processes' template ({sys.executable}): {exc}") from None
        finally:
            requests_end.close()
            reports_end.close()
        reports.setblocking(False)
        template = cls(process, requests, reports)
        asyncio.get_running_loop().add_reader(reports.fileno(), template._on_reports)
        requests.send(pickle.dumps({"settings": settings, "sys_path": list(sys.path)}))
        try:
            broken = await within(asyncio.shield(template._ready), timeout)
            if broken is not None:
                broken = f"the handler processes cannot load the app {settings.app}: {broken}"
        except TimeoutError:
            broken = f"the handler processes' template did not load the app within {timeout:.0f}s"
        except NoChild as exc:
            broken = str(exc)
        if broken is not None:
            await template.close()
            raise NoChild(broken)
        return template

    async def fork(self, data: socket.socket, control: socket.socket, timeout: float) -> int:
        """A new child with these sockets (the child's ends); its pid."""
        if not self.alive:
            raise NoChild("the handler processes' template is gone")
        number = next(self._numbers)
        forked = self._forks[number] = asyncio.get_running_loop().create_future()
        try:
            socket.send_fds(self._requests, [pickle.dumps(("fork", number))], [data.fileno(), control.fileno()])
        except OSError as exc:
            del self._forks[number]
            raise NoChild(f"could not ask for a handler process: {exc}") from None
        try:
            return await within(forked, timeout)
        except TimeoutError:
            raise NoChild(f"no handler process within {timeout:.0f}s") from None
        finally:
            self._forks.pop(number, None)

    def _on_reports(self) -> None:
        while True:
            try:
                message = self._reports.recv(MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if not message:
                self._gone()
                return
            kind, *rest = pickle.loads(message)
            if kind == "exited":
                self.on_exit(rest[0], rest[1])
            elif kind == "forked":
                forked = self._forks.get(rest[0])
                if forked is not None and not forked.done():
                    forked.set_result(rest[1])
            elif not self._ready.done():
                self._ready.set_result(None if kind == "ready" else str(rest[0]))

    def _gone(self) -> None:
        if not self.alive:
            return
        self.alive = False
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self._reports.fileno())
        for forked in self._forks.values():
            if not forked.done():
                forked.set_exception(NoChild("the handler processes' template ended"))
        if not self._ready.done():
            self._ready.set_exception(NoChild("the handler processes' template ended before it loaded the app"))
        self.on_gone()

    async def close(self) -> None:
        """Ask the template to exit (its requests socket closes) and wait for it."""
        was_alive = self.alive
        self.on_gone = lambda: None
        self._gone()
        self._requests.close()
        for _ in range(200):
            if self.process.poll() is not None:
                break
            await asyncio.sleep(0.01)
        else:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
            await asyncio.get_running_loop().run_in_executor(None, self.process.wait)
        self._reports.close()
        if was_alive and self.process.returncode not in (0, None):
            log.warning("the handler processes' template exited with status %s", self.process.returncode)


def gone(pid: int) -> bool:
    """Whether process `pid` no longer exists (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
