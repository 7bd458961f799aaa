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
import logging
import os
import random
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from .backoff import delay as backoff_delay
from .db import Connection, statements
from .domain import DEFAULT_LEASE_SECONDS, DEFAULT_SCHEMA, ClaimedJob, FailOutcome, Failure, JobStatus, Lease
from .errors import InvalidInput
from .maintenance import ARCHIVE_TYPE, Retention, with_builtins
from .queue import (
    claim_call,
    complete_call,
    complete_deleting_call,
    fail_call,
    fail_permanently_call,
    heartbeat_call,
    reap_call,
    release_call,
)
from .registry import Handler, Job, Jobs, Permanent, Retry
from .scheduler import Scheduler

DEFAULT_RETENTION = Retention()

log = logging.getLogger("jobtui.worker")

# Outcomes are written as soon as the previous write returns; what finishes meanwhile joins
# the next statement, so batches form by themselves under load without a fixed delay (a
# fixed delay paced low concurrency: 2 ms cost a quarter of the drain at concurrency 10).
FLUSH_DELAY = 0.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# Told whether the outcome's row was written (False: the lease was lost meanwhile).
Written = Callable[[bool], None]


class _Pending(NamedTuple):
    kind: str
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
        self, conn: Connection, schema: str, on_dead: Callable[[FailOutcome], None], *, delete_on_complete: bool = False
    ) -> None:
        self._conn = conn
        self._schema = schema
        self._on_dead = on_dead
        self._delete_on_complete = delete_on_complete
        self._pending: list[_Pending] = []
        self._wake = asyncio.Event()

    def submit(self, kind: str, lease: Lease, written: Written, error: str = "", delay: float = 0.0) -> None:
        """Queue an outcome; `written` is called once it was written or refused."""
        self._pending.append(_Pending(kind, lease, error, delay, written))
        self._wake.set()

    async def write(self, kind: str, lease: Lease, error: str = "", delay: float = 0.0) -> bool:
        """Queue an outcome and wait until it is written; False means the lease was lost."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def settle(ok: bool) -> None:
            if not done.done():  # the waiter may have been cancelled
                done.set_result(ok)

        self.submit(kind, lease, settle, error, delay)
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
        by_kind: dict[str, list[_Pending]] = {}
        for item in batch:
            by_kind.setdefault(item.kind, []).append(item)
        written: set[int] = set()
        for kind, items in by_kind.items():
            try:
                written |= await self._write(kind, items)
            except psycopg.Error as exc:
                # Not a lost connection (that is retried): the leases will expire and the
                # reaper will return these jobs.
                log.error("could not write %d %s outcome(s): %s", len(items), kind, _first(str(exc)))
            except Exception:  # a bug must not stop the writer; these leases expire as above
                log.exception("could not write %d %s outcome(s)", len(items), kind)
        for item in batch:
            try:
                item.written(item.lease.job_id in written)
            except Exception:  # one submitter's bug must not keep the others from learning
                log.exception("job %d: internal error after its outcome was written", item.lease.job_id)

    async def _write(self, kind: str, items: list[_Pending]) -> set[int]:
        leases = [i.lease for i in items]
        if kind == "complete":
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
                log.error("could not write %d complete outcome(s): %s", len(kept), _first(str(exc)))
                return deleted
            return deleted | completed
        if kind == "permanent":
            return await self._conn.run(fail_permanently_call(leases, [i.error for i in items]), self._schema)
        if kind == "release":
            return await self._conn.run(release_call(leases, [i.delay for i in items]), self._schema)
        if kind == "fail":
            failures = [Failure(i.lease, i.error, i.delay) for i in items]
            outcomes = await self._conn.run(fail_call(failures), self._schema)
            for outcome in outcomes:
                if outcome.status is JobStatus.DEAD:
                    self._on_dead(outcome)
            return {o.job_id for o in outcomes}
        raise AssertionError(kind)


@dataclass
class InFlight:
    """A job this worker is running, as the console shows it."""

    job: Job
    claimed: ClaimedJob
    started: float
    deadline: float | None
    task: asyncio.Task[None] | None = None
    # Set when the outcome is handed to the writer: from then on the row may leave
    # `running` at any moment, and the write itself tells whether the lease held.
    writing: bool = False


class Worker:
    """Runs handlers of `jobs` for jobs in the queue until stopped.

    Embeddable: `run()` installs no signal handlers; call `stop()` to shut down gracefully.
    Nor does it touch the garbage collector, which `jobtui worker` tunes for its own
    process (cli.WORKER_GC_THRESHOLD: a sixth less worker CPU per job); a process of yours
    that mostly runs jobs gains the same with `gc.set_threshold(10_000)`.
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
        self.reap_interval = reap_interval or min(lease / 2, 15.0)
        self.shutdown_timeout = shutdown_timeout
        self.delete_on_complete = delete_on_complete
        self.scheduler = Scheduler(dsn, schema=schema, specs=list(jobs.schedules.values())) if scheduler else None
        self.in_flight: dict[int, InFlight] = {}
        self._busy = 0  # handlers running now (in_flight also holds outcomes being written)
        self._limits = {t: h.max_attempts for t, h in jobs.handlers.items()}
        self.paused = False
        self.counts = {"done": 0, "failed": 0, "retried": 0, "dead": 0, "lost": 0, "released": 0}
        self._stopping: asyncio.Event | None = None
        self._kick: asyncio.Event | None = None
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
        """Run until `stop()`; returns after in-flight jobs are finished or released."""
        self._stopping = asyncio.Event()
        self._kick = asyncio.Event()
        stopped_writing = asyncio.Event()
        claim_conn = Connection(self.dsn, "claim", on_connect=_claim_session)
        write_conn = Connection(self.dsn, "outcome")
        maint_conn = Connection(self.dsn, "heartbeat")
        self._writer = OutcomeWriter(
            write_conn, self.schema, self._job_died, delete_on_complete=self.delete_on_complete
        )
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
            asyncio.create_task(self._heartbeat_loop(maint_conn), name="jobtui-heartbeat"),
            asyncio.create_task(self._reap_loop(maint_conn), name="jobtui-reaper"),
            asyncio.create_task(self._listen_loop(), name="jobtui-listen"),
        ]
        if self.scheduler is not None:
            background.append(asyncio.create_task(self.scheduler.run(self._stopping), name="jobtui-scheduler"))
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
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            # Outcomes the writer could not write in time: their leases expire and are reaped.
            self.in_flight.clear()
            for conn in (claim_conn, write_conn, maint_conn):
                await conn.close()
            self._running = False
            log.info("worker %s stopped: %s", self.worker_id, ", ".join(f"{k} {v}" for k, v in self.counts.items()))

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
                claimed = await conn.run(
                    claim_call(
                        self.types, worker=self.worker_id, limit=free, lease=self.lease, max_attempts=self._limits
                    ),
                    self.schema,
                    self._stopping,
                )
            except psycopg.OperationalError:
                continue
            except psycopg.Error as exc:
                log.error("claim failed: %s", str(exc).strip().splitlines()[0])
                await self._wait_kick(self.poll_interval)
                continue
            for job in claimed:
                self._start(job)
            if len(claimed) < free:
                await self._wait_kick(self.poll_interval)

    async def _wait_kick(self, timeout: float) -> None:
        assert self._kick is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._kick.wait(), timeout)

    def _start(self, claimed: ClaimedJob) -> None:
        handler = self.jobs.handlers[claimed.type]
        job = Job(claimed, self.worker_id, self.schema)
        now = time.monotonic()
        flight = InFlight(job, claimed, now, now + handler.timeout if handler.timeout else None)
        self.in_flight[claimed.id] = flight
        self._busy += 1
        flight.task = asyncio.create_task(self._execute(handler, flight))

    async def _execute(self, handler: Handler, flight: InFlight) -> None:
        job = flight.job
        try:
            try:
                kind, error, delay = await self._call(handler, job)
            finally:
                # The handler is finished: its slot is free while the outcome is written, so
                # the next claim overlaps this write instead of waiting for it.
                self._busy -= 1
                if self._kick is not None:
                    self._kick.set()
            if job.lost:
                self._lost(job, "its lease was lost while it ran")
                return
            if kind == "timeout":
                # A sync handler keeps running in its thread: refuse its later effects.
                job.mark_lost()
                kind = "fail"
            # From here the writer owns the job: _written finishes it.
            written = partial(self._written, flight, kind, error, delay)
            self._writer.submit(kind, flight.claimed.lease, written, error, delay)
            flight.writing = True
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in the worker itself must not kill the loop
            log.exception("job %d (%s): internal error while finishing", job.id, job.type)
        finally:
            if not flight.writing:
                self._finished(flight)

    def _written(self, flight: InFlight, kind: str, error: str, delay: float, written: bool) -> None:
        """The writer wrote the job's outcome (or found its lease lost)."""
        self._finished(flight)
        job = flight.job
        if not written:
            self._lost(job, "its lease was lost before the outcome was written")
            return
        self._count(kind, job, error)
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

    async def _call(self, handler: Handler, job: Job) -> tuple[str, str, float]:
        """Run the handler; return (outcome kind, error text, delay)."""
        try:
            if handler.is_async:
                if handler.timeout is None:
                    await handler.fn(job)
                else:
                    await asyncio.wait_for(handler.fn(job), handler.timeout)
            else:
                await asyncio.wait_for(_in_thread(handler.fn, job), handler.timeout)
            return "complete", "", 0.0
        except Permanent as exc:
            return "permanent", _error_text(exc), 0.0
        except Retry as exc:
            return "release", "", exc.delay
        except TimeoutError:
            return (
                "timeout",
                f"TimeoutError: handler ran over its timeout of {handler.timeout}s",
                self._backoff(handler, job),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return "fail", _error_text(exc), self._backoff(handler, job)

    def _backoff(self, handler: Handler, job: Job) -> float:
        return backoff_delay(job.attempt, handler.backoff, self._rng)

    def _count(self, kind: str, job: Job, error: str) -> None:
        if kind == "complete":
            self.counts["done"] += 1
        elif kind == "permanent":
            self.counts["failed"] += 1
            log.warning(
                "job %d (%s) failed permanently on attempt %d: %s", job.id, job.type, job.attempt, _first(error)
            )
        elif kind == "release":
            self.counts["released"] += 1
        elif job.attempt < job.max_attempts:
            self.counts["retried"] += 1
            log.warning(
                "job %d (%s) attempt %d of %d failed, will retry: %s",
                job.id,
                job.type,
                job.attempt,
                job.max_attempts,
                _first(error),
            )

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

    async def _heartbeat_loop(self, conn: Connection) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            await self.heartbeat_now(conn)

    async def heartbeat_now(self, conn: Connection) -> None:
        """Extend every in-flight lease in one statement; mark the ones lost."""
        now = time.monotonic()
        # A job over its timeout gets no more heartbeats: its lease may expire and be reaped.
        flights = [
            f
            for f in self.in_flight.values()
            if not f.job.lost and not f.writing and (f.deadline is None or now < f.deadline)
        ]
        if not flights:
            return
        try:
            held = await conn.run(heartbeat_call([f.claimed.lease for f in flights], self.lease), self.schema)
        except psycopg.Error as exc:
            log.warning("heartbeat failed: %s", str(exc).strip().splitlines()[0])
            return
        for flight in flights:
            # A job whose outcome was written while the heartbeat ran is not lost: done.
            if flight.claimed.id not in held and not flight.job.lost and not flight.writing:
                flight.job.mark_lost()
                log.warning(
                    "job %d (%s) attempt %d: lease lost (reaped, killed or cancelled); its outcome will be discarded",
                    flight.job.id,
                    flight.job.type,
                    flight.job.attempt,
                )

    async def _reap_loop(self, conn: Connection) -> None:
        while True:
            # Spread reapers of many workers over the interval.
            await asyncio.sleep(self.reap_interval * (0.75 + self._rng.random() / 2))
            try:
                reaped = await conn.run(reap_call(), self.schema)
            except psycopg.Error as exc:
                log.warning("reap failed: %s", str(exc).strip().splitlines()[0])
                continue
            for job in reaped:
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

    async def _listen_loop(self) -> None:
        assert self._kick is not None
        channel = statements(self.schema).channel

        async def subscribe(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

        listener = Connection(self.dsn, "listen", on_connect=subscribe)
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
        releases = asyncio.gather(*(self._writer.write("release", f.claimed.lease) for f in left))
        try:
            released = sum(await asyncio.wait_for(releases, self.shutdown_timeout))
        except TimeoutError:
            log.error("could not release %d unfinished job(s): the database did not answer; their leases will expire",
                      len(left))  # fmt: skip
            return
        self.counts["released"] += released
        log.warning("released %d unfinished job(s) back to ready, attempts not counted", released)


def _in_thread(fn: Callable[[Job], Any], job: Job) -> asyncio.Future[Any]:
    """Run a sync handler in a daemon thread of its own; the future settles when it returns.

    Not a pool: a thread abandoned at its timeout or at shutdown (Python cannot stop it)
    must neither hold up the jobs claimed after it nor keep the process from exiting; its
    job is marked lost, so `Job.once` refuses its late effects.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
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
