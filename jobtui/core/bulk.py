"""Bulk actions over any filter, at any scale: requeue or discard dead and failed jobs, cancel
ready and running ones, a batch at a time.

Each batch is one statement in a short transaction of its own (sql/bulk.sql, bulk_*_batch):
it changes at most `batch` jobs, locks them SKIP LOCKED (a job a worker or another operator
holds is passed over, and tried again at the end), and writes the run's progress with them.
Workers claim meanwhile. A run begins at the mark of its count (the database's now() and the
newest job's id when the count began): it walks the ids down from that job, and changes only
jobs that finished (requeue, discard) or were enqueued (cancel) before that moment, so a job
that matched after the count is left alone. A second run with the same action and filter
resumes a run that was stopped or killed, at its mark, from where it got to, and changes
nothing twice. Each invocation writes one audit row with the filter and the counts. Nothing
outlives a transaction, so it works through a transaction pooler.

    with connect(dsn, autocommit=True) as conn:
        bulk = Bulk(conn, "requeue", JobFilter(types=("invoice.render",)), actor="olga")
        tally = bulk.tally()
        print(tally.jobs, "would be requeued")
        outcome = bulk.run(bulk.start(tally.mark))
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg

from jobtui.core.audit import record_audit
from jobtui.kernel.checks import check_text
from jobtui.kernel.db import Call, Rows, run, statements
from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.jobfilter import JobFilter
from jobtui.reads.deadletters import check_regex
from jobtui.reads.jobquery import bounds_call, timeout_call

Action = Literal["requeue", "discard", "cancel"]
ACTIONS: tuple[Action, ...] = ("requeue", "discard", "cancel")
# The statuses each action applies to.
SCOPE: dict[Action, tuple[str, ...]] = {
    "requeue": ("dead", "failed"),
    "discard": ("dead", "failed"),
    "cancel": ("ready", "running"),
}
PAST: dict[Action, str] = {"requeue": "requeued", "discard": "discarded", "cancel": "cancelled"}
BATCH = 1000  # jobs a statement changes at most: the row locks it holds at once
WINDOW = 50_000  # ids a statement reads at most
TIMEOUT = 30.0  # seconds a statement may take before the server ends it
BUSY_ROUNDS = 3  # times the jobs passed over as busy are tried again at the end
# After each batch the run rests this many times as long as the batch took: a bulk action
# takes at most half of the database's time, and the workers keep the rest.
REST = 1.0

Progress = Callable[[float, int], None]  # (share of the ids done, jobs changed by the run)


@dataclass(frozen=True, slots=True)
class Mark:
    """Where a count began: the database's now() and the newest job's id then. A run begun at
    it changes only the jobs the count could see."""

    cutoff: datetime
    last_id: int


@dataclass(frozen=True, slots=True)
class Tally:
    """A count of the filter's jobs the action applies to, on either side of its mark."""

    mark: Mark
    jobs: int  # within the mark: what a run begun at it changes
    later: int  # past it (enqueued, or finished, since): what such a run leaves


@dataclass(frozen=True, slots=True)
class BulkRun:
    """A run of `bulk_run`: what it does, over which jobs, and how far it got."""

    id: int
    action: Action
    filter: dict[str, Any]
    cutoff: datetime
    last_id: int
    next_id: int
    changed: int
    busy_ids: list[int]
    state: str
    started_by: str
    started_at: datetime
    resumed: bool = False

    @property
    def mark(self) -> Mark:
        return Mark(self.cutoff, self.last_id)


@dataclass(frozen=True, slots=True)
class BulkOutcome:
    run: int
    changed: int  # by this invocation
    changed_in_all: int  # by the run, earlier invocations included
    busy: list[int]  # jobs still held by another transaction at the end: run again for them
    stopped: bool  # stopped before the end (a second run resumes it)
    resumed: bool


def outcome_line(action: Action, outcome: BulkOutcome, counted: int | None, later: int | None, again: str) -> str:
    """What a run did, against what its question said: `counted` jobs (None: a resumed run,
    whose question gave no count), and `later` ones that matched past its mark (None: not
    known); `again` says how to go on ("press d again", "run the command again")."""
    diff = 0 if counted is None or outcome.stopped else counted - outcome.changed - len(outcome.busy)
    done = f"{outcome.changed:,} of the {counted:,} job(s) counted" if diff > 0 else f"{outcome.changed:,} job(s)"
    said = f"{PAST[action]} {done} (bulk run {outcome.run}"
    said += f", {outcome.changed_in_all:,} in all)" if outcome.resumed else ")"
    if diff > 0:
        said += f": {diff:,} no longer matched (changed elsewhere meanwhile)"
    elif diff < 0:
        said += (
            f": {-diff:,} more than counted, whose change (an enqueue, a job's end) was committing"
            " while the count was made"
        )
    if outcome.stopped:
        said += f"; stopped: {again} to resume"
    if outcome.busy:
        said += f"; {len(outcome.busy)} job(s) were held by another transaction: {again} for them"
    if later:
        since = "the count" if counted is not None else f"bulk run {outcome.run} began"
        said += f"; {later:,} job(s) matched after {since} and were left: {again} for them"
    return said


