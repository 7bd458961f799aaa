"""The reaper: takes back the expired leases of other workers (a crashed or frozen worker's
jobs go back to ready, or dead on their last attempt), but only while in touch.

Each round tells the database when the previous one ran; a round that runs more than half a
lease after it reaps nothing (the reaper was cut off, or its statement waited out a
partition), and reaping starts again once the rounds have kept in touch for REAP_GRACE. Half
a lease is less than any outage that can have let another worker's lease expire (its
heartbeat comes every third of a lease). A worker never reaps the jobs it runs itself.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg

from jobtui.core.claims import reap_round_call
from jobtui.kernel.domain import FailOutcome, JobStatus
from jobtui.kernel.link import Connection
from jobtui.worker.config import Timing
from jobtui.worker.events import Events
from jobtui.worker.producer import Denied, round_failed

log = logging.getLogger("jobtui.worker")

# A reaper reaps only once its rounds have come within half a lease of each other (by the
# database's clock) for this long, or the lease if shorter: after an outage, or a partition
# of the reaper itself, the other workers reconnect within about a second and extend or give
# back the leases that expired meanwhile, which the outage must not count against their jobs.
REAP_GRACE = 3.0


class Reaper:
    def __init__(
        self,
        conn: Connection,
        schema: str,
        timing: Timing,
        *,
        own: Callable[[], list[int]],
        on_dead: Callable[[FailOutcome], None],
        denied: Denied,
        rng: random.Random,
        events: Events,
    ) -> None:
        self._conn = conn
        self._schema = schema
        self._lease = timing.lease
        self._interval = timing.reap_interval
        self._events = events
        self._own = own
        self._on_dead = on_dead
        self._denied = denied
        self._rng = rng

    async def run(self) -> None:
        continuity = self._lease / 2
        grace = timedelta(seconds=min(REAP_GRACE, self._lease))
        previous: datetime | None = None  # the database's now() at the previous round
        in_touch_since: datetime | None = None
        while True:
            # Spread reapers of many workers over the interval.
            await asyncio.sleep(self._interval * (0.75 + self._rng.random() / 2))
            ready = previous is not None and in_touch_since is not None and previous - in_touch_since >= grace
            call = reap_round_call(previous if ready else None, continuity, own=self._own())
            try:
                reaped = await self._conn.run(call, self._schema)
            except psycopg.Error as exc:
                round_failed(exc, self._denied, "reaping expired leases")
                continue
            if previous is None or (reaped.at - previous).total_seconds() >= continuity:
                in_touch_since = reaped.at
            previous = reaped.at
            if self._events.watched:
                ids = [job.job_id for job in reaped.reaped]
                self._events.tell("reap round", ids)
                if ids:
                    self._events.tell("reaped", ids)
            for job in reaped.reaped:
                if job.status is JobStatus.DEAD:
                    self._on_dead(
                        FailOutcome(job.job_id, job.status, job.type, job.attempt, job.attempt, job.worker, job.queue)
                    )
                else:
                    log.warning(
                        "job %d (%s) attempt %d: lease of worker %s expired; back to ready",
                        job.job_id,
                        job.type,
                        job.attempt,
                        job.worker,
                    )
