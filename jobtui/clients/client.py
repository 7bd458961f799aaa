"""The clients: `Client` (sync) and `AsyncClient`, for applications that enqueue and for
scripts that operate on jobs. Each holds a small pool of connections that it checks before
use. While the database is away every call fails at once with DatabaseUnavailable, and once
it is back a new pool serves (reach.py).

    client = Client("postgresql://localhost/app")
    job_id = client.enqueue("email.send", {"user_id": 42}, key="welcome:42")
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import psycopg
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from jobtui.clients.base import (
    DEFAULT_CLIENT_TIMEOUT,
    ClientBase,
    JobsQuery,
    check_schema,
    job_filter,
    jobs_query,
    migrate_schema,
    renamed,
)
from jobtui.clients.reach import WAIT_SLICE, reporting_connection
from jobtui.core import actions
from jobtui.core.adapters import sync_connection
from jobtui.core.audit import AuditEntry, audit_list_call
from jobtui.core.claims import (
    claim_call,
    complete_call,
    complete_deleting_call,
    fail_call,
    fail_permanently_call,
    heartbeat_call,
    reap_call,
    release_call,
)
from jobtui.core.jobs import EnqueueOptions, enqueue, enqueue_many, get_job_call
from jobtui.core.middleware import entered
from jobtui.kernel.db import Call, bound_server_end, run
from jobtui.kernel.domain import (
    DEFAULT_LEASE_SECONDS,
    ClaimedJob,
    FailOutcome,
    Failure,
    JobRow,
    Lease,
    NewJob,
    Reaped,
)
from jobtui.kernel.jobfilter import JobFilter
from jobtui.reads.deadletters import check_regex, dead_matching, matching_ids
from jobtui.reads.jobquery import JobCount, JobSummary, SearchResult, counts_call, jobs_call, query, search

__all__ = ["DEFAULT_CLIENT_TIMEOUT", "Client", "check_schema", "migrate_schema"]

T = TypeVar("T")


# complete and heartbeat find each id's token by a linear search of the batch, whose cost
# grows with the square of its size: leases go a thousand at a time.
LEASE_CHUNK = 1000


def _chunks(leases: Sequence[Lease]) -> list[Sequence[Lease]]:
    return [leases[i : i + LEASE_CHUNK] for i in range(0, len(leases), LEASE_CHUNK)] or [leases]


def _close_later(pool: ConnectionPool[Any]) -> None:
    """Close a pool the database left in a thread of its own: closing waits for its workers,
    which may be connecting to a silent host."""
    threading.Thread(target=pool.close, name="jobtui-pool-close", daemon=True).start()


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


class Client(ClientBase):
    """The sync client: enqueue from application code, operate on jobs from scripts.

    client = jobtui.Client(dsn)
    client.enqueue("email.send", {"user_id": 42}, key="welcome:42")
    with psycopg.connect(dsn) as conn:     # the job commits with this transaction
        client.enqueue("email.send", {"user_id": 43}, conn=conn)
    """

    def _no_pool(self) -> None:
        self._pool: ConnectionPool[Any] | None = None
        self._pool_lock = threading.RLock()

    def _get_pool(self) -> tuple[ConnectionPool[Any], int]:
        """The pool of the database's current generation (a new one after an outage), and
        that generation; DatabaseUnavailable at once while the database is away."""
        reach = self._reach
        reach.check()
        with self._pool_lock:
            pool, generation = self._pool, reach.generation
            if pool is not None and self._pool_generation == generation:
                return pool, generation
            if pool is not None:
                _close_later(pool)
            pool = self._pool = ConnectionPool(
                self.dsn,
                **self._pool_options(),
                connection_class=reporting_connection(lambda exc: self._lost(exc, generation)),
                # A connection the server dropped (a restart) is found out and replaced
                # when it is handed out, not by the caller's statement failing.
                check=lambda conn: self._check(conn, generation),
                configure=self._configure,
            )
            self._pool_generation = generation
        pool.open(wait=False)
        return pool, generation

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """A new pooled connection's server end is bounded as jobtui's own are (db.bound_server_end),
        in autocommit, so that the connection is idle after it whatever the server said."""
        _autocommitted(conn, lambda: bound_server_end(conn, self.dsn, self._pool_options()["kwargs"], self.pooler))

    def _check(self, conn: psycopg.Connection[Any], generation: int) -> None:
        began = time.monotonic()
        try:
            ConnectionPool.check_connection(conn)
        except psycopg.Error as exc:
            self._checked_slowly(began, exc, generation)
            raise

    def _drop_pool(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            _close_later(pool)

    def close(self) -> None:
        self._reach.close()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _with_conn(self, conn: object | None, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        if conn is not None:
            return fn(sync_connection(conn))
        pool, generation = self._get_pool()
        pooled = self._getconn(pool, generation)
        try:
            with pooled:  # commits, or rolls back on an error (a pooled connection stays open)
                try:
                    return fn(pooled)
                except psycopg.OperationalError as exc:
                    self._failed_on(pooled, exc, generation)
                    raise
        finally:
            pool.putconn(pooled)

    def _getconn(self, pool: ConnectionPool[Any], generation: int) -> psycopg.Connection[Any]:
        """A connection of `pool` within the client's timeout (see `_not_got`)."""
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                got: psycopg.Connection[Any] = pool.getconn(timeout=max(0.001, min(WAIT_SLICE, left)))
                return got
            except (PoolTimeout, PoolClosed) as exc:
                self._not_got(exc, left, generation)

    def run(self, call: Call[T], conn: object | None = None) -> T:
        """Run any `Call` (in `conn`'s transaction when given, else in its own)."""
        return self._with_conn(conn, lambda c: run(c, call, self.schema))

    def check_schema(self) -> int:
        """Raise SchemaNotMigrated unless `jobtui migrate` has been run for this code."""
        return check_schema(self.dsn, self.schema, self.pooler)

    def migrate(self) -> list[str]:
        """Apply the migrations the schema lacks (what `jobtui migrate` does); their names."""
        return migrate_schema(self.dsn, self.schema, self.pooler)

    def jobs(self, **options: Unpack[JobsQuery]) -> list[JobSummary]:
        """Jobs matching every filter given (base.JobsQuery), newest first; the next page is
        `jobs(..., before=page[-1].id)`. `queue` is a queue's name, `since` the oldest
        creation time, `error` a regular expression, `payload` a JSON object the payload
        contains (`{"account": "acme"}`; see `search` for the scan behind it)."""
        filt, page = jobs_query(options)
        if filt.payload is not None:
            return self.search(filt, **page).jobs
        call = jobs_call(filt, **page)
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
        return self.run(counts_call(job_filter(status, type, queue)))

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
        self, job_type: str, payload: Any = None, *, conn: object | None = None, **options: Unpack[EnqueueOptions]
    ) -> int:
        """Insert one job and return its id; a key that exists returns the existing job's id.
        `options` (core/jobs.EnqueueOptions): `key`, `delay`, `run_at`, `max_attempts`, and
        `queue` (None: its handler's declared queue, see `jobs`, else the default one).

        With `conn` (psycopg, or SQLAlchemy's or Django's: adapters.py), the job is part of
        that connection's transaction: it commits or rolls back with the application's rows.
        """
        with self._enqueue_entered(job_type, payload, options) as call:
            return self._enqueue(call, conn)

    def _enqueue(self, call: Call[int | None], conn: object | None) -> int:
        if conn is not None:
            return enqueue(sync_connection(conn), call, self.schema)
        return self._with_conn(None, lambda c: _autocommitted(c, lambda: enqueue(c, call, self.schema)))

    def enqueue_many(self, jobs: Iterable[NewJob], *, conn: object | None = None) -> list[int]:
        """Insert many jobs in one statement (COPY for large batches); ids in input order."""
        with entered(self.middleware, self._with_queues(jobs)) as batch:
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
        return self._with_conn(None, lambda c: actions.requeue(c, ids, actor=actor, schema=self.schema))

    def requeue_matching(self, *, job_type: str | None = None, error: str | None = None, actor: str) -> list[int]:
        """Requeue every dead or failed job of `job_type` whose error matches `error` (see
        `dead_matching`: the rows `jobtui dead --error` lists). Audited."""
        self._with_conn(None, lambda c: check_regex(c, error, self.schema))
        return self._with_conn(
            None, lambda c: actions.requeue_matching(c, job_type=job_type, error=error, actor=actor, schema=self.schema)
        )

    def requeueable(
        self, *, job_type: str | None = None, error: str | None = None, actor: str | None = None
    ) -> list[int]:
        """The ids `requeue_matching` would move now; audited as a dry run when `actor` is given."""

        def matched(conn: psycopg.Connection[Any]) -> list[int]:
            check_regex(conn, error, self.schema)
            return matching_ids(dead_matching(conn, self.schema, job_type=job_type, error=error, with_ids=True))

        ids = self._with_conn(None, matched)
        if actor is not None:
            self._with_conn(
                None,
                lambda c: actions.record_dry_run(
                    c, len(ids), job_type=job_type, error=error, actor=actor, schema=self.schema
                ),
            )
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
        return self._with_conn(
            None,
            lambda c: actions.requeue_dead_group(
                c, status, job_type, fingerprint or None, actor=actor, ids=ids, schema=self.schema
            ),
        )

    def kill_lease(self, ids: Sequence[int], *, actor: str, tokens: Sequence[int] | None = None) -> list[int]:
        """Return running jobs to ready now (dead after their last attempt); their workers' late
        outcomes are rejected. With `tokens` (each id's lease token, as a list of running jobs
        shows it), an attempt that ended since is left alone, and so is the one after it. Audited."""
        return self._with_conn(
            None, lambda c: actions.kill_lease(c, ids, actor=actor, schema=self.schema, tokens=tokens)
        )

    def cancel(self, ids: Sequence[int], *, actor: str) -> list[int]:
        """Mark ready or running jobs failed. Audited."""
        return self._with_conn(None, lambda c: actions.cancel(c, ids, actor=actor, schema=self.schema))

    def audit(self, limit: int = 100) -> list[AuditEntry]:
        """The newest operator actions first."""
        return self.run(audit_list_call(limit))


if TYPE_CHECKING:
    Queue = Client  # the name of 0.2.0, deprecated (see jobtui/__init__.py)
else:

    def __getattr__(name: str) -> type[ClientBase]:
        return renamed(__name__, name, {"Queue": Client})
