"""What runs inside a handler process of the worker's pool (the worker's side is children.py).

A child is forked from the pool's template process (template_process.py), a fresh interpreter that
imported the app and nothing of the worker: no connection, pool, lock, thread or event loop
of the worker's exists here. It runs one job at a time: a job comes in on its data socket,
its outcome goes back on the same socket. Its control socket carries a byte
that says why the worker is about to stop it (the job's `lost` and `cancelled` then say so
during the grace before SIGKILL), and, after each heartbeat, the moment until which the
job's lease surely holds. A child whose job is still running at that moment kills itself:
its worker may be frozen (SIGSTOP, a pause) and unable to stop it; it writes ENDED on the
control socket first, so that the worker can tell this death from others. When the control socket
closes with a job running, the worker is gone, and so is the child at once: no handler may
outlive its worker's lease.

Messages are length-prefixed pickles: both ends are processes of the same worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from jobtui.core.registry import Handler, Job, Jobs
from jobtui.kernel.domain import ClaimedJob
from jobtui.worker.outcome import judged

HEADER = struct.Struct("!I")
# The byte the worker sends on the control socket before it stops a child, per reason.
CANCELLED = b"c"
LOST = b"l"
# Then 8 bytes: the time.monotonic() (one clock for every process of the machine) until which
# the running job's lease surely holds, less the worker's margin.
DEADLINE = b"d"
DEADLINE_VALUE = struct.Struct("!d")
# The one byte a child writes on the control socket: it is ending itself, its job still
# running at the deadline (its worker did not answer); its SIGKILL follows at once.
ENDED = b"e"
# How often an idle child's watchdog looks whether a job started.
WATCH_INTERVAL = 0.2


class Stopped(BaseException):
    """Raised in the handler when the worker stops the child (SIGTERM): its `finally`
    blocks, middleware and span end before the process exits."""


@dataclass(frozen=True, slots=True)
class Settings:
    """What the children need from their worker; sent to the template process once."""

    app: str  # the registry as pkg.module:attr
    schema: str
    worker_id: str
    log_level: int = logging.INFO
    log_formatter: logging.Formatter | None = None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One job for the child: the claim, as the worker got it, and the moment (monotonic)
    the child must be gone by unless its worker extends the lease meanwhile."""

    claimed: ClaimedJob
    deadline: float


@dataclass(frozen=True, slots=True)
class Result:
    """What became of the attempt in the child: the outcome's value (outcome.Outcome), the
    error text, the delay (None: the worker's backoff), and whether the handler may have cut
    its work short for a loss (Job.loss_seen)."""

    outcome: str
    error: str
    delay: float | None
    loss_seen: bool


def frame(message: object) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket) -> Any:
    """The next message, or None once the worker closed the socket."""
    header = _read_exactly(sock, HEADER.size)
    if header is None:
        return None
    body = _read_exactly(sock, HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


class _Child:
    def __init__(self, data: socket.socket, control: socket.socket, settings: Settings) -> None:
        self.data = data
        self.control = control
        self.settings = settings
        self.job: Job | None = None  # the job running now, read by the watchdog thread
        self.deadline = 0.0  # when its lease may be lost; set before `job`
        self.told = threading.Event()  # the worker said it is about to stop this child

    def serve(self, jobs: Jobs) -> None:
        self.data.sendall(frame(("ready", os.getpid())))
        threading.Thread(target=self._watch, name="jobtui-child-watch", daemon=True).start()
        try:
            while (message := receive(self.data)) is not None:
                assert isinstance(message, Attempt)
                self.deadline = message.deadline
                self.data.sendall(frame(self._run(jobs, message.claimed)))
        except Stopped:
            pass
        finally:
            _flush_telemetry()

    def _run(self, jobs: Jobs, claimed: ClaimedJob) -> Result:
        handler: Handler = jobs.handlers[claimed.type]
        job = Job(claimed, self.settings.worker_id, self.settings.schema)
        self.job = job
        try:
            handler.fn(job)
        except Stopped:
            raise
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the handler's own
            outcome, error, delay = judged(exc)
            return Result(outcome.value, error, delay, job.loss_seen)
        finally:
            self.job = None
        return Result("complete", "", 0.0, job.loss_seen)

    def _watch(self) -> None:
        """Read the control socket: a byte says why the worker is about to stop this child, or
        brings a later deadline; its closing with a job running says the worker is gone. A job
        still running past its deadline ends the child."""
        while True:
            job = self.job
            now = time.monotonic()
            if job is not None and now >= self.deadline:
                with contextlib.suppress(OSError):
                    self.control.send(ENDED)
                _exit_now("its worker did not extend the lease in time (frozen or gone)")
            wait = WATCH_INTERVAL if job is None else min(WATCH_INTERVAL, self.deadline - now)
            self.control.settimeout(max(wait, 0.001))
            try:
                byte = self.control.recv(1)
            except TimeoutError:
                continue
            except OSError:
                byte = b""
            job = self.job
            if not byte:
                if job is not None:
                    _exit_now("its worker is gone")
                return
            if byte == DEADLINE:
                self.control.settimeout(None)  # the rest follows at once
                value = _read_exactly(self.control, DEADLINE_VALUE.size)
                if value is None:
                    continue
                self.deadline = max(self.deadline, DEADLINE_VALUE.unpack(value)[0])
                continue
            self.told.set()
            if job is not None:
                if byte == CANCELLED:
                    job.mark_cancelled()
                else:
                    job.mark_lost()


def _exit_now(why: str) -> None:
    """End this child at once, no handler code run on the way out: its job may run elsewhere."""
    with contextlib.suppress(OSError):
        os.write(2, f"jobtui handler process {os.getpid()}: {why}; exiting\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)


def _on_sigterm(child: _Child) -> Any:
    def stop(signum: int, frame: Any) -> None:
        # The worker writes its reason before it sends SIGTERM. A SIGTERM without one came
        # from elsewhere, to the whole process group or cgroup (systemd stopping the
        # service): the worker got it too and decides what becomes of this job.
        if not child.told.wait(0.2):
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one Stopped; SIGKILL follows the grace
        job = child.job
        if job is not None:
            job.mark_lost()  # once() refuses from here on
        raise Stopped()

    return stop


def setup_logging(settings: Settings) -> None:
    """Log lines as the worker writes them (same stream, level and format), unless the app
    configured logging itself when imported."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_formatter is not None:
        handler.setFormatter(settings.log_formatter)
    root.addHandler(handler)
    root.setLevel(settings.log_level)


def _flush_telemetry() -> None:
    """Export the spans the child made: a child exits without running atexit hooks."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return
    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if flush is not None:
        try:
            flush(2000)
        except Exception:  # exporting must not turn a clean exit into a crash
            logging.getLogger("jobtui.worker").exception("could not export the handler process's spans")


def main(data: socket.socket, control: socket.socket, settings: Settings, jobs: Jobs) -> None:
    """The child's life, right after the template forked it; `jobs` is the prepared registry."""
    # Ctrl-C in a terminal reaches the whole process group: only the worker decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = _Child(data, control, settings)
    signal.signal(signal.SIGTERM, _on_sigterm(child))
    try:
        child.serve(jobs)
    except Stopped:
        _flush_telemetry()
