"""The clients: `Queue` (sync) and `AsyncQueue`, for applications that enqueue and for
scripts that operate the queue. Each holds a small pool of connections that it checks before
use, and fails with DatabaseUnavailable after its timeout when the database is away.

    queue = Queue("postgresql://localhost/app")
    job_id = queue.enqueue("email.send", {"user_id": 42}, key="welcome:42")
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from jobtui.core.actions import cancel_call, kill_lease_call, requeue_call
from jobtui.core.adapters import sync_connection
from jobtui.core.audit import AuditEntry, audit_call, audit_list_call
from jobtui.core.middleware import EnqueueHook, as_hook, entered
from jobtui.core.otel import action_span
from jobtui.core.queue import (
    claim_call,
    complete_call,
    complete_deleting_call,
    enqueue,
    enqueue_call,
    enqueue_many,
    fail_call,
    fail_permanently_call,
    get_job_call,
    heartbeat_call,
    reap_call,
    release_call,
)
from jobtui.core.registry import Jobs
from jobtui.kernel import migrate
from jobtui.kernel.checks import check_text
from jobtui.kernel.db import (
    Call,
    check_dsn,
    connect,
    connect_timeout,
    int_list,
    pooler_mode,
    pooler_options,
    resolve_dsn,
    run,
    statements,
    unavailable,
)
from jobtui.kernel.domain import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_SCHEMA,
    ClaimedJob,
    FailOutcome,
    Failure,
    JobRow,
    Lease,
    NewJob,
    Reaped,
)
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.jobfilter import JobFilter
from jobtui.reads.deadletters import check_regex, dead_matching, matching_ids
from jobtui.reads.jobquery import JobCount, JobSummary, SearchResult, counts_call, jobs_call, query, search

T = TypeVar("T")


def migrate_schema(dsn: str | None = None, schema: str = DEFAULT_SCHEMA, pooler: str | None = None) -> list[str]:
    """Create or upgrade jobtui's schema at `dsn` (JOBTUI_DSN when None), for code that
    deploys itself; safe to race. The names of the migrations applied."""
    dsn, schema, _ = _client_settings(dsn, schema, DEFAULT_CLIENT_TIMEOUT)
    with connect(dsn, autocommit=True, pooler=pooler_mode(pooler)) as conn:
        return [f"{m.version:04d}_{m.name}" for m in migrate.migrate(conn, schema)]


def check_schema(dsn: str | None = None, schema: str = DEFAULT_SCHEMA, pooler: str | None = None) -> int:
    """The schema's version; SchemaNotMigrated when it is missing or older than this code."""
    dsn, schema, _ = _client_settings(dsn, schema, DEFAULT_CLIENT_TIMEOUT)
    with connect(dsn, pooler=pooler_mode(pooler)) as conn:
        return migrate.check(conn, schema)


# complete and heartbeat find each id's token by a linear search of the batch, whose cost
# grows with the square of its size: leases go a thousand at a time.
LEASE_CHUNK = 1000


def _chunks(leases: Sequence[Lease]) -> list[Sequence[Lease]]:
    return [leases[i : i + LEASE_CHUNK] for i in range(0, len(leases), LEASE_CHUNK)] or [leases]


def _autocommitted(conn: psycopg.Connection[Any], fn: Callable[[], T]) -> T:
    """Run `fn` with each statement committing by itself, on a pooled connection.

    A lone enqueue then costs one round trip instead of three (BEGIN, INSERT, COMMIT), and
    the time from enqueue to a worker starting the job is mostly that round trip. With a key
    that exists, the second statement reads the committed row; `enqueue` retries if it went.
    """
    conn.autocommit = True
    try:
        return fn()
    finally:
        with contextlib.suppress(psycopg.Error):  # a broken connection is discarded anyway
            conn.autocommit = False


# How long a client call waits for a connection while the database is away, by default.
DEFAULT_CLIENT_TIMEOUT = 10.0


