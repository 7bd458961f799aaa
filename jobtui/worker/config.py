"""What a worker is asked to do, checked before it starts: its settings, and the job types
it runs (with the built-in archiver)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobtui.core.maintenance import ARCHIVE_TYPE, BUILTIN_TYPES, Retention, with_builtins
from jobtui.core.members import MAX_NAME
from jobtui.core.middleware import prepared
from jobtui.core.registry import Jobs, check_executor
from jobtui.kernel.checks import check_text
from jobtui.kernel.db import DEAD_SOCKET_SECONDS, check_dsn
from jobtui.kernel.domain import DEFAULT_LEASE_SECONDS, DEFAULT_SCHEMA
from jobtui.kernel.errors import InvalidInput
from jobtui.worker.children import STOP_GRACE
from jobtui.worker.executor import ASYNC, PROCESS, THREAD

DEFAULT_RETENTION = Retention()
# The default executor of sync handlers (docs/getting-started.md, "Handlers", says why).
DEFAULT_EXECUTOR = THREAD
# The collector's first threshold in a process that is a worker's own (`jobtui worker`): every
# job makes a few dozen short-lived objects, and the default (700) collects every few jobs.
GC_THRESHOLD = 10_000


@dataclass(frozen=True, slots=True)
class Timing:
    """The worker's clock: how long a lease is, and how often each part acts on it."""

    lease: float
    heartbeat_interval: float
    reap_interval: float
    # A lease is given up this long before it could expire, so that the handler has
    # stopped before any reaper can take the job back.
    margin: float
    # A handler process gets this long between SIGTERM and SIGKILL, and its attempt is
    # given up this much earlier than a thread's (a short lease leaves it less).
    stop_grace: float

    @property
    def dead_socket(self) -> float:
        """How long any of the worker's connections may wait on a peer gone silent (and a
        statement wait before the worker checks the database answers): a quarter of the
        lease, from 1 s to db.DEAD_SOCKET_SECONDS, so that a heartbeat stuck on a dead
        socket is replaced while the lease it extends still holds."""
        return min(DEAD_SOCKET_SECONDS, max(1.0, self.lease / 4))

    @classmethod
    def of(cls, lease: float, heartbeat_interval: float | None = None, reap_interval: float | None = None) -> Timing:
        return cls(
            lease,
            heartbeat_interval or lease / 3,
            # Rounds well within half a lease of each other (see reaper.py).
            reap_interval or min(lease / 4, 15.0),
            min(1.0, lease / 10),
            min(STOP_GRACE, lease / 4),
        )


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Everything a worker is asked to do but the jobs it runs: the keyword arguments of
    `jobtui.Worker(...)`, or the options of `jobtui worker`. Checked when made."""

    dsn: str
    concurrency: int = 10
    types: tuple[str, ...] | None = None
    queues: Mapping[str, int] | None = None
    lease: float = DEFAULT_LEASE_SECONDS
    worker_id: str | None = None
    schema: str = DEFAULT_SCHEMA
    poll_interval: float = 1.0
    heartbeat_interval: float | None = None
    reap_interval: float | None = None
    shutdown_timeout: float = 30.0
    scheduler: bool = True
    retention: Retention | None = DEFAULT_RETENTION
    delete_on_complete: bool = False
    pooler: str | None = None
    listen_dsn: str | None = None
    executor: str = DEFAULT_EXECUTOR
    max_jobs_per_child: int | None = None
    max_memory_per_child: int | None = None
    app: str | None = None

    def __post_init__(self) -> None:
        check_settings(
            concurrency=self.concurrency, queues=self.queues, lease=self.lease, poll_interval=self.poll_interval
        )
        check_children(self.executor, self.max_jobs_per_child, self.max_memory_per_child)
        if self.worker_id:  # empty (an unset variable in `--id "$ID"`): host:pid
            check_worker_id(self.worker_id)
        if self.listen_dsn:
            check_dsn(self.listen_dsn)

    @property
    def timing(self) -> Timing:
        return Timing.of(self.lease, self.heartbeat_interval, self.reap_interval)


def default_worker_id() -> str:
    """host:pid, the host cut to keep it within MAX_NAME."""
    pid = f":{os.getpid()}"
    return socket.gethostname()[: MAX_NAME - len(pid)] + pid


def check_worker_id(worker_id: str) -> str:
    """`worker_id` if the fleet's row and the leases can both carry it whole."""
    check_text(worker_id, "worker id")
    if len(worker_id) > MAX_NAME:
        raise InvalidInput(f"a worker id is at most {MAX_NAME} characters (the fleet's name), got {len(worker_id)}")
    return worker_id


