"""The worker: claims jobs, runs their handlers, keeps their leases, writes their outcomes.

    worker = Worker(jobs, dsn, concurrency=20)
    asyncio.run(worker.run())         # until worker.stop() (or SIGTERM via run_cli_worker)

One asyncio loop per process. Async handlers run on the loop; sync handlers run each in
a daemon thread of its own so they never block it (at most `concurrency` at once, besides
any that ran over their timeout and were abandoned). Several connections, each with one job:
claims, outcome writes (batched), heartbeats and reaping, and LISTEN for wake-ups.

With delete_on_complete, a finished job without a key is deleted, and counted per minute in
done_tally, instead of kept as a done row: no second row version or done-index entry per job.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import random
import socket
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple, assert_never

import psycopg
from psycopg import sql

from .backoff import delay as backoff_delay
from .db import aconnect, arun, first_line, is_connection_error, statements
from .domain import DEFAULT_LEASE_SECONDS, DEFAULT_SCHEMA, ClaimedJob, FailOutcome, Failure, JobStatus, Lease
from .errors import DatabaseUnavailable, InvalidInput, JobtuiError, PrivilegeMissing
from .link import Connection, Link
from .maintenance import ARCHIVE_TYPE, Retention, with_builtins
from .privileges import GRANTS_HINT, WORKER_NEEDS, missing_privileges_call, privilege_message
from .queue import (
    claim_call,
    complete_call,
    complete_deleting_call,
    fail_call,
    fail_permanently_call,
    heartbeat_call,
    reap_round_call,
    release_call,
)
from .registry import Handler, Job, Jobs, Permanent, Retry
from .scheduler import Scheduler

DEFAULT_RETENTION = Retention()

log = logging.getLogger("jobtui.worker")

# Outcomes are written as soon as the previous write returns; what finishes meanwhile joins
# the next statement, so batches form by themselves under load without a fixed delay (a
# fixed delay paced low concurrency).
FLUSH_DELAY = 0.0

# Releases that do not count as attempts (a handler's Retry, its own database errors) allowed
# in a row; the next one counts as a failed attempt, so no job loops forever.
MAX_UNCOUNTED_IN_A_ROW = 25

# A reaper reaps only once its rounds have come within half a lease of each other (by the
# database's clock) for this long, or the lease if shorter: after an outage, or a partition
# of the reaper itself, the other workers reconnect within about a second and extend or give
# back the leases that expired meanwhile, which the outage must not count against their jobs.
REAP_GRACE = 3.0

# A sync handler whose lease was given up gets this long to notice `job.lost` and return
# before its job is handed back (and may be claimed again).
ABANDON_GRACE = 5.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Outcome(enum.Enum):
    """What became of an attempt, and so which statement records it."""

    COMPLETE = "complete"
    PERMANENT = "permanent"  # the handler raised Permanent: failed for good
    FAIL = "fail"  # a counted failure: retried after backoff, or dead
    TIMEOUT = "timeout"  # a counted failure: the handler ran over its timeout
    RETRY = "retry"  # the handler raised Retry: released, not counted (bounded)
    DB_ERROR = "db_error"  # the handler's own database connection failed: as RETRY
    ABANDONED = "abandoned"  # the lease was lost while the handler ran: given up, not counted
    SHUTDOWN = "shutdown"  # the worker stopped before the handler finished: not counted

    @property
    def released(self) -> bool:
        """Written by the release statement (the attempt is not counted)."""
        return self in (Outcome.RETRY, Outcome.DB_ERROR, Outcome.ABANDONED, Outcome.SHUTDOWN)


# Told whether the outcome's row was written (False: the lease was lost meanwhile).
Written = Callable[[bool], None]


class _Pending(NamedTuple):
    outcome: Outcome
    lease: Lease
    error: str
    delay: float
    written: Written


class OutcomeWriter:
    """Writes job outcomes in batches; tells each submitter whether its row was written.

    Submitters hand over a callback rather than wait on a future: a job's task ends when
    its handler does, instead of waking once more per job to learn the write's result.
    """

    def __init__(
        self,
        conn: Connection,
        schema: str,
        on_dead: Callable[[FailOutcome], None],
        on_denied: Callable[[psycopg.errors.InsufficientPrivilege, str], None],
        *,
        delete_on_complete: bool = False,
    ) -> None:
        self._conn = conn
        self._schema = schema
        self._on_dead = on_dead
        self._on_denied = on_denied
        self._delete_on_complete = delete_on_complete
        self._pending: list[_Pending] = []
        self._wake = asyncio.Event()

    def submit(self, outcome: Outcome, lease: Lease, written: Written, error: str = "", delay: float = 0.0) -> None:
        """Queue an outcome; `written` is called once it was written or refused."""
        self._pending.append(_Pending(outcome, lease, error, delay, written))
        self._wake.set()

    async def write(self, outcome: Outcome, lease: Lease, error: str = "", delay: float = 0.0) -> bool:
        """Queue an outcome and wait until it is written; False means the lease was lost."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def settle(ok: bool) -> None:
            if not done.done():  # the waiter may have been cancelled
                done.set_result(ok)

        self.submit(outcome, lease, settle, error, delay)
        return await done

    async def run(self, stopped: asyncio.Event) -> None:
        while not (stopped.is_set() and not self._pending):
            if not self._pending:
                self._wake.clear()
                waiter = asyncio.ensure_future(self._wake.wait())
                stop_waiter = asyncio.ensure_future(stopped.wait())
                await asyncio.wait({waiter, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stop_waiter.cancel()
                continue
            await asyncio.sleep(FLUSH_DELAY)
            batch, self._pending = self._pending, []
            await self._flush(batch)

    async def _flush(self, batch: list[_Pending]) -> None:
        by_statement: dict[str, list[_Pending]] = {}
        for item in batch:
            statement = "release" if item.outcome.released else item.outcome.value
            by_statement.setdefault(statement, []).append(item)
        written: set[int] = set()
        for statement, items in by_statement.items():
            try:
                written |= await self._write(statement, items)
            except psycopg.errors.InsufficientPrivilege as exc:
                self._on_denied(exc, f"writing {statement} outcomes")
            except psycopg.Error as exc:
                # Not a lost connection (that is retried): the leases will expire and the
                # reaper will return these jobs.
                log.error("could not write %d %s outcome(s): %s", len(items), statement, first_line(exc))
            except Exception:  # a bug must not stop the writer; these leases expire as above
                log.exception("could not write %d %s outcome(s)", len(items), statement)
        for item in batch:
            try:
                item.written(item.lease.job_id in written)
            except Exception:  # one submitter's bug must not keep the others from learning
                log.exception("job %d: internal error after its outcome was written", item.lease.job_id)

    async def _write(self, statement: str, items: list[_Pending]) -> set[int]:
        leases = [i.lease for i in items]
        if statement == "complete":
            if not self._delete_on_complete:
                return await self._conn.run(complete_call(leases), self._schema)
            deleted = await self._conn.run(complete_deleting_call(leases), self._schema)
            # Keyed jobs are kept as done rows; complete also tells a lost lease apart.
            kept = [lease for lease in leases if lease.job_id not in deleted]
            if not kept:
                return deleted
            try:
                completed = await self._conn.run(complete_call(kept), self._schema)
            except psycopg.Error as exc:
                # The deleted jobs are done whatever happens to the rest.
                log.error("could not write %d complete outcome(s): %s", len(kept), first_line(exc))
                return deleted
            return deleted | completed
        if statement == "permanent":
            return await self._conn.run(fail_permanently_call(leases, [i.error for i in items]), self._schema)
        if statement == "release":
            kinds = [i.outcome.value for i in items]
            call = release_call(leases, [i.delay for i in items], kinds=kinds, reasons=[i.error for i in items])
            return await self._conn.run(call, self._schema)
        # fail and timeout: counted failures
        failures = [Failure(i.lease, i.error, i.delay) for i in items]
        outcomes = await self._conn.run(fail_call(failures), self._schema)
        for outcome in outcomes:
            if outcome.status is JobStatus.DEAD:
                self._on_dead(outcome)
        return {o.job_id for o in outcomes}


@dataclass
class InFlight:
    """A job this worker is running, as the console shows it."""

    job: Job
    claimed: ClaimedJob
    started: float
    deadline: float | None
    # Until when (time.monotonic()) the lease surely holds: the moment its claim or its last
    # successful heartbeat was sent, plus the lease the database granted from its own now().
    lease_until: float = 0.0
    task: asyncio.Task[None] | None = None
    # A sync handler's thread: set when it returned (it runs on after its task is cancelled).
    thread_ended: asyncio.Event | None = None
    # Set when the outcome is handed to the writer: from then on the row may leave
    # `running` at any moment, and the write itself tells whether the lease held.
    writing: bool = False


class Worker:
    """Runs handlers of `jobs` for jobs in the queue until stopped.

    Embeddable: `run()` installs no signal handlers; call `stop()` to shut down gracefully.
    Nor does it touch the garbage collector, which `jobtui worker` tunes for its own
    process (cli.WORKER_GC_THRESHOLD); a process of yours that mostly runs jobs gains the
    same with `gc.set_threshold(10_000)`.
    """

    def __init__(
        self,
        jobs: Jobs,
        dsn: str,
        *,
        concurrency: int = 10,
        types: Sequence[str] | None = None,
        lease: float = DEFAULT_LEASE_SECONDS,
        worker_id: str | None = None,
        schema: str = DEFAULT_SCHEMA,
        poll_interval: float = 1.0,
        heartbeat_interval: float | None = None,
        reap_interval: float | None = None,
        shutdown_timeout: float = 30.0,
        scheduler: bool = True,
        retention: Retention | None = DEFAULT_RETENTION,
        delete_on_complete: bool = False,
    ) -> None:
        if concurrency < 1:
            raise InvalidInput(f"concurrency must be at least 1, got {concurrency}")
        if not lease >= 1:
            raise InvalidInput(f"lease must be at least 1 second, got {lease}")
        if not poll_interval >= 0.01:  # 0 would spin on the database
            raise InvalidInput(f"poll interval must be at least 10ms, got {poll_interval}")
        handled = list(jobs.handlers)
        selected = list(types) if types else handled
        if retention is not None:
            # The built-in archive job runs on every worker, whatever types it was given.
            jobs = with_builtins(jobs, dsn, schema, retention)
            selected = [*selected, ARCHIVE_TYPE]
        unknown = [t for t in selected if t not in jobs.handlers]
        if unknown:
            raise InvalidInput(
                f"no handler for job type(s) {', '.join(unknown)}; registered: {', '.join(handled) or 'none'}"
            )
        if not selected:
            raise InvalidInput("the app registers no handlers: decorate functions with @jobs.handler(TYPE)")
        self.jobs = jobs
        self.dsn = dsn
        self.concurrency = concurrency
        self.types = selected
        self.lease = lease
        self.worker_id = worker_id or default_worker_id()
        self.schema = statements(schema).schema
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval or lease / 3
        # Rounds well within half a lease of each other (see _reap_loop).
        self.reap_interval = reap_interval or min(lease / 4, 15.0)
        # A lease is given up this long before it could expire, so that the handler has
        # stopped before any reaper can take the job back.
        self.lease_margin = min(1.0, lease / 10)
        self.shutdown_timeout = shutdown_timeout
        self.delete_on_complete = delete_on_complete
        self.scheduler = Scheduler(dsn, schema=schema, specs=list(jobs.schedules.values())) if scheduler else None
        self.in_flight: dict[int, InFlight] = {}
        self._busy = 0  # handlers running now (in_flight also holds outcomes being written)
        self._limits = {t: h.max_attempts for t, h in jobs.handlers.items()}
        self.paused = False
        self.counts = {
            "done": 0,
            "failed": 0,
            "retried": 0,
            "dead": 0,
            "lost": 0,
            "released": 0,
            "abandoned": 0,
        }
        # Why the worker stopped by itself (a privilege it lacks): raised by run().
        self.fatal: JobtuiError | None = None
        self._stopping: asyncio.Event | None = None
        self._kick: asyncio.Event | None = None
        self._link: Link | None = None
        self._background: set[asyncio.Future[None]] = set()  # hand-backs under way, and the like
        self._stopping_for_privilege = False
        self._rng = random.Random()
        self._running = False

    # -- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; in-flight jobs get `shutdown_timeout` seconds, then are released."""
        if self._stopping is not None:
            self._stopping.set()
        if self._kick is not None:
            self._kick.set()

    def pause(self) -> None:
        """Stop claiming new jobs; in-flight ones finish."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        if self._kick is not None:
            self._kick.set()

    @property
    def running(self) -> bool:
        return self._running

    # -- main loop -----------------------------------------------------------------------

    async def run(self) -> None:
        """Run until `stop()`; returns after in-flight jobs are finished or released.

        Raises PrivilegeMissing when the database role lacks a privilege the worker needs,
        at start or later (a revoked grant will not come back by itself).
        """
        self._stopping = asyncio.Event()
        self._kick = asyncio.Event()
        stopped_writing = asyncio.Event()
        # One link for every connection: after an outage they all come back together, and
        # claims, reaping, LISTEN and the scheduler wait until the heartbeat went first.
        link = self._link = Link(self.dsn, heartbeat_first=True)
        claim_conn = Connection(self.dsn, "claim", link=link, gated=True, on_connect=_claim_session)
        write_conn = Connection(self.dsn, "outcome", link=link)
        heartbeat_conn = Connection(self.dsn, "heartbeat", link=link)
        self._writer = OutcomeWriter(
            write_conn, self.schema, self._job_died, self._denied, delete_on_complete=self.delete_on_complete
        )
        try:
            missing = await write_conn.run(missing_privileges_call(self.schema, WORKER_NEEDS), self.schema)
            if missing:
                raise PrivilegeMissing(privilege_message("jobtui worker", missing))
            log.info(
                "worker %s started: types %s, concurrency %d, lease %.0fs",
                self.worker_id,
                ", ".join(self.types),
                self.concurrency,
                self.lease,
            )
            self._running = True
            background = [
                asyncio.create_task(self._writer.run(stopped_writing), name="jobtui-writer"),
                asyncio.create_task(self._heartbeat_loop(heartbeat_conn), name="jobtui-heartbeat"),
                asyncio.create_task(self._lease_watch_loop(), name="jobtui-lease-watch"),
                asyncio.create_task(self._reap_loop(claim_conn), name="jobtui-reaper"),
                asyncio.create_task(self._listen_loop(link), name="jobtui-listen"),
            ]
            if self.scheduler is not None:
                background.append(
                    asyncio.create_task(self.scheduler.run(self._stopping, link=link), name="jobtui-scheduler")
                )
            for task in background:
                task.add_done_callback(self._background_ended)
            try:
                await self._claim_loop(claim_conn)
                await self._drain()
            finally:
                stopped_writing.set()
                try:
                    await asyncio.wait_for(asyncio.shield(background[0]), timeout=self.shutdown_timeout + 5)
                except TimeoutError:
                    log.error("could not write the last outcomes: the database did not answer")
                for task in background:
                    task.remove_done_callback(self._background_ended)
                    task.cancel()
                for hand_back in self._background:
                    hand_back.cancel()
                await asyncio.gather(*background, *self._background, return_exceptions=True)
                # Outcomes the writer could not write in time: their leases expire and are reaped.
                self.in_flight.clear()
                self._running = False
                log.info("worker %s stopped: %s", self.worker_id, ", ".join(f"{k} {v}" for k, v in self.counts.items()))
        finally:
            for conn in (claim_conn, write_conn, heartbeat_conn):
                await conn.close()
            await link.close()
        if self.fatal is not None:
            raise self.fatal

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` beside the loops; cancelled when the worker stops."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _background_ended(self, task: asyncio.Task[Any]) -> None:
        """A background loop returned or died: the worker cannot go on without it."""
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, JobtuiError):
            self._stop_for(exc)
        elif exc is not None:
            log.error("%s stopped: %s", task.get_name(), first_line(exc), exc_info=exc)
            self._stop_for(JobtuiError(f"the worker's {task.get_name()} failed: {first_line(exc)}"))

    def _stop_for(self, error: JobtuiError) -> None:
        if self.fatal is None:
            self.fatal = error
            log.error("stopping: %s", error)
        self.stop()

    def _denied(self, exc: psycopg.errors.InsufficientPrivilege, what: str) -> None:
        """The database refused a statement for want of a privilege: that will not fix itself.
        The worker stops, naming what the role lacks."""
        if self.fatal is None and not self._stopping_for_privilege:
            self._stopping_for_privilege = True
            self._spawn(self._stop_for_privilege(exc, what))

    async def _stop_for_privilege(self, exc: psycopg.errors.InsufficientPrivilege, what: str) -> None:
        refused = f"{what} was refused ({first_line(exc)})"
        try:
            async with await aconnect(self.dsn, autocommit=True) as conn:
                missing = await arun(conn, missing_privileges_call(self.schema, WORKER_NEEDS), self.schema)
        except psycopg.Error:
            missing = []
        if missing:
            self._stop_for(PrivilegeMissing(f"{refused}: {privilege_message('jobtui worker', missing)}"))
        else:
            self._stop_for(PrivilegeMissing(f"{refused}; {GRANTS_HINT}"))

    async def _claim_loop(self, conn: Connection) -> None:
        assert self._stopping is not None and self._kick is not None
        while not self._stopping.is_set():
            # Handlers running stay within concurrency; outcomes still being written may add
            # up to as many again, which bounds the memory a slow database can cost.
            free = min(self.concurrency - self._busy, 2 * self.concurrency - len(self.in_flight))
            if self.paused or free <= 0:
                self._kick.clear()
                await self._wait_kick(self.poll_interval)
                continue
            # Clear before claiming: a notification arriving during the claim sets it again.
            self._kick.clear()
            try:
                claimed, sent = await conn.run_timed(
                    claim_call(
                        self.types, worker=self.worker_id, limit=free, lease=self.lease, max_attempts=self._limits
                    ),
                    self.schema,
                    self._stopping,
                )
            except (psycopg.OperationalError, DatabaseUnavailable):
                continue
            except psycopg.errors.InsufficientPrivilege as exc:
                self._denied(exc, "the claim")
                continue
            except psycopg.Error as exc:
                log.error("claim failed: %s", first_line(exc))
                await self._wait_kick(self.poll_interval)
                continue
            lease_until = sent + self.lease
            for job in claimed:
                self._start(job, lease_until)
            if len(claimed) < free:
                await self._wait_kick(self.poll_interval)

    async def _wait_kick(self, timeout: float) -> None:
        assert self._kick is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._kick.wait(), timeout)

    def _start(self, claimed: ClaimedJob, lease_until: float) -> None:
        handler = self.jobs.handlers[claimed.type]
        job = Job(claimed, self.worker_id, self.schema)
        now = time.monotonic()
        flight = InFlight(job, claimed, now, now + handler.timeout if handler.timeout else None, lease_until)
        self.in_flight[claimed.id] = flight
        self._busy += 1
        flight.task = asyncio.create_task(self._execute(handler, flight))

    async def _execute(self, handler: Handler, flight: InFlight) -> None:
        job = flight.job
        try:
            try:
                outcome, error, delay = await self._call(handler, flight)
            finally:
                # The handler is finished: its slot is free while the outcome is written, so
                # the next claim overlaps this write instead of waiting for it.
                self._busy -= 1
                if self._kick is not None:
                    self._kick.set()
            if job.lost:
                self._lost(job, "its lease was lost while it ran")
                return
            if outcome is Outcome.TIMEOUT:
                # A sync handler keeps running in its thread: refuse its later effects.
                job.mark_lost()
            if outcome in (Outcome.RETRY, Outcome.DB_ERROR) and flight.claimed.uncounted >= MAX_UNCOUNTED_IN_A_ROW:
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
        job = flight.job
        if not written:
            if outcome is not Outcome.ABANDONED:  # _give_up said it already
                self._lost(job, "its lease was lost before the outcome was written")
            return
        self._count(outcome, flight, error)
        if delay and self._kick is not None:
            # Wake up to claim it again when it is due, instead of at the next poll.
            asyncio.get_running_loop().call_later(delay, self._kick.set)

    def _finished(self, flight: InFlight) -> None:
        # The job may already run again here under a newer claim (a Retry without delay,
        # a lease lost and the job claimed back): that flight is not this one's to remove.
        if self.in_flight.get(flight.job.id) is flight:
            del self.in_flight[flight.job.id]
        if self._kick is not None:
            self._kick.set()

    async def _call(self, handler: Handler, flight: InFlight) -> tuple[Outcome, str, float]:
        """Run the handler; return (outcome, error text or reason, delay)."""
        job = flight.job
        try:
            if handler.is_async:
                if handler.timeout is None:
                    await handler.fn(job)
                else:
                    await asyncio.wait_for(handler.fn(job), handler.timeout)
            else:
                flight.thread_ended = asyncio.Event()
                await asyncio.wait_for(_in_thread(handler.fn, job, flight.thread_ended), handler.timeout)
            return Outcome.COMPLETE, "", 0.0
        except Permanent as exc:
            return Outcome.PERMANENT, _error_text(exc), 0.0
        except Retry as exc:
            return Outcome.RETRY, str(exc), exc.delay
        except TimeoutError:
            return (
                Outcome.TIMEOUT,
                f"TimeoutError: handler ran over its timeout of {handler.timeout}s",
                self._backoff(handler, job),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if is_handler_connection_error(exc):
                return Outcome.DB_ERROR, _error_text(exc), self._backoff(handler, job)
            return Outcome.FAIL, _error_text(exc), self._backoff(handler, job)

    def _backoff(self, handler: Handler, job: Job) -> float:
        return backoff_delay(job.attempt, handler.backoff, self._rng)

    def _count(self, outcome: Outcome, flight: InFlight, error: str) -> None:
        job = flight.job
        match outcome:
            case Outcome.COMPLETE:
                self.counts["done"] += 1
            case Outcome.PERMANENT:
                self.counts["failed"] += 1
                log.warning(
                    "job %d (%s) failed permanently on attempt %d: %s", job.id, job.type, job.attempt, _first(error)
                )
            case Outcome.RETRY | Outcome.SHUTDOWN:
                self.counts["released"] += 1
            case Outcome.DB_ERROR:
                self.counts["released"] += 1
                log.warning(
                    "job %d (%s) attempt %d: the handler's database connection failed; released, "
                    "not counted (%d of %d in a row): %s",
                    job.id,
                    job.type,
                    job.attempt,
                    flight.claimed.uncounted + 1,
                    MAX_UNCOUNTED_IN_A_ROW,
                    _first(error),
                )
            case Outcome.ABANDONED:
                self.counts["abandoned"] += 1
                log.warning("job %d (%s): released, attempt %d not counted", job.id, job.type, job.attempt)
            case Outcome.FAIL | Outcome.TIMEOUT:
                if job.attempt < job.max_attempts:
                    self.counts["retried"] += 1
                    log.warning(
                        "job %d (%s) attempt %d of %d failed, will retry: %s",
                        job.id,
                        job.type,
                        job.attempt,
                        job.max_attempts,
                        _first(error),
                    )
            case _:
                assert_never(outcome)

    def _lost(self, job: Job, why: str) -> None:
        self.counts["lost"] += 1
        log.warning("job %d (%s) attempt %d: outcome not written, %s", job.id, job.type, job.attempt, why)

    def _job_died(self, outcome: FailOutcome) -> None:
        self.counts["dead"] += 1
        log.error(
            "job %d (%s) is dead after %d of %d attempts",
            outcome.job_id,
            outcome.type,
            outcome.attempt,
            outcome.max_attempts,
        )
        for callback in self.jobs.dead_callbacks:
            try:
                callback(outcome)
            except Exception:  # a user's callback must not stop the worker
                log.exception("on_dead callback failed for job %d", outcome.job_id)

    # -- leases --------------------------------------------------------------------------

    def _give_up(self, flight: InFlight, why: str) -> None:
        """The lease is lost or may be: stop the handler and hand the job back, uncounted.

        An async handler is cancelled; a sync one cannot be stopped, but its `job.lost` is
        set and `job.once()` refuses from now on. Its outcome is discarded. The job is handed
        back once the handler has stopped (a sync one gets ABANDON_GRACE to notice), so that
        this worker never claims it again while it still runs here. The release is fenced by
        the lease token: it matches nothing when another worker took the job, and returns it
        without counting the attempt when nobody did (the database was away).
        """
        job = flight.job
        job.mark_lost()
        flight.writing = True  # the release finishes the flight
        log.warning(
            "job %d (%s) attempt %d: %s; %s, its outcome will be discarded",
            job.id,
            job.type,
            job.attempt,
            why,
            "handler cancelled" if self.jobs.handlers[job.type].is_async else "job.lost set for its sync handler",
        )
        if flight.task is not None and not flight.task.done():
            flight.task.cancel()
        self._spawn(self._hand_back(flight, why))

    async def _hand_back(self, flight: InFlight, why: str) -> None:
        running: list[asyncio.Future[Any]] = [f for f in (flight.task,) if f is not None and not f.done()]
        if flight.thread_ended is not None and not flight.thread_ended.is_set():
            running.append(asyncio.ensure_future(flight.thread_ended.wait()))
        if running:
            _, late = await asyncio.wait(running, timeout=ABANDON_GRACE)
            if late:
                log.warning(
                    "job %d (%s): its handler still runs %.0fs after its lease was given up; handing the job back",
                    flight.job.id,
                    flight.job.type,
                    ABANDON_GRACE,
                )
        written = partial(self._written, flight, Outcome.ABANDONED, why, 0.0)
        self._writer.submit(Outcome.ABANDONED, flight.claimed.lease, written, f"attempt given up: {why}")

    async def _lease_watch_loop(self) -> None:
        """Give up every lease that was not extended in time, by the database's clock as the
        last successful heartbeat (or the claim) reported it; needs no database itself."""
        while True:
            now = time.monotonic()
            earliest: float | None = None
            for flight in list(self.in_flight.values()):
                if flight.writing or flight.job.lost:
                    continue
                give_up_at = flight.lease_until - self.lease_margin
                if now >= give_up_at:
                    ago = now - (flight.lease_until - self.lease)
                    self._give_up(flight, f"its lease was not extended in time (last extended {ago:.1f}s ago)")
                elif earliest is None or give_up_at < earliest:
                    earliest = give_up_at
            wait = 0.5 if earliest is None else earliest - now
            await asyncio.sleep(min(0.5, max(0.02, wait)))

    async def _heartbeat_loop(self, conn: Connection) -> None:
        assert self._link is not None
        link = self._link
        while True:
            # Every interval, and at once when the database is back after an outage.
            await link.wait_for(lambda: link.heartbeat_due, timeout=self.heartbeat_interval)
            await link.wait(False)
            generation = link.generation
            try:
                await self.heartbeat_now(conn)
            except (psycopg.OperationalError, DatabaseUnavailable):
                continue  # the link is down: the heartbeat is due again once the database is back
            except psycopg.errors.InsufficientPrivilege as exc:
                self._denied(exc, "the heartbeat")
                continue
            except psycopg.Error as exc:
                log.warning("heartbeat failed: %s", first_line(exc))
                continue
            link.opened(generation)

    async def heartbeat_now(self, conn: Connection) -> None:
        """Extend every in-flight lease in one statement; give up the ones lost.

        Raises connection errors (the caller waits for the database, then tries again with
        the jobs in flight then, rather than with this statement's).
        """
        now = time.monotonic()
        # A job over its timeout gets no more heartbeats: its lease may expire and be reaped.
        flights = [
            f
            for f in self.in_flight.values()
            if not f.job.lost and not f.writing and (f.deadline is None or now < f.deadline)
        ]
        if not flights:
            return
        held, sent = await conn.run_timed(
            heartbeat_call([f.claimed.lease for f in flights], self.lease), self.schema, retry=False
        )
        lease_until = sent + self.lease
        for flight in flights:
            if flight.writing or flight.job.lost:
                continue  # finished (or given up) while the heartbeat ran
            if flight.claimed.id in held:
                flight.lease_until = lease_until
            else:
                self._give_up(flight, "its lease was lost (expired, reaped, killed or cancelled)")

    async def _reap_loop(self, conn: Connection) -> None:
        """Take back expired leases of other workers, but only while in touch.

        Each round tells the database when the previous one ran; a round that runs more than
        half a lease after it reaps nothing (the reaper was cut off, or its statement waited
        out a partition), and reaping starts again once the rounds have kept in touch for
        REAP_GRACE. Half a lease is less than any outage that can have let another worker's
        lease expire (its heartbeat comes every third of a lease).
        """
        continuity = self.lease / 2
        grace = timedelta(seconds=min(REAP_GRACE, self.lease))
        previous: datetime | None = None  # the database's now() at the previous round
        in_touch_since: datetime | None = None
        while True:
            # Spread reapers of many workers over the interval.
            await asyncio.sleep(self.reap_interval * (0.75 + self._rng.random() / 2))
            ready = previous is not None and in_touch_since is not None and previous - in_touch_since >= grace
            call = reap_round_call(previous if ready else None, continuity, own=list(self.in_flight))
            try:
                reaped = await conn.run(call, self.schema)
            except psycopg.errors.InsufficientPrivilege as exc:
                self._denied(exc, "reaping expired leases")
                continue
            except psycopg.Error as exc:
                log.warning("reap failed: %s", first_line(exc))
                continue
            if previous is None or (reaped.at - previous).total_seconds() >= continuity:
                in_touch_since = reaped.at
            previous = reaped.at
            for job in reaped.reaped:
                if job.status is JobStatus.DEAD:
                    self._job_died(FailOutcome(job.job_id, job.status, job.type, job.attempt, job.attempt, job.worker))
                else:
                    log.warning(
                        "job %d (%s) attempt %d: lease of worker %s expired; back to ready",
                        job.job_id,
                        job.type,
                        job.attempt,
                        job.worker,
                    )

    async def _listen_loop(self, link: Link) -> None:
        assert self._kick is not None
        channel = statements(self.schema).channel

        async def subscribe(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

        listener = Connection(self.dsn, "listen", link=link, gated=True, on_connect=subscribe)
        try:
            while True:
                conn = await listener.get()
                self._kick.set()  # notifications may have been missed while disconnected
                try:
                    async for _ in conn.notifies():
                        self._kick.set()
                except psycopg.OperationalError as exc:
                    listener.lost(exc)
        finally:
            await listener.close()

    # -- shutdown ------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Wait for in-flight jobs up to the shutdown timeout, then release the rest."""
        tasks = [f.task for f in self.in_flight.values() if f.task is not None and not f.task.done()]
        if tasks:
            log.info("waiting up to %.0fs for %d in-flight job(s)", self.shutdown_timeout, len(tasks))
            await asyncio.wait(tasks, timeout=self.shutdown_timeout)
        # Outcomes handed to the writer are written before it stops; the rest go back.
        left = [f for f in self.in_flight.values() if not f.writing]
        if not left:
            return
        for flight in left:
            flight.job.mark_lost()
            if flight.task is not None:
                flight.task.cancel()
        reason = "the worker stopped before the handler finished"
        releases = asyncio.gather(*(self._writer.write(Outcome.SHUTDOWN, f.claimed.lease, reason) for f in left))
        try:
            released = sum(await asyncio.wait_for(releases, self.shutdown_timeout))
        except TimeoutError:
            log.error("could not release %d unfinished job(s): the database did not answer; their leases will expire",
                      len(left))  # fmt: skip
            return
        self.counts["released"] += released
        log.warning("released %d unfinished job(s) back to ready, attempts not counted", released)


def is_handler_connection_error(exc: BaseException) -> bool:
    """Whether a handler's exception is its database connection failing rather than the job:
    the error itself (see db.is_connection_error), or one that a database library wraps it in
    and keeps as `orig` (SQLAlchemy's DBAPIError)."""
    orig = getattr(exc, "orig", None)
    return is_connection_error(exc) or (isinstance(orig, BaseException) and is_connection_error(orig))


def _in_thread(fn: Callable[[Job], Any], job: Job, ended: asyncio.Event) -> asyncio.Future[Any]:
    """Run a sync handler in a daemon thread of its own; the future settles when it returns,
    and `ended` is set then too, even after the future was cancelled.

    Not a pool: a thread abandoned at its timeout or at shutdown (Python cannot stop it)
    must neither hold up the jobs claimed after it nor keep the process from exiting; its
    job is marked lost, so `Job.once` refuses its late effects.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        ended.set()
        if future.done():  # cancelled: the handler ran over its timeout or was abandoned
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def target() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn(job)
        except BaseException as exc:  # handed to the loop, as a thread pool would
            error = exc
        # The loop is closed when the worker stopped before the handler returned.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=f"jobtui-handler-{job.id}", daemon=True).start()
    return future


async def _claim_session(conn: psycopg.AsyncConnection[Any]) -> None:
    """Settings of the claiming connection: the claim must walk the ready index in order,
    and its rows should cost the worker little to read.

    After a bulk enqueue, statistics lag (autovacuum analyzes later) and the planner may
    choose a bitmap scan that sorts every ready row to take the first few hundred; on this
    connection, which runs nothing but claims, those plans are switched off.
    """
    await conn.execute("SET enable_bitmapscan = off")
    await conn.execute("SET enable_seqscan = off")
    await conn.execute("SET jit = off")
    # Timestamps in UTC load twice as fast as in a named zone (even 'Etc/UTC'), and the
    # claim returns three per job. The same instants, only shown in another zone.
    await conn.execute("SET TimeZone = 'UTC'")


def _error_text(exc: BaseException) -> str:
    """The error class and message, then the traceback, for the job's history."""
    head = f"{type(exc).__name__}: {exc}"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{head}\n{tb}"


def _first(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
