"""Cron schedules turned into jobs, exactly once per slot, however many instances run.

    scheduler = Scheduler(dsn)
    await scheduler.run(stop_event)      # also runs inside every worker by default

Each tick locks the due schedule rows (SKIP LOCKED), enqueues one job per slot with the
idempotency key `schedule:<id>:<slot>`, and advances the row in the same transaction. All
slot arithmetic starts from the database's now(), never from this machine's clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg

from jobtui.core.audit import Audit, Recorded, operate
from jobtui.core.privileges import GRANTS_HINT
from jobtui.core.registry import ScheduleSpec
from jobtui.kernel import cronslots
from jobtui.kernel.checks import check_max_attempts, check_queue, check_text, check_type, encode_payload
from jobtui.kernel.cronslots import MissedPolicy
from jobtui.kernel.db import Call, Rows, arun, first_int, first_line, pooler_mode, run, statements
from jobtui.kernel.domain import DEFAULT_QUEUE, DEFAULT_SCHEMA
from jobtui.kernel.errors import DatabaseUnavailable, InvalidInput, JobtuiError, PrivilegeMissing
from jobtui.kernel.link import Connection, Link
from jobtui.kernel.server import now_call
from jobtui.kernel.timeouts import wait_event

log = logging.getLogger("jobtui.scheduler")
T = TypeVar("T")

MAX_TICK = 1.0
# A schedule whose slots cannot be computed (its row no longer valid) is retried this late.
RETRY_BROKEN = timedelta(minutes=1)
# Counting skipped slots of a long pause stops here (a per-second schedule paused for days).
MAX_SKIPPED_COUNTED = 100_000


class UnknownSchedule(JobtuiError):
    """No schedule has the given name."""


def _first_value(rows: Rows) -> Any:
    """The one column of the first row (a single column cannot shift), or None without rows."""
    return rows[0][0] if rows else None


def slot_key(schedule_id: int, slot: datetime) -> str:
    """The idempotency key of a slot's job."""
    return f"schedule:{schedule_id}:{slot.isoformat()}"


@dataclass(frozen=True, slots=True)
class Fired:
    schedule: str
    slot: datetime
    job_id: int | None
    missed: int


def _rows(rows: Rows) -> list[Any]:
    return list(rows)


def _one_id(rows: Rows) -> int:
    """The id of the one row a statement returned."""
    (column,) = rows.columns("id")
    return int(rows[0][column])


def _now(conn: psycopg.Connection[Any], schema: str) -> datetime:
    now = run(conn, now_call(), schema)
    return now


def _unknown(name: str) -> UnknownSchedule:
    return UnknownSchedule(f"no schedule named {name!r}; see `jobtui schedule list`")


