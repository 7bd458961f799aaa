"""The pool of handler processes, the worker's side (the child's is child.py).

Each child runs one job at a time. The worker sends it the claim and waits for its outcome,
or for its death; it stops a child for real on cancel, timeout, a lease it could not extend,
too much memory, or shutdown: SIGTERM, then SIGKILL after STOP_GRACE, and `run` returns (or
raises) only once the child is gone. A child is recycled after --max-jobs-per-child jobs, or
when it holds more than --max-memory-per-child between jobs. Children are started lazily,
one per sync job running at once, and kept idle between jobs.

Children are forked from the pool's template process (template.py, template_process.py), which
imported the app and nothing of the worker; docs/design.md, "Executors", says why.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import pickle
import signal
import socket
import time
from typing import Any, Protocol

from jobtui.core.registry import Job
from jobtui.kernel.domain import ClaimedJob
from jobtui.kernel.errors import JobtuiError
from jobtui.kernel.timeouts import within
from jobtui.worker import child as child_side
from jobtui.worker.child import Attempt, Result, Settings
from jobtui.worker.template import NoChild, Template, gone

log = logging.getLogger("jobtui.worker")


class InFlight(Protocol):
    """What the pool reads and writes of an attempt in flight (executor.py's InFlight)."""

    job: Job
    claimed: ClaimedJob
    started: float
    lease_until: float
    stop_reason: str | None
    child: Child | None


# SIGTERM, then SIGKILL after this many seconds (a quarter of the lease, if shorter: the
# worker's stop_grace): time for the handler's `finally` blocks, middleware and span to end.
# The lease watch gives a process-mode attempt up this much earlier than a thread's, so that
# the child is dead before the lease can expire.
STOP_GRACE = 1.0
# How often the resident memory of busy children is read, with --max-memory-per-child.
MEMORY_CHECK_INTERVAL = 0.5
# A new child says it is ready (it imported the app) within this.
START_TIMEOUT = 60.0
# A child asked to exit (recycled, or at shutdown) or whose socket closed is SIGKILLed if it
# is still there after this: time to export its spans.
EXIT_PATIENCE = 5.0
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# Why the worker stops a child, as the counters name it, and the byte that tells the child.
STOP_REASONS = ("timeout", "cancelled", "lease", "memory", "shutdown", "reclaimed")
_TOLD = {"cancelled": child_side.CANCELLED}


class ChildDied(Exception):
    """The handler's process died while it ran the job; the message says how, in words."""


class ChildEndedItself(ChildDied):
    """The child ended itself at its job's lease deadline: its worker did not extend the lease
    in time (frozen, or cut off from the database). The lease is what failed, not the job."""


class HandlerTimedOut(Exception):
    """The handler ran over its timeout; its process was stopped."""


__all__ = ["ChildDied", "ChildEndedItself", "ChildPool", "HandlerTimedOut", "NoChild"]


def resident_bytes(pid: int) -> int | None:
    """The resident memory of process `pid` (shared pages included), or None if unknown."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def memory_available() -> bool:
    """Whether resident memory can be read here (Linux's /proc)."""
    return resident_bytes(os.getpid()) is not None


def mib(size: int) -> str:
    """A size in MiB for a message: `512 MiB`."""
    return f"{size / (1 << 20):,.0f} MiB"


def death_reason(exitcode: int | None) -> str:
    """How a handler's process died, in words, for the job's history.

    >>> death_reason(-11)
    'ProcessDied: handler process died of a segmentation fault (signal 11, SIGSEGV)'
    >>> death_reason(3)
    'ProcessDied: handler process exited with status 3'
    """
    if exitcode is None:
        return "ProcessDied: handler process ended; its exit status is unknown"
    if exitcode >= 0:
        return f"ProcessDied: handler process exited with status {exitcode}"
    number = -exitcode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = "unknown signal"
    if number == signal.SIGKILL:
        return f"ProcessDied: handler process killed by signal {number} ({name}), as the kernel's OOM killer sends it"
    how = _DEATHS.get(number, "killed by a signal")
    return f"ProcessDied: handler process {how} (signal {number}, {name})"


_DEATHS = {
    int(signal.SIGSEGV): "died of a segmentation fault",
    int(signal.SIGBUS): "died of a bus error",
    int(signal.SIGFPE): "died of a floating-point exception",
    int(signal.SIGILL): "died of an illegal instruction",
    int(signal.SIGABRT): "aborted",
}


# A child that killed itself at its lease's deadline (child.py), as it said before it did.
ENDED_ITSELF = "ProcessDied: handler process ended itself at its lease's deadline: its worker did not answer"
ENDED_KIND = "deadline"


def death_kind(exitcode: int | None) -> str:
    """The counters' label of a death: the signal's name, or `exit`."""
    if exitcode is None or exitcode >= 0:
        return "exit"
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


class Child:
    """One handler process, as the worker sees it."""

    def __init__(self, pid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 control: socket.socket) -> None:  # fmt: skip
        self.pid = pid
        self.reader = reader
        self.writer = writer
        self.control = control
        self.jobs = 0  # jobs it ran
        self.busy = False
        self.gone = asyncio.Event()
        self.exitcode: int | None = None
        self.stopping: str | None = None  # why the worker stops it (STOP_REASONS), once it does
        self.killed_hard = False
        self.flight: InFlight | None = None  # the attempt it runs, or ran last
        # Why it was stopped for its memory, for the history of that attempt (and no other).
        self.memory_note: tuple[InFlight, str] | None = None
        self.rss: int | None = None  # resident bytes, as last read
        self.ended_itself = False  # it said it ends itself at its lease's deadline (child.ENDED)

    def extend(self, deadline: float) -> None:
        """Tell the child its job's lease holds until `deadline` (monotonic) at least."""
        with contextlib.suppress(OSError):
            self.control.send(child_side.DEADLINE + child_side.DEADLINE_VALUE.pack(deadline))

    def says_it_ended(self) -> bool:
        """Whether the child said it ends itself at its lease's deadline: the byte it writes
        on the control socket just before its SIGKILL, there by the time it is reaped."""
        if not self.ended_itself:
            with contextlib.suppress(OSError):  # nothing said (BlockingIOError), or closed
                self.ended_itself = child_side.ENDED in self.control.recv(64, socket.MSG_DONTWAIT)
        return self.ended_itself

    def read_rss(self) -> int | None:
        self.rss = resident_bytes(self.pid) if not self.gone.is_set() else None
        return self.rss


class PoolCounts:
    """What became of the pool's children, for the Worker pane and Prometheus."""

    def __init__(self) -> None:
        self.started = 0
        self.recycled: collections.Counter[str] = collections.Counter()  # jobs, memory
        self.killed: collections.Counter[str] = collections.Counter()  # STOP_REASONS
        self.died: collections.Counter[str] = collections.Counter()  # by signal name, or exit


class ChildPool:
    """The worker's handler processes."""

    def __init__(
        self,
        settings: Settings,
        *,
        max_jobs: int | None = None,
        max_memory: int | None = None,
        grace: float = STOP_GRACE,
        margin: float = 0.0,
    ) -> None:
        try:
            pickle.dumps(settings)
        except Exception:  # an app's formatter that cannot travel: the children log plainly
            settings = Settings(settings.app, settings.schema, settings.worker_id, settings.log_level)
        self._settings = settings
        self.max_jobs = max_jobs
        self.max_memory = max_memory
        self.grace = grace
        # A child kills itself once its job's lease is this close to its end and not extended
        # (its worker may be frozen): the worker's own margin, so it is gone before the lease.
        self.margin = margin
        self.counts = PoolCounts()
        self.children: set[Child] = set()
        self._idle: list[Child] = []
        self._template: Template | None = None
        self._starting = asyncio.Lock()
        self._by_pid: dict[int, Child] = {}
        self._early_exits: dict[int, int | None] = {}  # children that ended before they were known
        self._tasks: set[asyncio.Future[Any]] = set()
        self._monitor: asyncio.Task[None] | None = None

    # -- the pool --------------------------------------------------------------------------

    async def open(self) -> None:
        """Start the template process and a first child: an app the children cannot load
        stops the worker here, with one line, rather than fail every job."""
        try:
            self._idle.append(await self._spawn())
        except NoChild as exc:
            raise JobtuiError(str(exc)) from None
        if self.max_memory is not None:
            self._monitor = asyncio.create_task(self._watch_memory(), name="jobtui-child-memory")

    async def close(self) -> None:
        """Stop every child: idle ones exit when their socket closes, busy ones are stopped."""
        if self._monitor is not None:
            self._monitor.cancel()
        children = list(self.children)
        for child in children:
            if child.busy:
                self._in_background(self._stop(child, "shutdown"))
            elif child.stopping is None:
                child.stopping = "closing"
                child.writer.close()
        await asyncio.gather(*(self._wait_gone(c, EXIT_PATIENCE) for c in children), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._template is not None:
            await self._template.close()

    def describe(self) -> str:
        """The pool in one line, for the Worker pane."""
        busy = sum(1 for c in self.children if c.busy)
        c = self.counts

        def by(counter: collections.Counter[str]) -> str:
            total = sum(counter.values())
            return f"{total}" + (f" ({', '.join(f'{k} {v}' for k, v in sorted(counter.items()))})" if total else "")

        return (
            f"process pool: {len(self.children)} children ({busy} busy, {len(self.children) - busy} idle); "
            f"started {c.started}, recycled {by(c.recycled)}, killed {by(c.killed)}, died {by(c.died)}"
        )

    # -- one job ---------------------------------------------------------------------------

    async def run(self, flight: InFlight, timeout: float | None) -> Result:
        """Run the flight's job in a child; its Result once it returned.

        Raises HandlerTimedOut past `timeout` seconds and ChildDied when the child died,
        both once the child is gone; when cancelled, stops the child (for the reason in
        `flight.stop_reason`) and re-raises once it is gone.
        """
        child = await self._acquire()
        child.busy = True
        child.flight = flight
        flight.child = child
        try:
            child.writer.write(child_side.frame(Attempt(flight.claimed, flight.lease_until - self.margin)))
            try:
                if timeout is None:
                    result = await self._result(child, flight)
                else:
                    left = max(0.0, flight.started + timeout - time.monotonic())
                    result = await within(self._result(child, flight), left)
            except TimeoutError:
                await self._stop(child, "timeout")
                raise HandlerTimedOut() from None
            except asyncio.CancelledError:
                await self._stop(child, flight.stop_reason or "shutdown")
                raise
        finally:
            child.busy = False
        child.jobs += 1
        if child.memory_note is not None and child.memory_note[0] is flight:
            log.info(
                "job %d (%s): its handler returned as its process %d was being stopped for its memory; "
                "the outcome stands, the process is replaced",
                flight.job.id,
                flight.job.type,
                child.pid,
            )
        self._after_job(child)
        return result

    async def _result(self, child: Child, flight: InFlight) -> Result:
        try:
            header = await child.reader.readexactly(child_side.HEADER.size)
            body = await child.reader.readexactly(child_side.HEADER.unpack(header)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            # The child is gone or going: its exit status comes right after.
            await self._wait_gone(child, EXIT_PATIENCE)
            if child.memory_note is not None and child.memory_note[0] is flight:
                raise ChildDied(child.memory_note[1]) from None
            if child.ended_itself:  # counted when it was reaped
                raise ChildEndedItself(ENDED_ITSELF) from None
            if child.stopping is None:
                self.counts.died[death_kind(child.exitcode)] += 1
            raise ChildDied(death_reason(child.exitcode)) from None
        result = pickle.loads(body)
        assert isinstance(result, Result)
        return result

    def _after_job(self, child: Child) -> None:
        """Back to the idle children, or recycled when it ran its jobs or holds too much.

        A child being stopped is not: its job returned as the worker began to stop it (found
        over the memory limit an instant before, say), and it is going."""
        if child.stopping is not None or child.gone.is_set():
            return
        if self.max_jobs is not None and child.jobs >= self.max_jobs:
            self._recycle(child, "jobs")
        elif self.max_memory is not None and (child.read_rss() or 0) > self.max_memory:
            log.info(
                "handler process %d holds %s between jobs, over --max-memory-per-child %s: replaced",
                child.pid,
                mib(child.rss or 0),
                mib(self.max_memory),
            )
            self._recycle(child, "memory")
        else:
            self._idle.append(child)

    def _recycle(self, child: Child, reason: str) -> None:
        self.counts.recycled[reason] += 1
        child.stopping = "recycled"
        child.writer.close()  # the child's loop ends, it exports its spans and exits
        self._in_background(self._wait_gone(child, EXIT_PATIENCE))

    # -- starting and stopping children ----------------------------------------------------

    async def _acquire(self) -> Child:
        while self._idle:
            child = self._idle.pop()
            if not child.gone.is_set() and child.stopping is None:
                return child
        return await self._spawn()

    async def _ensure_template(self) -> Template:
        async with self._starting:
            if self._template is None or not self._template.alive:
                template = await Template.start(self._settings, START_TIMEOUT)
                template.on_exit = self._exited
                template.on_gone = self._template_gone
                self._template = template
            return self._template

    async def _spawn(self) -> Child:
        template = await self._ensure_template()
        data, data_end = socket.socketpair()
        control, control_end = socket.socketpair()
        try:
            pid = await template.fork(data_end, control_end, START_TIMEOUT)
        except BaseException:
            data.close()
            control.close()
            raise
        finally:
            data_end.close()  # the child has its own copies now
            control_end.close()
        reader, writer = await asyncio.open_unix_connection(sock=data)
        child = Child(pid, reader, writer, control)
        self.children.add(child)
        self._by_pid[pid] = child
        self.counts.started += 1
        if pid in self._early_exits:
            self._exited(pid, self._early_exits.pop(pid))
        try:
            header = await within(reader.readexactly(child_side.HEADER.size), START_TIMEOUT)
            pickle.loads(await reader.readexactly(child_side.HEADER.unpack(header)[0]))
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            await self._stop(child, "shutdown")
            raise NoChild(f"a handler process did not start: {death_reason(child.exitcode)}") from None
        return child

    def _exited(self, pid: int, code: int | None) -> None:
        """The template says child `pid` ended (code: negative for a signal, None if unknown)."""
        child = self._by_pid.pop(pid, None)
        if child is None:
            self._early_exits[pid] = code
            return
        child.exitcode = code
        child.gone.set()
        self.children.discard(child)
        if child in self._idle:
            self._idle.remove(child)
        if child.says_it_ended():  # its worker (this one) was frozen past the job's lease
            self.counts.died[ENDED_KIND] += 1
            log.warning("handler process %d ended itself at its lease's deadline: its worker did not answer", pid)
        elif not child.busy and child.stopping is None:  # died between jobs (the OOM killer chooses idle ones too)
            self.counts.died[death_kind(code)] += 1
            log.warning("idle handler process %d: %s", pid, death_reason(code))
        child.writer.close()
        child.control.close()

    def _template_gone(self) -> None:
        """The template died: nobody reports its children's ends any more. They are killed,
        and found gone by their pids; the next job starts a new template."""
        orphans = list(self._by_pid)
        if orphans:
            log.error("the handler processes' template ended: killing its %d children", len(orphans))
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._in_background(self._confirm_gone(orphans))

    async def _confirm_gone(self, pids: list[int]) -> None:
        while pids:
            await asyncio.sleep(0.01)
            for pid in [p for p in pids if gone(p)]:
                pids.remove(pid)
                self._exited(pid, None)

    async def _stop(self, child: Child, reason: str) -> None:
        """SIGTERM, SIGKILL after the grace; returns once the child is gone (even when cancelled
        meanwhile: then it kills at once, waits, and re-raises)."""
        if child.gone.is_set():
            return
        self._begin_stop(child, reason)
        await self._wait_gone(child, self.grace)

    def _begin_stop(self, child: Child, reason: str) -> None:
        """Mark the child as being stopped, tell it why, and SIGTERM it, all at once: from
        here no job is handed to it, and it is not put back with the idle ones."""
        if child.stopping is not None or child.gone.is_set():
            return
        child.stopping = reason
        if child.says_it_ended():  # already ending itself, at its lease's deadline: counted as such
            return
        self.counts.killed[reason] += 1
        with contextlib.suppress(OSError):
            child.control.send(_TOLD.get(reason, child_side.LOST))
        self._signal(child, signal.SIGTERM)

    async def _wait_gone(self, child: Child, patience: float) -> None:
        """Until the child is gone, SIGKILL after `patience` seconds; cancelled meanwhile, it
        kills at once, still waits, and re-raises."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        cancelled = False
        while not child.gone.is_set():
            left = deadline - loop.time()
            if left <= 0 and not child.killed_hard:
                self._signal(child, signal.SIGKILL)
            try:
                timeout = None if child.killed_hard else max(left, 0.01)
                await within(asyncio.shield(child.gone.wait()), timeout)
            except TimeoutError:
                continue
            except asyncio.CancelledError:
                cancelled = True
                self._signal(child, signal.SIGKILL)
        if cancelled:
            raise asyncio.CancelledError

    def _signal(self, child: Child, signum: int) -> None:
        if child.gone.is_set():
            return
        if signum == signal.SIGKILL:
            child.killed_hard = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signum)

    async def _watch_memory(self) -> None:
        while True:
            await asyncio.sleep(MEMORY_CHECK_INTERVAL)
            self._check_memory()

    def _check_memory(self) -> None:
        """Stop each busy child whose resident memory went over the limit: its job fails.

        The stop begins here, before anything else runs on the loop: a job that returns in
        the meantime keeps its outcome, but its child is not used again, and the note goes
        to that job's attempt only."""
        limit = self.max_memory
        assert limit is not None
        for child in list(self.children):
            if not child.busy or child.stopping is not None or child.flight is None:
                continue
            rss = child.read_rss()
            if rss is not None and rss > limit:
                child.memory_note = (
                    child.flight,
                    f"MemoryLimit: handler process went over --max-memory-per-child ({mib(rss)} resident, "
                    f"limit {mib(limit)}); stopped",
                )
                self._begin_stop(child, "memory")
                self._in_background(self._wait_gone(child, self.grace))

    def _in_background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
