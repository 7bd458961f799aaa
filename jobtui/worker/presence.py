"""A worker in the fleet (core/members.py): what it says of itself when it registers, what it
writes at each refresh (its state, its jobs in flight, when its last claim was answered), and
how it obeys an operator's order read from its row: quiet stops its claims (the jobs in
flight finish), resume starts them again, stop stops it as SIGTERM does."""

from __future__ import annotations

import logging
import time
from collections.abc import Sized
from typing import Protocol

from jobtui.core.maintenance import ARCHIVE_TYPE
from jobtui.core.members import Kind, Member, Status, refresh_interval, resident_bytes
from jobtui.core.scheduler import Scheduler
from jobtui.worker.children import ChildPool
from jobtui.worker.slots import Slots

log = logging.getLogger("jobtui.worker")


class Worker(Protocol):
    """What the fleet reads of a worker (worker.py's Worker), and the three things an order
    makes it do."""

    worker_id: str
    registered_as: Kind
    lease: float
    slots: Slots
    types: list[str]
    scheduler: Scheduler | None
    metrics_address: str | None
    poll_interval: float
    children: ChildPool | None
    last_claim: float | None
    _executors: dict[str, str]

    @property
    def in_flight(self) -> Sized: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    def stop(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


def member_of(worker: Worker) -> Member:
    """What `worker` says of itself in the fleet: its queues and slots, the types it claims,
    where its sync handlers run, whether it runs the scheduler."""
    sizes = worker.slots.sizes
    used = sorted({worker._executors[t] for t in worker.types if t != ARCHIVE_TYPE} - {"async"})
    return Member(
        worker.worker_id,
        worker.registered_as,
        refresh_interval(worker.lease),
        queues={q: n for q, n in sizes.items() if q is not None},
        every_queue=sizes.get(None),
        types=worker.types,
        executor=", ".join(used) or "async",
        scheduler=worker.scheduler is not None,
        metrics=worker.metrics_address,
        poll=worker.poll_interval,
    )


def status_of(worker: Worker) -> Status:
    """What it does now: stopping, quiet (paused) or running; its jobs in flight, its
    handler processes, its resident memory."""
    state = "stopping" if worker.stopping else "quiet" if worker.paused else "running"
    children = None if worker.children is None else len(worker.children.children)
    claimed = worker.last_claim
    claimed_ago = None if claimed is None else time.monotonic() - claimed
    return Status(state, len(worker.in_flight), children, resident_bytes(), claimed_ago)


def obey(worker: Worker, wanted: str, by: str | None) -> None:
    """An operator's order, read from the worker's row."""
    who = by or "an operator"
    if wanted == "stopping":
        log.warning("worker %s: %s ordered it to stop; stopping after the jobs in flight", worker.worker_id, who)
        worker.stop()
    elif wanted == "quiet" and not worker.paused:
        log.warning(
            "worker %s quieted by %s: it claims no new jobs; %d in flight finish",
            worker.worker_id,
            who,
            len(worker.in_flight),
        )
        worker.pause()
    elif wanted == "running" and worker.paused:
        log.warning("worker %s resumed by %s: it claims jobs again", worker.worker_id, who)
        worker.resume()