def _client_settings(dsn: str | None, schema: str, timeout: float) -> tuple[str, str, float]:
    """The checked DSN, schema and timeout of a Queue or AsyncQueue."""
    resolved = resolve_dsn(dsn)
    if resolved is None:
        raise InvalidInput("no database given: pass a DSN or set JOBTUI_DSN")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise InvalidInput(f"bad timeout {timeout!r}: give seconds, more than 0 and at most 3600")
    return check_dsn(resolved), statements(schema).schema, float(timeout)


def _reachable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the connection still works after an error (the error was the statement's)."""
    return not (conn.closed or conn.broken)


class Queue:
    """The sync client: enqueue from application code, operate the queue from scripts.

    queue = jobtui.Queue(dsn)
    queue.enqueue("email.send", {"user_id": 42}, key="welcome:42")
    with psycopg.connect(dsn) as conn:      # the job commits with this transaction
        queue.enqueue("email.send", {"user_id": 43}, conn=conn)
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = DEFAULT_SCHEMA,
        max_connections: int = 4,
        timeout: float = DEFAULT_CLIENT_TIMEOUT,
        middleware: Sequence[EnqueueHook] = (),
        pooler: str | None = None,
        jobs: Jobs | None = None,
    ) -> None:
        self.dsn, self.schema, self.timeout = _client_settings(dsn, schema, timeout)
        self.pooler = pooler_mode(pooler)  # see db.pooler_mode
        # With a registry, a job enqueued without a queue goes to its handler's declared one.
        self.registry = jobs
        self._max_connections = max_connections
        self._pool: ConnectionPool[Any] | None = None
        # Around every enqueue, in order (middleware.py); generator functions are made hooks.
        self.middleware: list[EnqueueHook] = [as_hook(m) for m in middleware]

    def _get_pool(self) -> ConnectionPool[Any]:
        if self._pool is None:
            self._pool = ConnectionPool(
                self.dsn,
                min_size=1,
                max_size=self._max_connections,
                open=False,
                kwargs={**connect_timeout(self.dsn), **pooler_options(self.pooler)},
                # A connection the server dropped (a restart) is found out and replaced
                # when it is handed out, not by the caller's statement failing.
                check=ConnectionPool.check_connection,
            )
            self._pool.open(wait=False)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _with_conn(self, conn: object | None, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        if conn is not None:
            return fn(sync_connection(conn))
        try:
            with self._get_pool().connection(timeout=self.timeout) as pooled:
                try:
                    return fn(pooled)
                except psycopg.OperationalError as exc:
                    if _reachable(pooled):
                        raise  # about the statement (a deadlock, a timeout), not the server
                    raise unavailable(self.dsn, exc) from None
        except PoolTimeout as exc:
            raise unavailable(self.dsn, exc, waited=self.timeout) from None

    def run(self, call: Call[T], conn: object | None = None) -> T:
        """Run any `Call` (in `conn`'s transaction when given, else in its own)."""
        return self._with_conn(conn, lambda c: run(c, call, self.schema))

    def check_schema(self) -> int:
        """Raise SchemaNotMigrated unless `jobtui migrate` has been run for this code."""
        with connect(self.dsn, pooler=self.pooler) as conn:
            return migrate.check(conn, self.schema)

    def migrate(self) -> list[str]:
        """Apply the migrations the schema lacks (what `jobtui migrate` does); their names."""
        return migrate_schema(self.dsn, self.schema)

    def jobs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        type: str | Sequence[str] | None = None,
        queue: str | None = None,
        since: datetime | None = None,
        error: str | None = None,
        limit: int = 100,
        before: int | None = None,
        payload: dict[str, Any] | None = None,
    ) -> list[JobSummary]:
        """Jobs matching every filter given, newest first; the next page is
        `jobs(..., before=page[-1].id)`. `queue` is a queue's name, `since` the oldest
        creation time, `error` a regular expression, `payload` a JSON object the payload
        contains (`{"account": "acme"}`; see `search` for the scan behind it)."""
        if payload is not None:
            return self.search(
                search_filter(status, type, queue, since, payload), error=error, limit=limit, before=before
            ).jobs
        call = jobs_call(status=status, type=type, queue=queue, since=since, error=error, limit=limit, before=before)
        return self._with_conn(None, lambda c: query(c, call, self.schema))

    def search(
        self, filt: JobFilter, *, error: str | None = None, limit: int = 100, before: int | None = None
    ) -> SearchResult:
        """A page of the jobs of `filt`, newest first, and how many match as far as it read.

        Without an index that serves the filter (`jobtui index payload` for the payload), it
        reads the table window by window of ids (jobquery.search), each statement bounded by
        a timeout: at 5,000,000 jobs a rare match costs seconds, a common one milliseconds.
        """
        return self._with_conn(
            None, lambda c: search(c, filt, error=error, limit=limit, before=before, schema=self.schema)
        )

    def counts(
        self,
        *,
        status: str | Sequence[str] | None = None,
        type: str | Sequence[str] | None = None,
        queue: str | None = None,
    ) -> list[JobCount]:
        """How many jobs there are now by status and type (the queue's depth: status="ready")."""
        return self.run(counts_call(status=status, type=type, queue=queue))

    def count(
        self,
        *,
        status: str | Sequence[str] | None = None,
        type: str | Sequence[str] | None = None,
        queue: str | None = None,
    ) -> int:
        """How many jobs match, all counts of `counts` added up."""
        return sum(c.jobs for c in self.counts(status=status, type=type, queue=queue))

    def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        key: str | None = None,
        delay: float = 0.0,
        run_at: Any = None,
        max_attempts: int | None = None,
        queue: str | None = None,
        conn: object | None = None,
    ) -> int:
        """Insert one job into `queue` (None: its handler's declared queue, see `jobs`, else
        the default one) and return its id; a key that exists returns the existing job's id.

        With `conn` (psycopg, or SQLAlchemy's or Django's: adapters.py), the job is part of
        that connection's transaction: it commits or rolls back with the application's rows.
        """
        queue = _queue_for(self.registry, job_type, queue)
        if self.middleware:
            new = NewJob(job_type, payload, key, delay, max_attempts, queue=queue)
            with entered(self.middleware, [new]) as (job,):
                return self._enqueue(enqueue_call(job.type, job.payload, key=job.key, delay=job.delay, run_at=run_at,
                                                  max_attempts=job.max_attempts, meta=job.meta, queue=job.queue),
                                     conn)  # fmt: skip
        call = enqueue_call(
            job_type, payload, key=key, delay=delay, run_at=run_at, max_attempts=max_attempts, queue=queue
        )
        return self._enqueue(call, conn)

    def _enqueue(self, call: Call[int | None], conn: object | None) -> int:
        if conn is not None:
            return enqueue(sync_connection(conn), call, self.schema)
        return self._with_conn(None, lambda c: _autocommitted(c, lambda: enqueue(c, call, self.schema)))

    def enqueue_many(self, jobs: Iterable[NewJob], *, conn: object | None = None) -> list[int]:
        """Insert many jobs in one statement (COPY for large batches); ids in input order."""
        with entered(self.middleware, _with_queues(self.registry, jobs)) as batch:
            return self._with_conn(conn, lambda c: enqueue_many(c, batch, self.schema))

    def claim(
        self, types: Sequence[str], *, worker: str, limit: int = 1, lease: float = DEFAULT_LEASE_SECONDS
    ) -> list[ClaimedJob]:
        return self.run(claim_call(types, worker=worker, limit=limit, lease=lease))

    def heartbeat(self, leases: Sequence[Lease], lease: float = DEFAULT_LEASE_SECONDS) -> set[int]:
        """Extend leases; returns the ids still held (the others were lost)."""
        return {i for chunk in _chunks(leases) for i in self.run(heartbeat_call(chunk, lease))}

    def complete(self, leases: Sequence[Lease], *, delete: bool = False) -> set[int]:
        """Mark jobs done; returns the ids written (a missing id lost its lease).

        delete=True deletes jobs without a key instead, counting them in done_tally (what
        `jobtui worker --delete-on-complete` does); keyed jobs are kept as done rows.
        """
        written: set[int] = set()
        for chunk in _chunks(leases):
            if delete:
                deleted = self.run(complete_deleting_call(chunk))
                written.update(deleted)
                chunk = [lease for lease in chunk if lease.job_id not in deleted]
            if chunk:
                completed = self.run(complete_call(chunk))
                written.update(completed)
        return written

    def fail(self, failures: Sequence[Failure]) -> list[FailOutcome]:
        """Record counted failures; jobs out of attempts go dead. Lost leases are left out."""
        return self.run(fail_call(failures))

    def fail_permanently(self, leases: Sequence[Lease], errors: Sequence[str]) -> set[int]:
        return self.run(fail_permanently_call(leases, errors))

    def release(
        self,
        leases: Sequence[Lease],
        delays: Sequence[float] | None = None,
        *,
        kinds: Sequence[str] | None = None,
        reasons: Sequence[str] | None = None,
    ) -> set[int]:
        """Return jobs to ready without counting the attempt; each gets a history entry of
        its kind (RELEASE_KINDS, default "shutdown") and reason."""
        return self.run(release_call(leases, delays, kinds=kinds, reasons=reasons))

    def reap(self, limit: int = 1000) -> list[Reaped]:
        """Return expired leases to ready (or dead when attempts are spent)."""
        return self.run(reap_call(limit))

    def get(self, job_id: int) -> JobRow | None:
        return self.run(get_job_call(job_id))

    def requeue(self, ids: Sequence[int], *, actor: str) -> list[int]:
        """Move dead or failed jobs back to ready; returns the ids moved. Audited."""
        return self._operate(requeue_call(ids, actor), "requeue", actor, _ids_target(ids), notify=True)

    def requeue_matching(self, *, job_type: str | None = None, error: str | None = None, actor: str) -> list[int]:
        """Requeue every dead or failed job of `job_type` whose error matches `error` (see
        `dead_matching`: the rows `jobtui dead --error` lists). Audited."""
        self._with_conn(None, lambda c: check_regex(c, error, self.schema))

        def matched_then_requeued(conn: psycopg.Connection[Any]) -> list[int]:
            ids = matching_ids(dead_matching(conn, self.schema, job_type=job_type, error=error, with_ids=True))
            return run(conn, requeue_call(ids, actor), self.schema) if ids else []

        return self._operate(matched_then_requeued, "requeue", actor, _match_target(job_type, error), notify=True)

    def requeueable(
        self, *, job_type: str | None = None, error: str | None = None, actor: str | None = None
    ) -> list[int]:
        """The ids `requeue_matching` would move now; audited as a dry run when `actor` is given."""

        def matched(conn: psycopg.Connection[Any]) -> list[int]:
            check_regex(conn, error, self.schema)
            return matching_ids(dead_matching(conn, self.schema, job_type=job_type, error=error, with_ids=True))

        ids = self._with_conn(None, matched)
        if actor is not None:
            self._operate(None, "requeue-dry-run", actor, _match_target(job_type, error), rows=len(ids))
        return ids

    def count_requeueable(
        self, *, job_type: str | None = None, error: str | None = None, actor: str | None = None
    ) -> int:
        """How many jobs `requeue_matching` would move; audited as a dry run when `actor` is given."""
        return len(self.requeueable(job_type=job_type, error=error, actor=actor))

    def requeue_dead_group(
        self, status: str, job_type: str, fingerprint: str | None, *, actor: str, ids: Sequence[int] | None = None
    ) -> list[int]:
        """Requeue one dead-letter group (status, type, error fingerprint) as the console
        shows it: the given `ids` of it (those an operator was shown and confirmed; one that
        left the group since is left alone), or else every job in it now. Audited."""
        fingerprint = fingerprint or None

        def requeued(conn: psycopg.Connection[Any]) -> list[int]:
            chosen = list(ids) if ids is not None else None
            if chosen is None:
                groups = dead_matching(conn, self.schema, job_type=job_type, group=(status, fingerprint), with_ids=True)
                chosen = matching_ids(groups)
            params = {"ids": chosen, "status": status, "type": job_type, "fingerprint": fingerprint, "actor": actor}
            return run(conn, Call("dead_group_requeue", params, int_list), self.schema) if chosen else []

        target = f"{status} group type={job_type} error={fingerprint or '-'}"
        return self._operate(requeued, "requeue", actor, target, notify=True)

    def kill_lease(self, ids: Sequence[int], *, actor: str) -> list[int]:
        """Return running jobs to ready now; their workers' late outcomes are rejected. Audited."""
        return self._operate(kill_lease_call(ids, actor), "kill-lease", actor, _ids_target(ids), notify=True)

    def cancel(self, ids: Sequence[int], *, actor: str) -> list[int]:
        """Mark ready or running jobs failed. Audited."""
        return self._operate(cancel_call(ids, actor, self.schema), "cancel", actor, _ids_target(ids))

    def audit(self, limit: int = 100) -> list[AuditEntry]:
        """The newest operator actions first."""
        return self.run(audit_list_call(limit))

    def _operate(
        self,
        call: Call[list[int]] | Callable[[psycopg.Connection[Any]], list[int]] | None,
        action: str,
        actor: str,
        target: str,
        *,
        notify: bool = False,
        rows: int | None = None,
    ) -> list[int]:
        """Run an operator's change and its audit row in one transaction."""
        check_text(actor, "actor")

        def both(conn: psycopg.Connection[Any]) -> list[int]:
            with action_span(action, actor, target) as span, conn.transaction():
                # A Call, or a function of the connection for a change of several statements.
                ids = call(conn) if callable(call) else run(conn, call, self.schema) if call is not None else []
                run(conn, audit_call(actor, action, target, ids, len(ids) if rows is None else rows), self.schema)
                if notify and ids:
                    channel = statements(self.schema).channel
                    run(conn, Call("notify_ready", {"channel": channel}, lambda r: None), self.schema)
                if span is not None:
                    span.set_attribute("jobtui.rows", len(ids) if rows is None else rows)
            return ids

        return self._with_conn(None, both)


