"""What the console reads and changes, on its own connections (called from worker threads)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from jobtui.clients.client import Client
from jobtui.core import scheduler as schedules
from jobtui.core.jobs import get_job_call
from jobtui.core.members import Action, OrderResult, Target, give_order
from jobtui.kernel.db import bound_server_end, connect, pooler_mode, run, tcp_bounds
from jobtui.kernel.domain import JobRow
from jobtui.kernel.donehistory import DoneHistory
from jobtui.kernel.errors import DatabaseUnavailable, InvalidInput
from jobtui.reads import joblists
from jobtui.reads.console import session_call
from jobtui.reads.deadletters import check_regex
from jobtui.reads.diagnosis import Diagnosis, diagnose
from jobtui.reads.fleet import Fleet, read_fleet
from jobtui.reads.joblists import DeadJob, ReadyJobs, RunningCursor, RunningJob
from jobtui.reads.metrics import DeadGroup, Snapshot
from jobtui.reads.overview import QueueLine, read_with_snapshot
from jobtui.reads.scene import Scene
from jobtui.reads.timers import watched
from jobtui.reads.why import read_facts

# Every statement the console runs is cancelled by the server after this long: a slow
# database shows as an error in the header, not as a console waiting forever.
STATEMENT_TIMEOUT = 5.0
# A read waits this long for the connection another read holds (a hung server holds it for as
# long as it hangs) before it gives up with an error instead.
WAIT_FOR_CONNECTION = 2.0
# A read still waiting this long after the server should have cancelled it (a hung server, a
# partition) is ended from the console's side, so a new connection can be tried. On a network
# gone silent the connection's TCP bounds (db.tcp_bounds, about 5 s) end it first.
GIVE_UP_AFTER = STATEMENT_TIMEOUT + 3.0
# Connecting gives up after libpq's shortest timeout: a refresh a second later tries again,
# so after a partition heals the header clears within 2 s, not after a longer attempt's
# retransmissions.
CONNECT_TIMEOUT = 2


@dataclass(frozen=True, slots=True)
class Where:
    """Which database the console reads, as the header names it."""

    role: str
    host: str
    port: str
    database: str
    schema: str
    server_read_only: bool  # a standby, or default_transaction_read_only
    standby: bool = False  # in recovery when the connection was made

    def label(self) -> str:
        return f"{self.role}@{self.host}:{self.port}/{self.database} schema {self.schema}"


@dataclass
class Fetched:
    """One refresh: the snapshot and the running jobs, with when they were read."""

    snapshot: Snapshot
    running: list[RunningJob]
    read_at: float = field(default_factory=time.monotonic)
    # With a filter: the dead groups of the jobs whose error it matches, as `jobtui dead
    # --error FILTER` lists them (None without a filter), and why it matches none when it is
    # not a regular expression.
    dead_matched: list[DeadGroup] | None = None
    filter_problem: str = ""
    needle: str = ""  # the filter dead_matched was read for
    where: Where | None = None
    running_after: RunningCursor | None = None  # where the page of `running` starts
    queues: list[QueueLine] = field(default_factory=list)  # the Queues pane's lines
    queues_source: str = ""  # where their estimates come from ('' when counted)
    queues_done: bool = True  # their done jobs of the last minute were read (DataSource.done_wanted)
    fleet: Fleet = field(default_factory=Fleet)  # the Workers pane's processes
    running_worker: str | None = None  # whose jobs `running` holds (None: every worker's)
    # Why the backlog grows (the Why pane, the header's first cause): read while the Why pane
    # is open or the oldest wait is past the warning age; None otherwise.
    diagnosis: Diagnosis | None = None


class DataSource:
    """Reads for the panes over one connection that is reopened after a failure."""

    def __init__(self, dsn: str, schema: str, pooler: str | None = None) -> None:
        self.dsn = dsn
        self.schema = schema
        self.pooler = pooler  # --pooler (None: JOBTUI_POOLER, as db.pooler_mode reads it)
        self._conn: psycopg.Connection[Any] | None = None
        self._opening: psycopg.Connection[Any] | None = None  # a connection whose session is being set up
        self._where: Where | None = None
        self._busy_since: float | None = None  # when the read in progress began
        self._closed = False  # after close(), no read opens a connection again
        self._history = DoneHistory()
        # The page of running jobs each refresh reads, and whose: the Running pane moves it,
        # the Workers pane's enter names the worker.
        self.running_after: RunningCursor | None = None
        self.running_worker: str | None = None
        # When each refresh reads the diagnosis too: while the Why pane is open, and once the
        # oldest due job has waited `why_after` seconds (the header names the first cause).
        self.why_open = False
        self.why_after: float | None = None
        # Whether each refresh reads the done jobs of the last minute by queue and type: only
        # while a pane that uses them is open (the Queues pane shows them; the Workers pane's
        # filter knows a queue by them). The header needs none.
        self.done_wanted = False
        # The panes read from several thread workers at once (a refresh, an action's count,
        # and a cancelled refresh keeps running in its thread); one connection serves them
        # one at a time: a snapshot pipelines its statements, and another thread's statement
        # in the middle of a pipeline would take the wrong results.
        self._lock = threading.RLock()
        # Held while the watchdog ends a socket and while a connection is closed (_close).
        self._ending = threading.Lock()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise DatabaseUnavailable("the console is closing")
        if self._conn is None or self._conn.closed or self._conn.broken:
            raw = connect(self.dsn, autocommit=True, pooler=self.pooler, connect_timeout=CONNECT_TIMEOUT)
            # Its first statements may wait on a server that stopped answering as they were
            # sent: give_up_if_hung ends them as it ends a read's.
            with self._ending:
                self._opening = raw
            try:
                if self._closed:  # the console quit while it connected: no session to set up
                    raise DatabaseUnavailable("the console is closing")
                bound_server_end(raw, self.dsn, tcp_bounds(self.dsn), self.pooler)  # before the guard: no timer read
                conn = watched(raw, self.schema)
                local = pooler_mode(self.pooler) == "transaction"
                identity = run(conn, session_call(STATEMENT_TIMEOUT, local=local), self.schema)
                where = Where(
                    identity["role"],
                    conn.info.host,
                    str(conn.info.port),
                    identity["database"],
                    self.schema,
                    bool(identity["read_only"]),
                    bool(identity["standby"]),
                )
                # Handed out under the lock close() ends it by: a quit before sees it opening,
                # one after sees it handed out.
                with self._ending:
                    if self._closed:
                        raise DatabaseUnavailable("the console is closing")
                    self._conn, self._opening = conn, None
            except BaseException:
                self._close(raw)  # never handed out: the next read opens another
                raise
            finally:
                self._opening = None
            self._where = where
        return self._conn

    def busy_for(self) -> float:
        """Seconds the read in progress has waited for the database (0 when none is)."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    def give_up_if_hung(self, after: float = GIVE_UP_AFTER) -> bool:
        """End the read in progress when it has waited `after` seconds: its socket is shut
        down (not closed: the reading thread still owns it), so the read fails at once with
        a lost connection, and the next read connects again. True when it did."""
        with self._ending:
            conn = self._conn or self._opening
            if conn is None or conn.closed or self.busy_for() < after:
                return False
            with contextlib.suppress(OSError, psycopg.Error):
                with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
                return True
            return False

    def _close(self, conn: psycopg.Connection[Any]) -> None:
        """Close a connection of this source, never while give_up_if_hung reads its socket
        (closed in between, its number could be another socket's by the time it is ended)."""
        with self._ending:
            conn.close()

    @property
    def where(self) -> Where | None:
        return self._where

    def _read(self, fn: Any, *args: Any) -> Any:
        if not self._lock.acquire(timeout=WAIT_FOR_CONNECTION):
            raise DatabaseUnavailable(f"the database has not answered for {self.busy_for():.0f}s")
        try:
            outer = self._busy_since is None
            if outer:
                self._busy_since = time.monotonic()
            try:
                return fn(self._connection(), *args)
            except psycopg.OperationalError:
                self.disconnect()
                raise
            finally:
                if outer:
                    self._busy_since = None
                if self._closed:
                    self.disconnect()  # the console quit during the read: close() left it this one
        finally:
            self._lock.release()

    def fetch(self, needle: str = "") -> Fetched:
        """One refresh; with a `needle` (the console's filter), also the dead groups of the
        jobs whose error it matches, with the matcher of `--error`."""
        fetched: Fetched = self._read(self._fetch, needle)  # one hold of the connection for the whole refresh
        return fetched

    def _fetch(self, conn: psycopg.Connection[Any], needle: str) -> Fetched:
        # The done jobs per queue and type: see done_wanted.
        view, snap = read_with_snapshot(conn, self.schema, history=self._history, done=self.done_wanted)
        after, worker = self.running_after, self.running_worker
        running = joblists.running_jobs(conn, self.schema, after=after, worker=worker)
        fleet = read_fleet(conn, self.schema)
        late = self.why_after is not None and (snap.oldest_ready_age or 0.0) >= self.why_after
        diagnosis = None
        if self.why_open or late:
            diagnosis = diagnose(Scene.of(snap, view.lines, fleet, read_facts(conn, self.schema)))
        fetched = Fetched(
            snap,
            running,
            where=self._where,
            running_after=after,
            queues=view.lines,
            queues_source=view.source,
            queues_done=view.done_read,
            fleet=fleet,
            running_worker=worker,
            diagnosis=diagnosis,
        )
        if not needle:
            return fetched
        try:
            check_regex(conn, needle, self.schema)
        except InvalidInput as exc:
            return replace(fetched, dead_matched=[], filter_problem=str(exc), needle=needle)
        return replace(fetched, dead_matched=joblists.dead_groups(conn, self.schema, error=needle), needle=needle)

    def backend_pid(self) -> int:
        """The server process behind the connection the refreshes use."""
        return int(self._read(lambda c: c.info.backend_pid))

    def ready_jobs(self, job_type: str) -> ReadyJobs:
        result: ReadyJobs = self._read(lambda c: joblists.ready_jobs(c, job_type, self.schema))
        return result

    def dead_jobs(self, status: str, job_type: str, fingerprint: str) -> list[DeadJob]:
        result: list[DeadJob] = self._read(lambda c: joblists.dead_jobs(c, status, job_type, fingerprint, self.schema))
        return result

    def dead_group_ids(self, status: str, job_type: str, fingerprint: str, error: str | None = None) -> list[int]:
        """The ids of a dead group's jobs now (those whose error matches `error`, if given)."""
        result: list[int] = self._read(
            lambda c: joblists.dead_group_ids(c, status, job_type, fingerprint or None, error, self.schema)
        )
        return result

    def job(self, job_id: int) -> JobRow | None:
        """The whole row, on the refreshes' connection (and its timeout)."""
        result: JobRow | None = self._read(lambda c: run(c, get_job_call(job_id), self.schema))
        return result

    def close(self) -> None:
        """For good: the console is quitting. A read in progress is ended, none starts again."""
        self._closed = True
        if self._busy_since is not None:
            # A read still waiting on a hung server owns the connection: closing it under that
            # read is not safe; ending its socket makes the read fail and drop it.
            self.give_up_if_hung(after=0.0)
            return
        conn, self._conn = self._conn, None
        if conn is not None:
            self._close(conn)

    def disconnect(self) -> None:
        """Close the connection; the next read opens a new one. From the read that holds it,
        or while none is in progress."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._close(conn)


class Actions:
    """Operator actions; each runs with its audit row in one transaction (core/audit.operate):
    the job actions through the client, the schedule actions through the scheduler."""

    def __init__(self, dsn: str, schema: str, actor: str, pooler: str | None = None) -> None:
        self.dsn = dsn
        self.schema = schema
        self.actor = actor
        self.pooler = pooler
        self._client = Client(dsn, schema=schema, max_connections=2, pooler=pooler)

    def requeue_jobs(self, ids: list[int]) -> int:
        return len(self._client.requeue(ids, actor=self.actor))

    def requeue_group(self, status: str, job_type: str, fingerprint: str, ids: list[int]) -> int:
        """Requeue exactly `ids` of the group (those still in it); how many moved."""
        return len(self._client.requeue_dead_group(status, job_type, fingerprint or None, actor=self.actor, ids=ids))

    def kill_lease(self, job_id: int, token: int | None) -> tuple[bool, JobRow | None]:
        """Kill the lease of the attempt holding `token` (None: whichever runs); whether it was
        killed, and the job's row after it."""
        tokens = None if token is None else [token]
        killed = bool(self._client.kill_lease([job_id], actor=self.actor, tokens=tokens))
        return killed, self._client.get(job_id)

    def cancel(self, job_id: int) -> int:
        return len(self._client.cancel([job_id], actor=self.actor))

    def pause_schedule(self, name: str) -> bool:
        with self._connect() as conn:
            return schedules.pause(conn, name, self.schema, actor=self.actor)

    def resume_schedule(self, name: str) -> bool:
        with self._connect() as conn:
            return schedules.resume(conn, name, self.schema, actor=self.actor)

    def run_schedule_now(self, name: str) -> int:
        with self._connect() as conn:
            return schedules.run_now(conn, name, self.schema, actor=self.actor)

    def order(self, action: Action, target: Target) -> OrderResult:
        """Quiet, resume or stop processes of the fleet (audited with them)."""
        with self._connect() as conn:
            return give_order(conn, action, target, actor=self.actor, schema=self.schema)

    def _connect(self) -> psycopg.Connection[Any]:
        """A connection of its own for a schedule's or an order's change (audited with it)."""
        return connect(self.dsn, autocommit=True, pooler=self.pooler)

    def close(self) -> None:
        self._client.close()