def check_settings(*, concurrency: int, queues: Mapping[str, int] | None, lease: float, poll_interval: float) -> None:
    """InvalidInput, in one line, for a setting no worker can run with."""
    if concurrency < 1:
        raise InvalidInput(f"concurrency must be at least 1, got {concurrency}")
    if queues is not None and (not queues or any(n < 1 for n in queues.values())):
        raise InvalidInput("queues: give each queue a concurrency of at least 1")
    if not lease >= 1:
        raise InvalidInput(f"lease must be at least 1 second, got {lease}")
    if not poll_interval >= 0.01:  # 0 would spin on the database
        raise InvalidInput(f"poll interval must be at least 10ms, got {poll_interval}")


def check_children(executor: str, max_jobs: int | None, max_memory: int | None) -> None:
    """InvalidInput, in one line, for process-pool settings no worker can run with."""
    check_executor(executor, "--executor")
    if max_jobs is not None and max_jobs < 1:
        raise InvalidInput(f"--max-jobs-per-child must be at least 1, got {max_jobs}")
    if max_memory is not None and max_memory < 1 << 20:
        raise InvalidInput(f"--max-memory-per-child must be at least 1MiB, got {max_memory} bytes")


def executors(jobs: Jobs, default: str) -> dict[str, str]:
    """Where each type's handler runs: async ones on the loop, sync ones in the executor they
    name or `default`; the built-in jobs (the archiver) in a thread of the worker's own."""
    return {
        t: ASYNC if h.is_async else THREAD if t in BUILTIN_TYPES else (h.executor or default)
        for t, h in jobs.handlers.items()
    }


def uses_processes(found: Mapping[str, str], types: Sequence[str]) -> bool:
    return any(found[t] == PROCESS for t in types)


def registry_spec(jobs: Jobs) -> str | None:
    """`module:attr` naming `jobs` in an imported module, which a handler process can import
    by name; None when there is none (a registry made in a function, or in `__main__`)."""
    for name, module in list(sys.modules.items()):
        if module is None or name in ("__main__", "__mp_main__"):
            continue
        try:
            found = [attr for attr, value in vars(module).items() if value is jobs]
        except TypeError:  # a module object without a __dict__
            continue
        if found:
            return f"{name}:{found[0]}"
    return None


def handled_types(
    jobs: Jobs,
    types: Sequence[str] | None,
    retention: Retention | None,
    dsn: str,
    schema: str,
    pooler: str | None,
) -> tuple[Jobs, list[str]]:
    """The registry the worker runs (with its middleware and payload models applied, and the
    archiver added when `retention` is set) and the types it claims: `types`, else all."""
    jobs = prepared(jobs)
    handled = list(jobs.handlers)
    selected = list(types) if types else handled
    if retention is not None:
        # The built-in archive job runs on every worker, whatever types it was given.
        jobs = with_builtins(jobs, dsn, schema, retention, pooler=pooler)
        selected = [*selected, ARCHIVE_TYPE]
    unknown = [t for t in selected if t not in jobs.handlers]
    if unknown:
        raise InvalidInput(
            f"no handler for job type(s) {', '.join(unknown)}; registered: {', '.join(handled) or 'none'}"
        )
    if not selected:
        raise InvalidInput("the app registers no handlers: decorate functions with @jobs.handler(TYPE)")
    return jobs, selected