def _found(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The row of schedule `name`; UnknownSchedule when there is none."""
    if not rows:
        raise _unknown(name)
    return rows[0]


def upsert(conn: psycopg.Connection[Any], spec: ScheduleSpec, *, source: str, schema: str = DEFAULT_SCHEMA) -> int:
    """Create or update a schedule from `spec`; returns its id. Runs in `conn`'s transaction."""
    cronslots.validate_schedule(spec.name, spec.cron, spec.timezone, spec.missed, spec.offset, spec.grace)
    check_type(spec.type)
    check_max_attempts(spec.max_attempts)
    now = _now(conn, schema)
    offset = spec.offset
    if offset is None:
        offset = cronslots.stable_offset(spec.name, cronslots.spread_bound(spec.cron, spec.timezone, now))
    params = {
        "name": spec.name,
        "job_type": spec.type,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "payload": encode_payload(spec.payload),
        "max_attempts": spec.max_attempts,
        "offset": offset,
        "missed_policy": spec.missed,
        "grace": float(spec.grace),
        "next_run_at": cronslots.next_slot(spec.cron, spec.timezone, now),
        "source": source,
        "queue": check_queue(DEFAULT_QUEUE if spec.queue is None else spec.queue),
    }
    return run(conn, Call("schedule_upsert", params, _one_id), schema)


def add(conn: psycopg.Connection[Any], spec: ScheduleSpec, *, actor: str, schema: str = DEFAULT_SCHEMA) -> int:
    """An operator's schedule from `spec` (`jobtui schedule add`), created or updated with its
    audit row; returns its id."""

    def change(conn: psycopg.Connection[Any]) -> int:
        return upsert(conn, spec, source="cli", schema=schema)

    return _audited(conn, change, actor, "schedule-add", spec.name, lambda _: Recorded(1), schema)


def sync(conn: psycopg.Connection[Any], specs: list[ScheduleSpec], schema: str = DEFAULT_SCHEMA) -> None:
    """Write the schedules declared in code (a worker does this when it starts)."""
    with conn.transaction():
        for spec in specs:
            upsert(conn, spec, source="code", schema=schema)


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A schedule as `jobtui schedule list`, stats and the console show it."""

    id: int
    name: str
    job_type: str
    cron: str
    timezone: str
    payload: Any
    max_attempts: int | None
    offset_seconds: float
    missed_policy: str
    grace_seconds: float
    paused: bool
    paused_at: datetime | None
    next_run_at: datetime
    last_slot: datetime
    last_fired_slot: datetime | None
    last_job_id: int | None
    missed_count: int  # slots handled past the grace (every scheduler down), fired late or not
    backfilled_count: int  # missed slots the policy fired late
    missed_slots: list[str]  # the newest 20 missed slots
    skipped_count: int
    source: str
    created_at: datetime
    db_now: datetime
    queue: str = DEFAULT_QUEUE  # where its jobs go


def list_schedules(conn: psycopg.Connection[Any], schema: str = DEFAULT_SCHEMA) -> list[ScheduleRow]:
    return run(conn, Call("schedule_list", {}, lambda rows: [ScheduleRow(**row) for row in rows.dicts()]), schema)


def pause(conn: psycopg.Connection[Any], name: str, schema: str = DEFAULT_SCHEMA, *, actor: str | None = None) -> bool:
    """Pause `name`; False when it was already paused. Takes effect at the next tick."""

    def change(conn: psycopg.Connection[Any]) -> bool:
        _lock(conn, name, schema)
        return bool(run(conn, Call("schedule_pause", {"name": name}, _rows), schema))

    return _audited(conn, change, actor, "schedule-pause", name, _flipped, schema)


def resume(conn: psycopg.Connection[Any], name: str, schema: str = DEFAULT_SCHEMA, *, actor: str | None = None) -> bool:
    """Resume `name`; slots passed while paused count as skipped. False when not paused."""

    def change(conn: psycopg.Connection[Any]) -> bool:
        row = _lock(conn, name, schema)
        cron, timezone, now = row["cron"], row["timezone"], row["now"]
        if not row["paused"]:
            return False
        skipped = len(cronslots.slots_between(cron, timezone, row["last_slot"], now, limit=MAX_SKIPPED_COUNTED))
        params = {"name": name, "next_run_at": cronslots.next_slot(cron, timezone, now), "skipped": skipped}
        return bool(run(conn, Call("schedule_resume", params, _rows), schema))

    return _audited(conn, change, actor, "schedule-resume", name, _flipped, schema)


def remove(conn: psycopg.Connection[Any], name: str, schema: str = DEFAULT_SCHEMA, *, actor: str | None = None) -> None:
    check_text(name, "schedule name")

    def change(conn: psycopg.Connection[Any]) -> None:
        if not run(conn, Call("schedule_remove", {"name": name}, _rows), schema):
            raise _unknown(name)

    _audited(conn, change, actor, "schedule-remove", name, lambda _: Recorded(1), schema)


def rewind(conn: psycopg.Connection[Any], name: str, seconds: float, schema: str = DEFAULT_SCHEMA) -> None:
    """Pretend every scheduler was down for `seconds`: the next tick finds those slots missed."""
    if not run(conn, Call("schedule_rewind", {"name": name, "seconds": seconds}, _rows), schema):
        raise _unknown(name)


def _audited(
    conn: psycopg.Connection[Any],
    change: Callable[[psycopg.Connection[Any]], T],
    actor: str | None,
    action: str,
    name: str,
    recorded: Callable[[T], Recorded],
    schema: str,
) -> T:
    """`change` in one transaction: with an `actor`, an operator's change, through the one
    audited path (`audit.operate`) with its audit row; without, the scheduler's own."""
    if actor is not None:
        return operate(conn, change, Audit(actor, action, f"schedule {name}"), recorded, schema)
    with conn.transaction():
        return change(conn)


def _flipped(changed: bool) -> Recorded:
    """A pause or a resume: one row when it changed the schedule, none when it was so already."""
    return Recorded(int(changed))


def run_now(conn: psycopg.Connection[Any], name: str, schema: str = DEFAULT_SCHEMA, *, actor: str | None = None) -> int:
    """Enqueue the schedule's job now, outside its slots; returns the job id."""
    return _audited(
        conn,
        lambda conn: _run_now(conn, name, schema),
        actor,
        "schedule-run-now",
        name,
        lambda i: Recorded(1, [i]),
        schema,
    )


def _run_now(conn: psycopg.Connection[Any], name: str, schema: str) -> int:
    check_text(name, "schedule name")
    found = _found(run(conn, Call("schedule_get", {"name": name}, Rows.dicts), schema), name)
    now = _now(conn, schema)
    params = {
        "type": found["job_type"],
        "payload": json.dumps(found["payload"]),
        "key": f"schedule:{found['id']}:manual:{now.isoformat()}",
        "run_at": now,
        "max_attempts": found["max_attempts"],
        "queue": found["queue"],
    }
    return run(conn, Call("schedule_enqueue", params, _one_id), schema)


def _lock(conn: psycopg.Connection[Any], name: str, schema: str) -> dict[str, Any]:
    """The row of schedule `name`, locked until the transaction ends."""
    check_text(name, "schedule name")
    return _found(run(conn, Call("schedule_lock", {"name": name}, Rows.dicts), schema), name)


async def fire_due(conn: psycopg.AsyncConnection[Any], schema: str = DEFAULT_SCHEMA, limit: int = 100) -> list[Fired]:
    """One tick: enqueue the jobs of every due slot and advance the schedules, atomically."""
    fired: list[Fired] = []
    async with conn.transaction():
        due = await arun(conn, Call("schedule_due", {"limit": limit}, Rows.dicts), schema)
        for row in due:
            sid, name, cron, timezone, policy, grace = (
                row["id"], row["name"], row["cron"], row["timezone"], row["missed_policy"], row["grace_seconds"]
            )  # fmt: skip
            last_slot, now = row["last_slot"], row["now"]
            try:
                slot_plan = cronslots.plan(
                    cron, timezone, last_slot, now, MissedPolicy(policy), timedelta(seconds=grace)
                )
            except (InvalidInput, ValueError) as exc:
                log.error("schedule %s: cannot compute its slots (%s); pause or fix it", name, exc)
                # Not due again at every tick: that would spin every scheduler on it.
                await arun(conn, Call("schedule_defer", {"id": sid, "until": now + RETRY_BROKEN}, _rows), schema)
                continue
            job_id = None
            for slot in slot_plan.fire:
                params = {
                    "type": row["job_type"],
                    "payload": json.dumps(row["payload"]),
                    "key": slot_key(sid, slot),
                    # In UTC: adding to a wall-clock time is off by an hour across a DST change.
                    "run_at": slot.astimezone(UTC) + timedelta(seconds=row["offset_seconds"]),
                    "max_attempts": row["max_attempts"],
                    "queue": row["queue"],
                }
                new_id = await arun(conn, Call("schedule_enqueue", params, first_int), schema)
                # None: the slot's job exists already (its key), and the last id stays.
                job_id = new_id if new_id is not None else job_id
                fired.append(Fired(name, slot, job_id, slot_plan.missed_count))
            if slot_plan.missed_count:
                # The missed slots of one tick are one outage: all between the last slot handled
                # and the grace before now. One line for it, however many slots it took.
                log.warning("%s", outage_message(name, policy, grace, slot_plan))
            handled = slot_plan.fire + slot_plan.missed
            params = {
                "id": sid,
                # Compared in UTC: the same ZoneInfo compares wall clocks, ignoring DST's fold.
                "last_slot": max(handled, key=lambda s: s.astimezone(UTC)) if handled else now,
                "next_run_at": slot_plan.next_slot,
                "fired_slot": slot_plan.fire[-1] if slot_plan.fire else None,
                "job_id": job_id,
                "missed": slot_plan.missed,
                "missed_count": slot_plan.missed_count,
                "backfilled": slot_plan.backfilled,
            }
            await arun(conn, Call("schedule_advance", params, _rows), schema)
    return fired


def outage_message(name: str, policy: str, grace: float, slot_plan: cronslots.SlotPlan) -> str:
    """The one WARNING line of an outage: how many slots were missed, when, and their fate."""
    first = slot_plan.first_missed or slot_plan.missed[0]
    newest = slot_plan.missed[-1]
    fate = {
        MissedPolicy.SKIP: "none of them runs",
        MissedPolicy.ONCE: f"one job runs now, for the latest ({newest.isoformat()})",
        MissedPolicy.ALL: f"{slot_plan.backfilled} of them run now (the newest {cronslots.MAX_BACKFILL} at most)",
    }[MissedPolicy(policy)]
    return (
        f"schedule {name} missed {slot_plan.missed_count} slot(s) from {first.isoformat()} to {newest.isoformat()}: "
        f"no scheduler ran within their grace of {grace:g}s; policy {policy}: {fate}"
    )


class Scheduler:
    """The scheduler loop; runs alone (`jobtui scheduler`) or inside a worker."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        specs: list[ScheduleSpec] | None = None,
        pooler: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.pooler = pooler_mode(pooler)  # see db.pooler_mode
        self.schema = statements(schema).schema
        self.specs = specs or []
        self.fired_count = 0
        # Quieted by an operator (`jobtui workers quiet`): it fires no slot until resumed; the
        # other schedulers fire them, or the missed-slot policy does once it is resumed.
        self.quiet = False

    async def run(self, stopping: asyncio.Event, *, link: Link | None = None) -> None:
        """Tick until `stopping` is set; reconnects by itself after database outages.

        With a worker's `link`, it comes back with the worker's other connections after an
        outage, once their heartbeat went. Raises PrivilegeMissing when the role may not do
        a scheduler's work (that will not fix itself).
        """
        conn = Connection(self.dsn, "scheduler", link=link, gated=link is not None, pooler=self.pooler)
        try:
            if self.specs:
                await self._sync_specs_when_up(conn, stopping)
            while not stopping.is_set():
                wait = MAX_TICK
                live = None
                try:
                    if self.quiet:
                        await wait_event(stopping, wait)
                        continue
                    live = await conn.get(stopping)
                    async with conn.busy():  # the link watches how long the tick waits
                        fired = await fire_due(live, self.schema)
                        self.fired_count += len(fired)
                        for f in fired:
                            log.info("schedule %s: slot %s -> job %s", f.schedule, f.slot.isoformat(), f.job_id)
                        until = await arun(live, Call("schedule_next_due", {}, _first_value), self.schema)
                    if until is not None:
                        wait = max(0.01, min(MAX_TICK, float(until)))
                except (psycopg.OperationalError, DatabaseUnavailable) as exc:
                    if stopping.is_set():
                        break
                    conn.lost(exc, live)
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise PrivilegeMissing(
                        f"the scheduler's tick was refused: {first_line(exc)}; {GRANTS_HINT}"
                    ) from None
                except psycopg.Error as exc:
                    log.error("scheduler tick failed: %s", first_line(exc))
                await wait_event(stopping, wait)
        finally:
            await conn.close()

    async def _sync_specs_when_up(self, conn: Connection, stopping: asyncio.Event) -> None:
        """Sync the schedules declared in code, waiting for the database if it is away."""
        while not stopping.is_set():
            await conn.link.wait(False, stopping)
            try:
                await asyncio.to_thread(self._sync_specs)
                return
            except psycopg.errors.InsufficientPrivilege as exc:
                raise PrivilegeMissing(
                    f"syncing the app's schedules was refused: {first_line(exc)}; {GRANTS_HINT}"
                ) from None
            except (psycopg.OperationalError, DatabaseUnavailable) as exc:
                conn.link.down(exc)

    def _sync_specs(self) -> None:
        from jobtui.kernel.db import connect

        with connect(self.dsn, pooler=self.pooler) as sync_conn:
            sync(sync_conn, self.specs, self.schema)
