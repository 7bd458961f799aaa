"""The producer: claims as many jobs as there is room for, whenever a wake-up (LISTEN, a job
finished, a retry due) or the poll interval says there may be work, and starts each one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from jobtui.kernel.db import Call, first_line
from jobtui.kernel.domain import ClaimedJob
from jobtui.kernel.errors import DatabaseUnavailable
from jobtui.kernel.link import Connection
from jobtui.kernel.timeouts import wait_event
from jobtui.worker.events import Events

log = logging.getLogger("jobtui.worker")

Denied = Callable[[psycopg.errors.InsufficientPrivilege, str], None]


def round_failed(exc: psycopg.Error, denied: Denied, doing: str) -> None:
    """A statement of a loop's round failed, not for want of the database: a missing
    privilege stops the worker (`denied`, told what it was `doing`), which will not fix itself;
    another error is logged, and the next round tries again."""
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        denied(exc, doing)
    else:
        log.warning("%s failed: %s", doing, first_line(exc))


# The shortest wait after an empty claim that followed claims that found jobs.
QUIET_FIRST = 0.05
# Under a backlog (the last claim took all it asked for), the longest a producer waits for
# half its pool to be free before claiming what room there is: a claim's cost is mostly per
# statement, so claims of a few jobs each, as slots free one by one, cost the database
# several times what claims of many do. A slot waits at most this long for its next job.
GATHER = 0.005


@dataclass(frozen=True, slots=True)
class Claiming:
    """What a producer claims with: its connection, its pool's claim statement, and the
    give-back of claims whose answer was lost."""

    conn: Connection
    schema: str
    claim: Callable[[int], Call[list[ClaimedJob]]]
    unanswered: Callable[[], Call[set[int]]]
    lease: float
    poll_interval: float
    # Shared by the producers of one worker: a give-back of unanswered claims releases
    # this worker's jobs that are not in flight, so it must not run between another
    # producer's claim coming back and its jobs being started.
    turn: asyncio.Lock
    # Told each time a claim is answered (found jobs or not): the fleet's row says when a
    # worker last claimed, so a reader can tell one that stopped claiming.
    answered: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class Starting:
    """What a producer starts its jobs with: its pool's free slots, the start of one job
    (with when its lease surely holds until), and its pool's wake-up."""

    room: Callable[[], int]
    start: Callable[[ClaimedJob, float], None]
    kick: asyncio.Event
    size: int  # the pool's slots


class Producer:
    """The claim loop of one pool of slots."""

    def __init__(
        self,
        claiming: Claiming,
        starting: Starting,
        *,
        name: str,
        stopping: asyncio.Event,
        denied: Denied,
        events: Events,
    ) -> None:
        self.name = name  # its pool's, for the log: a queue, or "every queue"
        # Claims answered so far (found jobs or not), each told in a DEBUG line: a claim sent
        # after that line sees every change committed before it was written.
        self.claims = 0
        self._claiming = claiming
        self._starting = starting
        self._answer_lost = False  # a claim was sent and its connection broke before the answer
        # How long to wait after a claim that found nothing: short right after claims that
        # found jobs, doubling up to the poll interval. A rated queue or type (migration
        # 0013) gains tokens with time and no event says so; a worker that waited the whole
        # poll after each empty claim would take at most its free slots per poll interval.
        self._quiet = claiming.poll_interval
        self._backlog = False  # the last claim took all it asked for
        self._stopping = stopping
        self._denied = denied
        self._events = events

    async def run(self) -> None:
        while not self._stopping.is_set():
            free = self._starting.room()
            if self._backlog and 0 < free < self._starting.size // 2:
                free = await self._gather()
                if self._stopping.is_set():
                    continue  # a stop during the gathering: no claim after it
            if free <= 0:
                self._starting.kick.clear()
                await self._wait_kick()
                continue
            # Clear before claiming: a notification arriving during the claim sets it again.
            self._starting.kick.clear()
            async with self._claiming.turn:
                try:
                    if self._answer_lost:
                        await self._give_back_unanswered()
                    claimed, sent = await self._claiming.conn.run_timed(
                        self._claiming.claim(free), self._claiming.schema, self._stopping, retry=False
                    )
                except psycopg.OperationalError:
                    # The claim may have committed without its answer reaching us.
                    self._answer_lost = True
                    continue
                except DatabaseUnavailable:
                    continue
                except psycopg.errors.InsufficientPrivilege as exc:
                    self._denied(exc, "the claim")
                    continue
                except psycopg.Error as exc:
                    log.error("claim failed: %s", first_line(exc))
                    failed = True
                else:
                    failed = False
                    self.claims += 1
                    log.debug("producer %s: claim %d answered with %d job(s)", self.name, self.claims, len(claimed))
                    if self._claiming.answered is not None:
                        self._claiming.answered()
                    # The lease runs from the database's now(), which is no earlier than the send.
                    lease_until = sent + self._claiming.lease
                    for job in claimed:
                        self._starting.start(job, lease_until)
                    if self._events.watched:
                        # "idle": the claim found nothing, the loop waits for a wake-up next.
                        self._events.tell("claimed" if claimed else "idle", [job.id for job in claimed])
            if failed:
                await self._wait_kick()
                continue
            if claimed:
                self._quiet = max(QUIET_FIRST, self._claiming.poll_interval / 10)
            self._backlog = len(claimed) == free
            if len(claimed) < free:
                await self._wait_kick(None if claimed else self._quiet)
                if not claimed:
                    self._quiet = min(self._claiming.poll_interval, self._quiet * 2)

    async def _gather(self) -> int:
        """Wait up to GATHER for half the pool to be free, or for a stop; the room then."""
        loop = asyncio.get_running_loop()
        until = loop.time() + GATHER
        while (free := self._starting.room()) < self._starting.size // 2 and not self._stopping.is_set():
            left = until - loop.time()
            if left <= 0:
                break
            self._starting.kick.clear()
            await wait_event(self._starting.kick, left)
        return free

    async def _give_back_unanswered(self) -> None:
        released = await self._claiming.conn.run(self._claiming.unanswered(), self._claiming.schema, self._stopping)
        self._answer_lost = False
        if released:
            log.warning(
                "%d job(s) taken by a claim whose answer was lost went back to ready, not counted", len(released)
            )

    async def _wait_kick(self, timeout: float | None = None) -> None:
        await wait_event(
            self._starting.kick, min(self._claiming.poll_interval, timeout or self._claiming.poll_interval)
        )
