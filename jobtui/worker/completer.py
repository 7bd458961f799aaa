"""The completer: writes the outcomes of finished attempts in batches, one statement per kind
of outcome, and tells each job whether its row was written (its lease may have been lost).

Outcomes are written as soon as the previous write returns; what finishes meanwhile joins
the next statement, so batches form by themselves under load without a fixed delay (a fixed
delay paced low concurrency).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from jobtui.core.claims import complete_call, complete_deleting_call, fail_call, fail_permanently_call, release_call
from jobtui.kernel.db import first_line
from jobtui.kernel.domain import FailOutcome, Failure, JobStatus, Lease
from jobtui.kernel.link import Connection
from jobtui.worker.outcome import Outcome, Written

log = logging.getLogger("jobtui.worker")

FLUSH_DELAY = 0.0


# What waits to be written, per statement: (lease, written, outcome, error, delay), a plain
# tuple (a NamedTuple's constructor is Python code, run once per job).
_Pending = tuple[Lease, Written, Outcome, str, float]


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
        # By statement: grouped as they come, not again at each write.
        self._pending: dict[str, list[_Pending]] = {}
        self._wake = asyncio.Event()

    def submit(self, outcome: Outcome, lease: Lease, written: Written, error: str = "", delay: float = 0.0) -> None:
        """Queue an outcome; `written` is called once it was written or refused."""
        waiting = self._pending.get(outcome.statement)
        if waiting is None:
            waiting = self._pending[outcome.statement] = []
        waiting.append((lease, written, outcome, error, delay))
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
            batch, self._pending = self._pending, {}
            await self._flush(batch)

    async def _flush(self, batch: dict[str, list[_Pending]]) -> None:
        written: set[int] = set()
        for statement, items in batch.items():
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
        for items in batch.values():
            for lease, told, _outcome, _error, _delay in items:
                try:
                    told(lease.job_id in written)
                except Exception:  # one submitter's bug must not keep the others from learning
                    log.exception("job %d: internal error after its outcome was written", lease.job_id)

    async def _write(self, statement: str, items: list[_Pending]) -> set[int]:
        leases = [i[0] for i in items]
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
        errors = [i[3] for i in items]
        if statement == "permanent":
            return await self._conn.run(fail_permanently_call(leases, errors), self._schema)
        delays = [i[4] for i in items]
        if statement == "release":
            kinds = [i[2].value for i in items]
            call = release_call(leases, delays, kinds=kinds, reasons=errors)
            return await self._conn.run(call, self._schema)
        # fail and timeout: counted failures
        failures = [Failure(lease, error, delay) for lease, error, delay in zip(leases, errors, delays, strict=True)]
        outcomes = await self._conn.run(fail_call(failures), self._schema)
        for outcome in outcomes:
            if outcome.status is JobStatus.DEAD:
                self._on_dead(outcome)
        return {o.job_id for o in outcomes}