def _runs(rows: Rows) -> list[BulkRun]:
    return [BulkRun(**{**d, "busy_ids": list(d["busy_ids"] or [])}) for d in rows.dicts()]


class Bulk:
    """One bulk action over one filter, on one connection (autocommit: each batch is a
    transaction of its own)."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        action: str,
        filt: JobFilter,
        *,
        actor: str,
        schema: str = DEFAULT_SCHEMA,
        batch: int = BATCH,
        window: int = WINDOW,
        timeout: float = TIMEOUT,
        rest: float = REST,
    ) -> None:
        if action not in ACTIONS:
            raise InvalidInput(f"unknown bulk action {action!r}: use {', '.join(ACTIONS)}")
        if not 1 <= batch <= 100_000:
            raise InvalidInput(f"a batch must be 1 to 100,000 jobs, got {batch}")
        chosen: Action = action
        bad = [s for s in filt.statuses if s not in SCOPE[chosen]]
        if bad:
            raise InvalidInput(f"{action} applies to {' and '.join(SCOPE[chosen])} jobs, not {', '.join(bad)}")
        self.conn = conn
        self.action = chosen
        self.filter = filt
        self.actor = check_text(actor, "actor")
        self.schema = schema
        self.batch = batch
        self.window = window
        self.timeout = timeout
        if not 0 <= rest <= 100:
            raise InvalidInput(f"a rest must be 0 to 100 times a batch's time, got {rest}")
        self.rest = rest
        check_regex(conn, filt.error, schema)

    @property
    def filter_json(self) -> str:
        return json.dumps(self.filter.to_json(), sort_keys=True)

    def _timed(self, call: Call[Any]) -> Any:
        with self.conn.transaction():
            run(self.conn, timeout_call(self.timeout), self.schema)
            return run(self.conn, call, self.schema)

    def _lowest(self) -> int:
        bounds = self._timed(bounds_call(self.schema))
        return int(bounds["lowest"] or 0)

    def mark(self) -> Mark:
        """The database's now() and the newest job's id: where a count begins."""
        got = self._timed(Call("bulk_mark", {}, Rows.dicts))[0]
        return Mark(got["cutoff"], int(got["last_id"]))

    def count(self, progress: Progress | None = None, stop: threading.Event | None = None) -> int:
        """How many jobs a run begun now would change: the dry run, window by window."""
        return self.tally(progress=progress, stop=stop).jobs

    def tally(
        self, mark: Mark | None = None, progress: Progress | None = None, stop: threading.Event | None = None
    ) -> Tally:
        """The dry run, window by window: the jobs a run begun at `mark` (a new one when None:
        give `start` the tally's) changes, and those it leaves, having matched since."""
        mark = self.mark() if mark is None else mark
        bounds = self._timed(bounds_call(self.schema))
        lowest, top = int(bounds["lowest"] or 0), int(bounds["highest"] or 0) + 1
        below, jobs, later = top, 0, 0
        params = {
            **self.filter.params(),
            "at": mark.cutoff,  # ages as the run counts them
            "scope": list(SCOPE[self.action]),
            "cancel": self.action == "cancel",
            "cutoff": mark.cutoff,
            "last_id": mark.last_id,
        }
        while below > lowest:
            if stop is not None and stop.is_set():
                raise InvalidInput("the count was stopped; nothing was changed")
            floor = max(lowest, below - self.window)
            got = self._timed(Call("bulk_count", {**params, "floor": floor, "below": below}, Rows.dicts))[0]
            jobs, later = jobs + int(got["jobs"]), later + int(got["later"])
            below = floor
            if progress is not None:
                progress((top - below) / max(1, top - lowest), jobs)
        return Tally(mark, jobs, later)

    def pending(self) -> BulkRun | None:
        """The run of this action and filter that a second run would resume, if any."""
        params = {"action": self.action, "filter": self.filter_json}
        found = run(self.conn, Call("bulk_run_find", params, _runs), self.schema)
        return found[0] if found else None

    def start(self, mark: Mark | None = None) -> BulkRun:
        """Resume the pending run (at its own mark), or begin one at `mark`: the one of the
        count the operator was shown (None: a new mark, now)."""
        pending = self.pending()
        if pending is not None:
            with self.conn.transaction():
                run(self.conn, Call("bulk_run_state", {"run": pending.id, "state": "running"}, len), self.schema)
            return BulkRun(**{**_fields(pending), "state": "running", "resumed": True})
        mark = self.mark() if mark is None else mark
        params = {
            "action": self.action,
            "filter": self.filter_json,
            "actor": self.actor,
            "cutoff": mark.cutoff,
            "last_id": mark.last_id,
        }
        with self.conn.transaction():
            return run(self.conn, Call("bulk_run_start", params, _runs), self.schema)[0]

    def _batch(self, job_run: BulkRun, floor: int, below: int, ids: list[int] | None) -> dict[str, Any]:
        params = {
            **self.filter.params(),
            # Ages count from the cutoff, as the count did (a run begun without a count's mark
            # has its start as its cutoff).
            "at": job_run.cutoff,
            "run": job_run.id,
            "floor": floor,
            "below": below,
            "ids": ids,
            "batch": self.batch,
            "actor": self.actor,
            "channel": statements(self.schema).channel,
        }
        result: dict[str, Any] = self._timed(Call(f"bulk_{self.action}_batch", params, Rows.dicts))[0]
        return result

    def run(
        self, job_run: BulkRun, progress: Progress | None = None, stop: threading.Event | None = None
    ) -> BulkOutcome:
        """Work the run off, batch by batch, then try the busy jobs again; end it (done, or
        stopped when `stop` was set) with one audit row."""
        lowest = self._lowest()
        below = job_run.next_id
        changed = 0
        busy = list(job_run.busy_ids)
        stopped = False
        span = max(1, job_run.last_id + 1 - lowest)
        before = job_run.changed
        try:
            while below > lowest:
                if stop is not None and stop.is_set():
                    stopped = True
                    break
                floor = max(lowest, below - self.window)
                took = time.monotonic()
                got = self._batch(job_run, floor, below, None)
                if not got["running"]:  # ended elsewhere (another invocation finished it)
                    break
                # Counted before the rest: a Ctrl-C during it must not leave a committed batch
                # out of the audit row.
                changed += int(got["changed"])
                busy += [int(i) for i in got["busy"]]
                below = int(got["next_id"])
                if self.rest and int(got["changed"]):
                    pause = (time.monotonic() - took) * self.rest
                    if stop is not None:
                        stop.wait(pause)
                    else:
                        time.sleep(pause)
                if progress is not None:
                    progress(min(1.0, (job_run.last_id + 1 - below) / span), before + changed)
            for attempt in range(BUSY_ROUNDS):
                if stopped or not busy:
                    break
                time.sleep(0.2 * attempt)
                got = self._batch(job_run, 0, job_run.last_id + 1, sorted(set(busy)))
                changed += int(got["changed"])
                busy = [int(i) for i in got["busy"]]
            self._audit(job_run, changed, before, busy, stopped=stopped, end=True)
        except BaseException:
            # KeyboardInterrupt, a lost connection: every batch committed is recorded in the
            # run; it is left running, and the next run with the same filter resumes it. The
            # run's row counts a batch whose COMMIT the interruption met, and tells whether the
            # end's own audit row committed before it.
            committed = self._committed(job_run)
            if committed is not None:
                self._audit(job_run, max(changed, committed - before), before, busy, stopped=True, end=False)
            raise
        return BulkOutcome(job_run.id, changed, before + changed, busy, stopped, job_run.resumed)

    def _committed(self, job_run: BulkRun) -> int | None:
        """How many jobs `job_run` changed in all, by its row, while it has not ended; None
        once it ended (its audit row is written). Unknown (the connection lost): the row's
        count as this invocation last read it, so that an audit row is still tried."""
        try:
            found = self.pending()
        except psycopg.Error:
            return job_run.changed
        if found is None or found.id != job_run.id or found.state != "running":
            return None
        return found.changed

    def _audit(self, job_run: BulkRun, changed: int, before: int, busy: list[int], *, stopped: bool, end: bool) -> None:
        detail = {
            "run": job_run.id,
            "filter": self.filter.to_json(),
            PAST[self.action]: changed,
            f"{PAST[self.action]}_in_all": before + changed,
            "busy": len(busy),
            "stopped": stopped,
            "resumed": job_run.resumed,
        }
        target = f"bulk run {job_run.id}: {self.filter.describe()}"
        # Not audit.operate: the change is many short transactions, one per batch; this one
        # row, with the run's end, tells them all.
        try:
            with self.conn.transaction():
                if end:
                    state = {"run": job_run.id, "state": "stopped" if stopped else "done"}
                    run(self.conn, Call("bulk_run_state", state, len), self.schema)
                record_audit(
                    self.conn, self.actor, f"bulk-{self.action}", target, changed, detail=detail, schema=self.schema
                )
        except psycopg.Error:
            if end:
                raise
            # On the way out after a failure the connection may be gone: the run's row has
            # the count of every batch it committed.


def _fields(r: BulkRun) -> dict[str, Any]:
    return {f: getattr(r, f) for f in BulkRun.__dataclass_fields__}
