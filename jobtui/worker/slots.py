"""The claim slots of a worker: one pool per queue it claims from, or one pool for every queue.

Each queue's producer claims only into its own pool, so a flood in one queue cannot take the
slots of another on the same worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping


class Slots:
    """Handlers running and jobs held (running or having their outcome written) per pool.

    A pool is named by its queue; the pool None claims from every queue.
    """

    def __init__(self, sizes: Mapping[str | None, int], polled: Iterable[str | None] = ()) -> None:
        self.sizes = dict(sizes)
        # Pools whose producers a notification does not wake: they claim once a poll.
        self.polled = frozenset(polled)
        self.busy = dict.fromkeys(self.sizes, 0)
        self.held = dict.fromkeys(self.sizes, 0)
        # One wake-up per producer: a producer clears its own before claiming, which must not
        # swallow another's.
        self.kicks = {pool: asyncio.Event() for pool in self.sizes}
        self.paused = False

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    def room(self, pool: str | None) -> int:
        """How many jobs the pool's producer may claim now: handlers running stay within its
        size, and outcomes still being written may add up to as many again, which bounds the
        memory a slow database can cost."""
        if self.paused:
            return 0
        size = self.sizes[pool]
        return min(size - self.busy[pool], 2 * size - self.held[pool])

    def handler_ended(self, pool: str | None) -> None:
        """A handler of `pool` stopped: its slot is free while the outcome is written, so the
        pool's next claim overlaps that write instead of waiting for it."""
        self.busy[pool] -= 1
        self.kicks[pool].set()

    def outcome_settled(self, pool: str | None) -> None:
        """A job of `pool` left the worker (its outcome written, or given up). Its producer is
        woken only when that makes room: when outcomes being written bounded it."""
        self.held[pool] -= 1
        if self.held[pool] >= self.sizes[pool] + self.busy[pool]:
            self.kicks[pool].set()

    def wake(self) -> None:
        """Every producer claims again (a resume, a stop, a job that may be ready)."""
        for kick in self.kicks.values():
            kick.set()

    def notified(self) -> None:
        """A notification (jobs enqueued, a lever changed): the producers claim again, but
        those of polled pools, whose jobs come a few a minute and would otherwise cost a claim
        per enqueue."""
        for pool, kick in self.kicks.items():
            if pool not in self.polled:
                kick.set()


def describe(sizes: Mapping[str | None, int]) -> str:
    """The pools for a log line: `every queue x 10` or `emails x 5, reports x 2`."""
    return ", ".join(f"{'every queue' if pool is None else pool} x {size}" for pool, size in sizes.items())
