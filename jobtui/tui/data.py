"""What the console reads and changes, on its own connections (called from worker threads)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .. import joblists, metrics, queues
from .. import scheduler as schedules
from ..actions import check_regex
from ..client import Queue
from ..db import connect, run
from ..domain import JobRow
from ..errors import InvalidInput
from ..joblists import DeadJob, ReadyJob, RunningJob
from ..metrics import DeadGroup, Snapshot
from ..queues import QueueLine


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
    queues: list[QueueLine] = field(default_factory=list)  # the Queues pane's lines


class DataSource:
    """Reads for the panes over one connection that is reopened after a failure."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._conn: psycopg.Connection[Any] | None = None
        self._history = metrics.DoneHistory()
        # The panes read from several thread workers at once (a refresh, an action's count,
        # and a cancelled refresh keeps running in its thread); one connection serves them
        # one at a time: a snapshot pipelines its statements, and another thread's statement
        # in the middle of a pipeline would take the wrong results.
        self._lock = threading.RLock()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.dsn, autocommit=True)
        return self._conn

    def _read(self, fn: Any, *args: Any) -> Any:
        with self._lock:
            try:
                return fn(self._connection(), *args)
            except psycopg.OperationalError:
                self.close()
                raise

    def fetch(self, needle: str = "") -> Fetched:
        """One refresh; with a `needle` (the console's filter), also the dead groups of the
        jobs whose error it matches, with the matcher of `--error`."""
        with self._lock:
            snap = self._read(lambda c: metrics.snapshot(c, self.schema, history=self._history))
            running = self._read(lambda c: joblists.running_jobs(c, self.schema))
            lines = self._read(lambda c: run(c, queues.overview_call(), self.schema))
            if not needle:
                return Fetched(snap, running, queues=lines)
            try:
                self._read(lambda c: check_regex(c, needle, self.schema))
            except InvalidInput as exc:
                return Fetched(snap, running, dead_matched=[], filter_problem=str(exc), needle=needle, queues=lines)
            matched = self._read(lambda c: joblists.dead_groups(c, self.schema, error=needle))
        return Fetched(snap, running, dead_matched=matched, needle=needle, queues=lines)

    def backend_pid(self) -> int:
        """The server process behind the connection the refreshes use."""
        with self._lock:
            return int(self._connection().info.backend_pid)

    def ready_jobs(self, job_type: str) -> list[ReadyJob]:
        result: list[ReadyJob] = self._read(lambda c: joblists.ready_jobs(c, job_type, self.schema))
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
        with Queue(self.dsn, schema=self.schema, max_connections=1) as queue:
            return queue.get(job_id)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class Actions:
    """Operator actions; each writes its audit row in the same transaction."""

    def __init__(self, dsn: str, schema: str, actor: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self.actor = actor
        self._queue = Queue(dsn, schema=schema, max_connections=2)

    def requeue_jobs(self, ids: list[int]) -> int:
        return len(self._queue.requeue(ids, actor=self.actor))

    def requeue_group(self, status: str, job_type: str, fingerprint: str, ids: list[int]) -> int:
        """Requeue exactly `ids` of the group (those still in it); how many moved."""
        return len(self._queue.requeue_dead_group(status, job_type, fingerprint or None, actor=self.actor, ids=ids))

    def kill_lease(self, job_id: int) -> int:
        return len(self._queue.kill_lease([job_id], actor=self.actor))

    def cancel(self, job_id: int) -> int:
        return len(self._queue.cancel([job_id], actor=self.actor))

    def pause_schedule(self, name: str) -> bool:
        with connect(self.dsn, autocommit=True) as conn:
            return schedules.pause(conn, name, self.schema, actor=self.actor)

    def resume_schedule(self, name: str) -> bool:
        with connect(self.dsn, autocommit=True) as conn:
            return schedules.resume(conn, name, self.schema, actor=self.actor)

    def run_schedule_now(self, name: str) -> int:
        with connect(self.dsn, autocommit=True) as conn:
            return schedules.run_now(conn, name, self.schema, actor=self.actor)

    def close(self) -> None:
        self._queue.close()