def search_filter(
    status: str | Sequence[str] | None,
    type: str | Sequence[str] | None,
    queue: str | None,
    since: datetime | None,
    payload: dict[str, Any] | None,
) -> JobFilter:
    """The `jobs()` arguments as the search's filter."""

    def many(value: str | Sequence[str] | None) -> tuple[str, ...]:
        return () if value is None else (value,) if isinstance(value, str) else tuple(value)

    return JobFilter(statuses=many(status), types=many(type), queue=queue, since=since, payload=payload)


def _queue_for(registry: Jobs | None, job_type: str, queue: str | None) -> str | None:
    return registry.queue_of(job_type) if queue is None and registry is not None else queue


def _with_queues(registry: Jobs | None, jobs: Iterable[NewJob]) -> list[NewJob]:
    """The jobs, each without a queue given its handler's declared one."""
    if registry is None:
        return list(jobs)
    return [j if j.queue is not None else replace(j, queue=registry.queue_of(j.type)) for j in jobs]


def _match_target(job_type: str | None, error: str | None) -> str:
    return f"type={job_type or '*'} error={error or '*'}"


def _ids_target(ids: Sequence[int]) -> str:
    shown = ",".join(str(i) for i in list(ids)[:20])
    return f"jobs {shown}{'...' if len(ids) > 20 else ''}"
