"""The worker: claims jobs, runs their handlers, keeps their leases, writes their outcomes.

    worker = Worker(jobs, dsn, concurrency=20)       # or queues={"emails": 20, "reports": 2}
    asyncio.run(worker.run())         # until worker.stop() (or SIGTERM in `jobtui worker`)

One asyncio loop per process, and parts that each do one thing, wired here: the producers
(one per pool of slots, slots.py) claim, the executor runs handlers, the completer writes
outcomes in batches, the heartbeater keeps leases (and gives up those it could not keep), the
reaper takes back other workers' expired leases, the listener wakes the producers and
passes cancels on, and the worker's presence keeps its row in the fleet (core/members.py) and
obeys the orders given there (quiet, resume, stop). The jobs in flight and what becomes of them are in flights.py. With
delete_on_complete, a finished job without a key is deleted and counted per minute in
done_tally instead of kept as a done row: no second row version or done-index entry per job.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import fields
from functools import partial
from typing import Any

import psycopg

from jobtui.core.claims import claim_builtin_call, claim_call, claim_session, claim_transaction, release_unanswered_call
from jobtui.core.maintenance import ARCHIVE_TYPE, BUILTIN_QUEUE, BUILTIN_TYPES, Retention
from jobtui.core.members import Kind, Presence
from jobtui.core.privileges import GRANTS_HINT, WORKER_NEEDS, missing_privileges_call, privilege_message
from jobtui.core.registry import Handler, Job, Jobs
from jobtui.core.scheduler import Scheduler
from jobtui.kernel.backoff import delay as backoff_delay
from jobtui.kernel.checks import check_queue
from jobtui.kernel.db import Call, aconnect, arun, first_line, pooler_mode, statements, transaction_pooled
from jobtui.kernel.domain import DEFAULT_LEASE_SECONDS, DEFAULT_SCHEMA, ClaimedJob, FailOutcome
from jobtui.kernel.errors import InvalidInput, JobtuiError, PrivilegeMissing
from jobtui.kernel.link import Connection, Link
from jobtui.kernel.logformat import job_fields
from jobtui.kernel.timeouts import within
from jobtui.reads.health import Health
from jobtui.worker.child import Settings
from jobtui.worker.children import ChildPool, memory_available
from jobtui.worker.completer import OutcomeWriter
from jobtui.worker.config import (
    DEFAULT_EXECUTOR,
    DEFAULT_RETENTION,
    WorkerSettings,
    default_worker_id,
    executors,
    handled_types,
    registry_spec,
    uses_processes,
)
from jobtui.worker.events import Events
from jobtui.worker.executor import InFlight
from jobtui.worker.flights import Flights
from jobtui.worker.heartbeater import Heartbeater
from jobtui.worker.listener import listen, listener_connection
from jobtui.worker.presence import member_of, obey, status_of
from jobtui.worker.producer import Claiming, Producer, Starting
from jobtui.worker.reaper import Reaper
from jobtui.worker.shutdown import drain
from jobtui.worker.slots import Slots, describe

COUNTERS = ("done", "failed", "retried", "dead", "lost", "released", "abandoned", "cancelled")

log = logging.getLogger("jobtui.worker")


class Worker(Flights):
    """Runs handlers of `jobs` for jobs in the queue until stopped.

    Embeddable: `run()` installs no signal handlers; call `stop()` to shut down gracefully.
    Nor does it touch the garbage collector, which `jobtui worker` tunes for its own
    process (config.GC_THRESHOLD); a process of yours that mostly runs jobs gains the
    same with `gc.set_threshold(config.GC_THRESHOLD)`.
    """

    def __init__(
        self,
        jobs: Jobs,
        dsn: str,
        *,
        concurrency: int = 10,
        types: Sequence[str] | None = None,
        queues: Mapping[str, int] | None = None,
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
        pooler: str | None = None,
        listen_dsn: str | None = None,
        executor: str = DEFAULT_EXECUTOR,
        max_jobs_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        app: str | None = None,
        health: Health | None = None,
    ) -> None:
        settings = WorkerSettings(
            dsn,
            concurrency=concurrency,
            types=tuple(types) if types is not None else None,
            queues=queues,
            lease=lease,
            worker_id=worker_id,
            schema=schema,
            poll_interval=poll_interval,
            heartbeat_interval=heartbeat_interval,
            reap_interval=reap_interval,
            shutdown_timeout=shutdown_timeout,
            scheduler=scheduler,
            retention=retention,
            delete_on_complete=delete_on_complete,
            pooler=pooler,
            listen_dsn=listen_dsn,
            executor=executor,
            max_jobs_per_child=max_jobs_per_child,
            max_memory_per_child=max_memory_per_child,
            app=app,
        )
        self._set_up(jobs, settings, health)

    @classmethod
    def with_settings(cls, jobs: Jobs, settings: WorkerSettings, *, health: Health | None = None) -> Worker:
        """A worker of `settings` (as `jobtui worker` makes it), rather than of keywords."""
        given = {f.name: getattr(settings, f.name) for f in fields(settings)}
        return cls(jobs, **given, health=health)

    def _set_up(self, jobs: Jobs, settings: WorkerSettings, health: Health | None) -> None:
        self.settings = settings
        dsn, app, executor, queues = settings.dsn, settings.app, settings.executor, settings.queues
        registry = jobs
        pooler = pooler_mode(settings.pooler)
        jobs, selected = handled_types(jobs, settings.types, settings.retention, dsn, settings.schema, pooler)
        self.jobs = jobs
        # Where each type's handler runs; sync ones in `executor` unless the handler names one.
        self.executor = executor
        self._executors = executors(jobs, executor)
        self.app = app
        if uses_processes(self._executors, selected):
            self.app = app or registry_spec(registry)
            if self.app is None:
                raise InvalidInput(
                    "the process executor runs handlers in processes that import the registry by name: "
                    "define it at module level of an importable module, or pass app='pkg.module:jobs'"
                )
            if settings.max_memory_per_child is not None and not memory_available():
                raise InvalidInput("--max-memory-per-child reads /proc (Linux); leave it out on this system")
        self.max_jobs_per_child = settings.max_jobs_per_child
        self.max_memory_per_child = settings.max_memory_per_child
        # The handler processes, while the worker runs with any type in process mode.
        self.children: ChildPool | None = None
        self.dsn = dsn
        # One pool of slots per queue named, or one for every queue (None). Each pool claims
        # its queue's jobs of the worker's types.
        sizes: dict[str | None, int] = {None: settings.concurrency}
        if queues:
            sizes = {check_queue(q): n for q, n in queues.items()}
        self._pool_claims: dict[str | None, tuple[list[str], str | None]] = {q: (selected, q) for q in sizes}
        builtins = [t for t in BUILTIN_TYPES if t in selected]
        # The slot of jobtui's own jobs claims with claim_builtin, not the claim of the ready index.
        self._builtin_slot = bool(builtins and BUILTIN_QUEUE not in sizes)
        if self._builtin_slot:
            # jobtui's own jobs (the archiver) run on every worker, whatever queues it serves:
            # a slot of their own, claiming them from their queue through its own index
            # (claim_builtin). A worker of every queue needs it too: its claims take the
            # oldest jobs first, and an archiver's job, due now, would wait behind any older
            # backlog. A scheduler of the previous release put them in 'default', where the
            # workers serving it run them.
            sizes[BUILTIN_QUEUE] = 1
            self._pool_claims[BUILTIN_QUEUE] = (builtins, BUILTIN_QUEUE)
        # jobtui's own jobs come once a minute: their slot polls, woken by no enqueue.
        self.slots = Slots(sizes, polled=[BUILTIN_QUEUE] if self._builtin_slot else [])
        self.concurrency = self.slots.total
        self.types = selected
        self.timing = settings.timing
        self.lease = settings.lease
        self.worker_id = settings.worker_id or default_worker_id()
        self.schema = statements(settings.schema).schema
        self.poll_interval = settings.poll_interval
        self.heartbeat_interval = self.timing.heartbeat_interval
        self.reap_interval = self.timing.reap_interval
        self.lease_margin = self.timing.margin
        self.stop_grace = self.timing.stop_grace
        self.shutdown_timeout = settings.shutdown_timeout
        self.delete_on_complete = settings.delete_on_complete
        # Behind a transaction pooler (see db.pooler_mode); LISTEN then needs a direct DSN.
        self.pooler = pooler
        self.listen_dsn = settings.listen_dsn or None
        self.scheduler = None
        if settings.scheduler:
            self.scheduler = Scheduler(dsn, schema=settings.schema, specs=jobs.schedule_specs(), pooler=self.pooler)
        self.in_flight: dict[int, InFlight] = {}
        self._limits = {t: h.max_attempts for t, h in jobs.handlers.items()}
        # What became of this worker's attempts, public (docs/operations.md, "Worker counters");
        # the built-in jobs (the archiver) count apart, in builtin_counts.
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.builtin_counts = dict.fromkeys(COUNTERS, 0)
        # Why the worker stopped by itself (a privilege it lacks): raised by run().
        self.fatal: JobtuiError | None = None
        self._stopping: asyncio.Event | None = None
        self._link: Link | None = None
        self._background: set[asyncio.Future[None]] = set()  # hand-backs under way, and the like
        self._stopping_for_privilege = False
        self._rng = random.Random()
        self._running = False
        self.health = health  # answers /healthz and /readyz (health.py), probing through the worker's link
        # How it shows in the fleet: a worker, or the console's embedded worker ("console");
        # and where its metrics are served, when they are (`jobtui worker --metrics-port`).
        self.registered_as: Kind = "worker"
        self.metrics_address: str | None = None
        self.presence: Presence | None = None  # its row in the fleet, while it runs
        # When a claim of its queues (not the slot for jobtui's own jobs) was last answered, on
        # the monotonic clock; the fleet's row says how long ago (None: not yet).
        self.last_claim: float | None = None
        self.started = asyncio.Event()  # set once the worker claims (systemd's READY=1)
        self.events = Events()  # what the parts did, for tests to wait on (events.py)

    # -- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; in-flight jobs get `shutdown_timeout` seconds, then are released."""
        if self._stopping is not None:
            self._stopping.set()
        self.slots.wake()
        if self.presence is not None:
            self.presence.look()  # the fleet shows it stopping now

    @property
    def paused(self) -> bool:
        return self.slots.paused

    def pause(self) -> None:
        """Stop claiming new jobs in this worker; in-flight ones finish (quiet, in the fleet)."""
        self.slots.paused = True
        if self.presence is not None:
            self.presence.look()

    def resume(self) -> None:
        self.slots.paused = False
        self.slots.wake()
        if self.presence is not None:
            self.presence.look()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def stopping(self) -> bool:
        """Asked to stop (a signal, `stop()`, an order), and not stopped yet."""
        return self._stopping is not None and self._stopping.is_set()

    # -- main loop -----------------------------------------------------------------------

    async def run(self) -> None:
        """Run until `stop()`; returns after in-flight jobs are finished or released.

        Raises PrivilegeMissing when the database role lacks a privilege the worker needs,
        at start or later (a revoked grant will not come back by itself).
        """
        stopping = self._stopping = asyncio.Event()
        stopped_writing = asyncio.Event()
        # One link for every connection: after an outage they all come back together, and
        # claims, reaping, LISTEN and the scheduler wait until the heartbeat went first.
        pooler = self.pooler
        pooled = transaction_pooled(pooler)
        link = self._link = Link(self.dsn, heartbeat_first=True, pooler=pooler, within=self.timing.dead_socket)
        # Claims and reaping share a connection; outcomes and heartbeats have their own, so
        # that neither waits behind a claim.
        claim_conn = Connection(
            self.dsn,
            "claim",
            link=link,
            gated=True,
            pooler=pooler,
            on_connect=None if pooled else claim_session,
            each_transaction=claim_transaction if pooled else None,
        )
        write_conn = Connection(self.dsn, "outcome", link=link, pooler=pooler)
        heartbeat_conn = Connection(self.dsn, "heartbeat", link=link, pooler=pooler)
        listen_conn = listener_connection(self.listen_dsn or (None if pooled else self.dsn), link, self.schema)
        self._writer = OutcomeWriter(
            write_conn, self.schema, self._job_died, self._denied, delete_on_complete=self.delete_on_complete
        )
        claiming = partial(
            Claiming,
            claim_conn,
            self.schema,
            unanswered=lambda: release_unanswered_call(self.worker_id, list(self.in_flight)),
            lease=self.lease,
            poll_interval=self.poll_interval,
            turn=asyncio.Lock(),  # see Claiming: claims share one connection anyway
        )
        producers = [
            Producer(
                claiming(
                    claim=partial(self._claim_call, pool),
                    answered=None if pool == BUILTIN_QUEUE and self._builtin_slot else self._claim_answered,
                ),
                Starting(
                    partial(self.slots.room, pool),
                    partial(self._start, pool),
                    self.slots.kicks[pool],
                    self.slots.sizes[pool],
                ),
                name="every queue" if pool is None else pool,
                stopping=stopping,
                denied=self._denied,
                events=self.events,
            )
            for pool in self.slots.sizes
        ]
        heartbeater = Heartbeater(
            heartbeat_conn,
            link,
            self.schema,
            self.timing,
            flights=self.in_flight.values,
            give_up=self._give_up,
            cancelled=self.cancel_requested,
            denied=self._denied,
            events=self.events,
        )
        reaper = Reaper(
            claim_conn,
            self.schema,
            self.timing,
            own=lambda: list(self.in_flight),
            on_dead=self._job_died,
            denied=self._denied,
            rng=self._rng,
            events=self.events,
        )
        try:
            missing = await write_conn.run(missing_privileges_call(self.schema, WORKER_NEEDS), self.schema)
            if missing:
                raise PrivilegeMissing(privilege_message("jobtui worker", missing))
            if uses_processes(self._executors, self.types):
                assert self.app is not None
                self.children = ChildPool(
                    Settings(self.app, self.schema, self.worker_id, *_log_settings()),
                    max_jobs=self.max_jobs_per_child,
                    max_memory=self.max_memory_per_child,
                    margin=self.lease_margin,
                    grace=self.stop_grace,
                )
                await self.children.open()
            # Its row in the fleet, before it claims: it appears as it starts. The refreshes
            # share the heartbeat's connection, which is idle between beats.
            presence = self.presence = Presence(
                heartbeat_conn,
                self.schema,
                member_of(self),
                status=partial(status_of, self),
                obey=partial(obey, self),
                denied=self._denied,
            )
            await presence.register()
            log.info(
                "worker %s started: types %s, slots %s, lease %.0fs, %s, event loop %s",
                self.worker_id,
                ", ".join(self.types),
                describe(self.slots.sizes),
                self.lease,
                self._describe_executors(),
                _loop_kind(),
            )
            self._running = True
            background = [
                asyncio.create_task(self._writer.run(stopped_writing), name="jobtui-writer"),
                asyncio.create_task(heartbeater.run(), name="jobtui-heartbeat"),
                asyncio.create_task(heartbeater.watch(), name="jobtui-lease-watch"),
                asyncio.create_task(reaper.run(), name="jobtui-reaper"),
            ]
            hinted = partial(self._cancel_hinted, heartbeater)
            listener = listen(listen_conn, self.slots.notified, hinted, self.poll_interval, presence.hinted)
            background.append(asyncio.create_task(listener, name="jobtui-listen"))
            background.append(asyncio.create_task(presence.run(), name="jobtui-fleet"))
            if self.scheduler is not None:
                background.append(asyncio.create_task(self.scheduler.run(stopping, link=link), name="jobtui-scheduler"))
            if self.health is not None:
                probe = Connection(self.dsn, "probe", link=link, gated=True, pooler=pooler)
                background.append(asyncio.create_task(self.health.watch(probe, stopping), name="jobtui-health"))
            self.started.set()
            for task in background:
                task.add_done_callback(self._background_ended)
            try:
                await asyncio.gather(*(producer.run() for producer in producers))
                self.counts["released"] += await drain(self.in_flight, self._writer, self.shutdown_timeout, self.events)
            finally:
                stopped_writing.set()
                try:
                    await within(asyncio.shield(background[0]), self.shutdown_timeout + 5)
                except TimeoutError:
                    log.error("could not write the last outcomes: the database did not answer")
                for task in background:
                    task.remove_done_callback(self._background_ended)
                    task.cancel()
                for hand_back in self._background:
                    hand_back.cancel()
                await asyncio.gather(*background, *self._background, return_exceptions=True)
                await presence.leave()
                # Outcomes the writer could not write in time: their leases expire and are reaped.
                self.in_flight.clear()
                self._running = False
                log.info("worker %s stopped: %s", self.worker_id, ", ".join(f"{k} {v}" for k, v in self.counts.items()))
        finally:
            self.presence = None
            if self.children is not None:
                await self.children.close()
            for conn in (claim_conn, write_conn, heartbeat_conn):
                await conn.close()
            await link.close()
        if self.fatal is not None:
            raise self.fatal

    def _claim_answered(self) -> None:
        self.last_claim = time.monotonic()

    def _claim_call(self, pool: str | None, limit: int) -> Call[list[ClaimedJob]]:
        types, queue = self._pool_claims[pool]
        if pool == BUILTIN_QUEUE and self._builtin_slot:
            return claim_builtin_call(
                types, worker=self.worker_id, limit=limit, lease=self.lease, max_attempts=self._limits
            )
        return claim_call(
            types, worker=self.worker_id, limit=limit, lease=self.lease, max_attempts=self._limits, queue=queue
        )

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
            async with await aconnect(self.dsn, autocommit=True, pooler=self.pooler) as conn:
                missing = await arun(conn, missing_privileges_call(self.schema, WORKER_NEEDS), self.schema)
        except psycopg.Error:
            missing = []
        if missing:
            self._stop_for(PrivilegeMissing(f"{refused}: {privilege_message('jobtui worker', missing)}"))
        else:
            self._stop_for(PrivilegeMissing(f"{refused}; {GRANTS_HINT}"))

    def _backoff(self, handler: Handler, job: Job) -> float:
        return backoff_delay(job.attempt, handler.backoff, self._rng)

    def _job_died(self, outcome: FailOutcome) -> None:
        if self.events.watched:
            self.events.tell("dead", (outcome.job_id,))
        (self.builtin_counts if outcome.type == ARCHIVE_TYPE else self.counts)["dead"] += 1
        log.error(
            "job %d (%s) is dead after %d of %d attempts",
            outcome.job_id,
            outcome.type,
            outcome.attempt,
            outcome.max_attempts,
            extra=job_fields(outcome.job_id, outcome.type, outcome.attempt, outcome.worker, outcome.queue, self.schema),
        )
        for callback in self.jobs.dead_callbacks:
            try:
                callback(outcome)
            except Exception:  # a user's callback must not stop the worker
                log.exception("on_dead callback failed for job %d", outcome.job_id)

    def _describe_executors(self) -> str:
        """Where its sync handlers run, for the start line: "sync handlers in thread", or
        "no sync handlers" for an app of async handlers only."""
        used = {self._executors[t] for t in self.types if t != ARCHIVE_TYPE} - {"async"}
        return f"sync handlers in {', '.join(sorted(used))}" if used else "no sync handlers"

    def _cancel_hinted(self, heartbeater: Heartbeater, job_id: int) -> None:
        """A notification says job `job_id` was cancelled. Any role that can connect may send
        one, so it only makes the heartbeat read the rows of the jobs here now."""
        if job_id in self.in_flight:
            heartbeater.look()


def _log_settings() -> tuple[int, Any]:
    """The level and formatter of this process's log lines, for its handler processes."""
    root = logging.getLogger()
    formatter = next((h.formatter for h in root.handlers if h.formatter is not None), None)
    return root.getEffectiveLevel(), formatter


def _loop_kind() -> str:
    """The running event loop's package, `asyncio` or `uvloop`, for the start line."""
    return type(asyncio.get_running_loop()).__module__.partition(".")[0]
