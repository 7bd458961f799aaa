"""The jobs a worker has in flight, and what becomes of each: started when claimed, its
handler run by the executor, its outcome handed to the writer; or, when its lease is lost or
may be, given up (an async handler cancelled, a handler process stopped, a thread left to
return). At shutdown, shutdown.py releases them.

A mixin of Worker (worker.py), which holds the parts these use.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Coroutine
from functools import partial
from typing import Any

from jobtui.core.maintenance import ARCHIVE_TYPE
from jobtui.core.registry import Handler, Job, Jobs
from jobtui.kernel.domain import ClaimedJob
from jobtui.worker.children import ChildPool
from jobtui.worker.completer import OutcomeWriter
from jobtui.worker.events import OUTCOME_EVENTS, Events
from jobtui.worker.executor import PROCESS, THREAD, InFlight, run_handler, settled
from jobtui.worker.outcome import MAX_UNCOUNTED_IN_A_ROW, Outcome, count_outcome, fields
from jobtui.worker.slots import Slots

log = logging.getLogger("jobtui.worker")

# An async handler whose lease was given up gets this long to end after it was cancelled
# before its job is handed back (and may be claimed again).
ABANDON_GRACE = 5.0

# A job's task starts eagerly where Python can (3.12+): it runs at once, in the claim loop's
# step, up to its first real wait. A handler that never waits ends there, its task never
# scheduled nor registered: a loop callback and a weak reference less per job. Only these
# tasks are eager, not the loop's: other tasks keep asyncio's usual order.
if sys.version_info >= (3, 12):

    def job_task(work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        # The loop given: an eager start (3.12, 3.13) does not look up a missing one.
        return asyncio.Task(work, loop=asyncio.get_running_loop(), eager_start=True)

else:

    def job_task(work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        # The loop's own create_task: asyncio.create_task adds a call to name the task.
        return asyncio.get_running_loop().create_task(work)


class Flights:
    """The jobs in flight of a Worker."""

    jobs: Jobs
    worker_id: str
    schema: str
    slots: Slots
    in_flight: dict[int, InFlight]
    children: ChildPool | None
    counts: dict[str, int]
    builtin_counts: dict[str, int]
    _executors: dict[str, str]
    _writer: OutcomeWriter
    events: Events
    lease: float
    lease_margin: float
    stop_grace: float

    # Worker's own: methods here rather than attributes, so that a compiled build (mypyc) can
    # make the two one class.
    def _backoff(self, handler: Handler, job: Job) -> float:
        raise NotImplementedError

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        raise NotImplementedError

    def _start(self, pool: str | None, claimed: ClaimedJob, lease_until: float) -> None:
        job = Job(claimed, self.worker_id, self.schema)
        now = time.monotonic()
        executor = self._executors[claimed.type]
        # The lease watch would give the attempt up at once (heartbeater.watch): not started.
        if now >= lease_until - self.lease_margin - (self.stop_grace if executor == PROCESS else 0.0):
            self._hand_back_unstarted(job, claimed, now - (lease_until - self.lease))
            return
        handler = self.jobs.handlers[claimed.type]
        deadline = now + handler.timeout if handler.timeout else None
        flight = InFlight(job, claimed, now, deadline, lease_until, pool, executor)  # positional: cheaper
        older = self.in_flight.get(claimed.id)
        if older is not None:  # an older attempt of the job, still being written or given up
            self.slots.held[older.pool] -= 1
            if older.handler_done:
                older = None
            else:
                self._claimed_again(older)
        self.in_flight[claimed.id] = flight
        self.slots.held[pool] += 1
        self.slots.busy[pool] += 1
        flight.task = job_task(self._execute(handler, flight, older))

    def _hand_back_unstarted(self, job: Job, claimed: ClaimedJob, took: float) -> None:
        """A claim answered when the job's lease may have run out already (the answer came
        `took` seconds after the claim was sent: an outage, a frozen server): the job goes
        back to ready, not started and not counted, fenced by its token (which another
        worker's reaper may have replaced meanwhile)."""
        why = (
            f"the claim's answer came {took:.1f}s after it was sent, when its lease ({self.lease:g}s) may have run out"
        )
        log.warning(
            "job %d (%s) attempt %d: %s; handed back to ready unstarted, not counted",
            job.id,
            job.type,
            job.attempt,
            why,
            extra=fields(job),
        )

        def written(ok: bool) -> None:
            if ok:
                (self.builtin_counts if job.type == ARCHIVE_TYPE else self.counts)["abandoned"] += 1
            self.slots.wake()  # ready again (or another worker's): claim again at once
            if self.events.watched:
                self.events.tell("released" if ok else "lost", (job.id,))

        self._writer.submit(Outcome.ABANDONED, claimed.lease, written, f"not started: {why}")

    def _claimed_again(self, older: InFlight) -> None:
        """This worker claimed a job again while an older attempt's handler still runs here
        (its lease was reaped, killed or cancelled and the job became ready): that attempt
        is surely lost; the new one starts once its handler stopped."""
        if not older.gone and not older.writing:
            self._give_up(older, "the job was claimed again", surely=True, reason="reclaimed")
        older.gone = True
        older.job.mark_lost()

    async def _execute(self, handler: Handler, flight: InFlight, older: InFlight | None = None) -> None:
        job = flight.job
        try:
            try:
                if older is not None:
                    log.warning(
                        "job %d (%s) attempt %d waits for the handler of its attempt %d, still running here",
                        job.id,
                        job.type,
                        job.attempt,
                        older.job.attempt,
                        extra=fields(job),
                    )
                    try:
                        await older.wait_handler()
                    except BaseException:  # given up meanwhile: its own handler never ran
                        flight.handler_stopped()
                        raise
                    flight.started = time.monotonic()
                    flight.deadline = flight.started + handler.timeout if handler.timeout else None
                outcome, error, delay = await run_handler(handler, flight, self._backoff, self.children)
            finally:
                self.slots.handler_ended(flight.pool)
            judged = settled(flight, outcome, error)
            if judged is None:
                self._lost(job, "its lease was lost while it ran")
                return
            outcome, error = judged
            if flight.claimed.uncounted >= MAX_UNCOUNTED_IN_A_ROW and outcome in (Outcome.RETRY, Outcome.DB_ERROR):
                outcome = Outcome.FAIL
                error = (
                    f"{error}\n{MAX_UNCOUNTED_IN_A_ROW} releases in a row without an attempt counted "
                    "(Retry or database errors): this one counts as a failed attempt"
                )
                delay = max(delay, self._backoff(handler, job))
            # From here the writer owns the job: _written finishes it.
            written = partial(self._written, flight, outcome, error, delay)
            self._writer.submit(outcome, flight.claimed.lease, written, error, delay)
            flight.writing = True
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in the worker itself must not kill the loop
            log.exception("job %d (%s): internal error while finishing", job.id, job.type)
        finally:
            if not flight.writing:
                self._finished(flight)

    def _written(self, flight: InFlight, outcome: Outcome, error: str, delay: float, written: bool) -> None:
        """The writer wrote the job's outcome (or found its lease lost)."""
        self._finished(flight)
        if not written or (not delay and outcome is not Outcome.COMPLETE):
            # The job may be ready now (its lease reaped, a Retry or a failure without delay, a
            # release): claim again at once. The claim its handler's end woke may have run
            # before this write, found the job still running, and gone to wait.
            self.slots.wake()
        job = flight.job
        if self.events.watched:
            self.events.tell(OUTCOME_EVENTS[outcome.value] if written else "lost", (job.id,))
        if not written:
            if outcome is not Outcome.ABANDONED:
                self._lost(job, "its lease was lost before the outcome was written")
            elif flight.given_up is None and flight.stop_reason is None and not flight.gone:
                # Released because its handler saw the loss first (once() refused an effect)
                # before any watch or heartbeat gave the attempt up: nothing was said yet.
                self._lost(job, "its lease was lost (an effect of its handler was refused)")
            return
        if outcome is Outcome.COMPLETE and job.type != ARCHIVE_TYPE:
            self.counts["done"] += 1  # most outcomes: counted here without a call
        else:
            counts = self.builtin_counts if job.type == ARCHIVE_TYPE else self.counts
            count_outcome(counts, outcome, job, error, flight.claimed.uncounted)
        if delay:
            # Wake up to claim it again when it is due, instead of at the next poll.
            asyncio.get_running_loop().call_later(delay, self.slots.wake)

    def _finished(self, flight: InFlight) -> None:
        # The job may already run again here under a newer claim (a Retry without delay,
        # a lease lost and the job claimed back): that flight is not this one's to remove.
        if self.in_flight.get(flight.job.id) is flight:
            del self.in_flight[flight.job.id]
            self.slots.outcome_settled(flight.pool)

    def _lost(self, job: Job, why: str) -> None:
        (self.builtin_counts if job.type == ARCHIVE_TYPE else self.counts)["lost"] += 1
        log.warning(
            "job %d (%s) attempt %d: outcome not written, %s", job.id, job.type, job.attempt, why, extra=fields(job)
        )

    # -- leases --------------------------------------------------------------------------

    def cancel_requested(self, job_id: int) -> None:
        """The job's row says an operator cancelled job `job_id` under the lease held here (the
        heartbeat's answer): its handler is stopped as for a lost lease, with `job.cancelled`
        set (a handler process killed, a thread left to return, its outcome dropped)."""
        flight = self.in_flight.get(job_id)
        if flight is None or flight.writing or flight.gone:
            return
        flight.job.mark_cancelled()
        self.counts["cancelled"] += 1
        self._give_up(flight, "the job was cancelled by an operator", surely=True, reason="cancelled")

    def _give_up(self, flight: InFlight, why: str, surely: bool = False, reason: str = "lease") -> None:
        """The lease is lost (`surely`: a heartbeat found it gone, an operator cancelled the
        job, it was claimed again) or may be (it could not be extended in time).

        An async handler is cancelled, and a handler process stopped (SIGTERM, then SIGKILL):
        once it has, the job is handed back uncounted, fenced by the lease token; that
        release matches nothing when another worker took the job, and returns it without
        counting the attempt when nobody did (the database was away). A thread cannot be
        stopped: its `job.lost` is set and `once()` refuses from now on, but the job stays
        running under this worker, heartbeated, until the thread returns (settled() then
        says what is written); so this worker never runs it twice at once.
        """
        job = flight.job
        if flight.executor == THREAD:
            job.mark_lost()
            if surely:
                if flight.gone:
                    return
                flight.gone = True
                then = "its outcome will be dropped"
            else:
                if flight.given_up is not None or flight.gone:
                    return
                flight.given_up = why
                then = "the job stays running under this worker until it returns"
            log.warning(
                "job %d (%s) attempt %d: %s; job.lost set for its sync handler, which runs on in its thread: %s",
                job.id,
                job.type,
                job.attempt,
                why,
                then,
                extra=fields(job),
            )
            return
        job.mark_lost()
        flight.writing = True  # the release finishes the flight
        flight.stop_reason = reason
        log.warning(
            "job %d (%s) attempt %d: %s; %s, its outcome will be discarded",
            job.id,
            job.type,
            job.attempt,
            why,
            "its handler process is being stopped" if flight.executor == PROCESS else "handler cancelled",
            extra=fields(job),
        )
        if flight.task is not None and not flight.task.done():
            flight.task.cancel()
        self._spawn(self._hand_back(flight, why))

    async def _hand_back(self, flight: InFlight, why: str) -> None:
        task = flight.task
        if task is not None and not task.done():
            # A handler process is surely gone when its task ends (children.py kills it);
            # an async handler may hold on to its cancellation.
            _, late = await asyncio.wait((task,), timeout=None if flight.executor == PROCESS else ABANDON_GRACE)
            if late:
                log.warning(
                    "job %d (%s): its handler still runs %.0fs after its lease was given up; handing the job back",
                    flight.job.id,
                    flight.job.type,
                    ABANDON_GRACE,
                )
        written = partial(self._written, flight, Outcome.ABANDONED, why, 0.0)
        self._writer.submit(Outcome.ABANDONED, flight.claimed.lease, written, f"attempt given up: {why}")
