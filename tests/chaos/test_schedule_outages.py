"""Schedules through real outages: every scheduler process SIGKILLed or SIGSTOPped for less
than the schedules' grace, or for more, with per-second schedules of each missed-slot policy.

What each slot got is read from the jobs themselves: a slot's job was enqueued in the tick
whose now() is its created_at, so `created_at - slot` is how late the slot was handled. Within
the grace it ran on time; later it was missed, and only the policy's backfill gave it a job.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobtui.core import scheduler as sched
from jobtui.core.registry import ScheduleSpec
from jobtui.kernel.cronslots import MAX_BACKFILL
from tests.chaos.harness import Proc, Procs
from tests.waits import hold, wait_until
from tests.workers import scheduler_started

Conn = psycopg.Connection[Any]
SECOND = timedelta(seconds=1)
POLICIES = ("skip", "once", "all")


def db_clock(db: Conn) -> datetime:
    found = db.execute("SELECT clock_timestamp()").fetchone()
    assert found is not None
    return found[0]  # type: ignore[no-any-return]


def add_schedule(dsn: str, name: str, missed: str, grace: float | None) -> int:
    spec = ScheduleSpec(name, "* * * * * *", "outage.tick", payload={}, offset=0.0, missed=missed)
    if grace is not None:
        spec = ScheduleSpec(name, spec.cron, spec.type, {}, offset=0.0, missed=missed, grace=grace)
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        return sched.upsert(conn, spec, source="cli")


def jobs_by_slot(db: Conn, schedule_id: int) -> dict[datetime, list[datetime]]:
    """slot -> created_at of each job its key enqueued (a list, to see a second one)."""
    prefix = f"schedule:{schedule_id}:"
    rows = db.execute(
        "SELECT idempotency_key, created_at FROM jobtui.job WHERE idempotency_key LIKE %s", (prefix + "%",)
    ).fetchall()
    out: dict[datetime, list[datetime]] = {}
    for key, created_at in rows:
        out.setdefault(datetime.fromisoformat(str(key)[len(prefix) :]), []).append(created_at)
    return out


def schedule_row(db: Conn, schedule_id: int) -> dict[str, Any]:
    cur = db.execute("SELECT * FROM jobtui.schedule WHERE id = %s", (schedule_id,))
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


def every_slot(db: Conn, schedule_id: int) -> list[datetime]:
    """Every slot from the schedule's creation to the last one a scheduler handled."""
    row = schedule_row(db, schedule_id)
    slot = row["created_at"].replace(microsecond=0) + SECOND
    slots = []
    while slot <= row["last_slot"]:
        slots.append(slot)
        slot += SECOND
    return slots


def start_schedulers(procs: Procs, tag: str, n: int = 2) -> list[Proc]:
    started = [procs.start(f"scheduler-{tag}{i}", ["scheduler"]) for i in range(n)]
    for p in started:
        wait_until(lambda p=p: scheduler_started(p.log()) or not p.alive(), 30, "a scheduler to start", p.log)
        assert p.alive(), p.log()
    return started


def outage_lines(procs: Procs, name: str) -> list[str]:
    """The WARNING lines every scheduler process logged about schedule `name` missing slots."""
    pattern = re.compile(rf"^.* WARNING jobtui\.scheduler: schedule {re.escape(name)} missed .*$", re.M)
    return [line for p in procs.all for line in pattern.findall(p.log())]


def run_outage(
    db: Conn, dsn: str, procs: Procs, *, policies: tuple[str, ...], grace: float | None, down: float, how: str
) -> tuple[dict[str, int], datetime, datetime]:
    """Per-second schedules ticking under two schedulers, then every scheduler down for `down`
    seconds (`how`: SIGKILL and fresh processes afterwards, or SIGSTOP then SIGCONT); returns
    the schedules' ids and the database's clock when the outage began and ended."""
    first = start_schedulers(procs, "a")
    ids = {policy: add_schedule(dsn, f"outage-{policy}", policy, grace) for policy in policies}
    for sid in ids.values():
        wait_until(lambda sid=sid: len(jobs_by_slot(db, sid)) >= 3, 20, "slots before the outage", first[0].log)
    began = db_clock(db)
    for p in first:
        if how == "kill":
            p.kill()
        else:
            p.stop()
    hold(down, "the schedulers down")
    ended = db_clock(db)
    if how == "kill":
        start_schedulers(procs, "b")
    else:
        for p in first:
            p.cont()
    # Back for a few slots more, handled on time again.
    for sid in ids.values():
        wait_until(
            lambda sid=sid: max(jobs_by_slot(db, sid)) >= ended + 3 * SECOND, 30, "slots after the outage", first[0].log
        )
    for p in procs.all:
        if p.alive():
            p.terminate()
    return ids, began, ended


def lateness(created: list[datetime], slot: datetime) -> timedelta:
    return created[0] - slot


def test_every_scheduler_killed_for_less_than_the_default_grace_misses_no_slot(
    db: Conn, chaos_dsn: str, procs: Procs
) -> None:
    """The default grace is 30 s, whatever the interval: a per-second schedule whose schedulers
    are all down for 8 s gets every one of those slots late, and none missed, under any policy."""
    ids, began, ended = run_outage(db, chaos_dsn, procs, policies=POLICIES, grace=None, down=8.0, how="kill")
    for policy, sid in ids.items():
        jobs = jobs_by_slot(db, sid)
        slots = every_slot(db, sid)
        assert set(jobs) == set(slots), policy  # a job for every slot, none for another one
        assert all(len(created) == 1 for created in jobs.values()), policy
        late = [s for s in slots if lateness(jobs[s], s) > 3 * SECOND]
        # The outage was real: the slots inside it ran late (more than the 3 intervals that
        # used to be the limit), when the new schedulers came up, and none was lost.
        certain = [s for s in slots if began + SECOND <= s <= ended - 3 * SECOND]
        assert len(certain) >= 3 and set(certain) <= set(late), (policy, late, began, ended)
        assert all(began - 2 * SECOND <= s <= ended for s in late), (policy, late, began, ended)
        assert timedelta(seconds=7) <= max(lateness(jobs[s], s) for s in slots) <= timedelta(seconds=30)
        row = schedule_row(db, sid)
        assert (row["grace_seconds"], row["missed_count"], row["backfilled_count"], row["missed_slots"]) == (
            30.0,
            0,
            0,
            [],
        ), policy
        assert outage_lines(procs, f"outage-{policy}") == []


# How each policy's test takes every scheduler down: killed (new processes come up) or
# stopped and continued (the same processes wake up).
POLICY_OUTAGES = [("skip", "kill"), ("once", "stop"), ("all", "kill")]


@pytest.mark.parametrize(("policy", "how"), POLICY_OUTAGES)
def test_an_outage_longer_than_the_grace_follows_the_policy(
    db: Conn, chaos_dsn: str, procs: Procs, policy: str, how: str
) -> None:
    """Grace 2 s, every scheduler down for 6 s: the slots handled more than 2 s late were
    missed. skip runs none of them, once one job for the latest, all every one of them; each
    counts them all on the schedule and logs one WARNING line for the outage."""
    grace = timedelta(seconds=2)
    ids, began, ended = run_outage(
        db, chaos_dsn, procs, policies=(policy,), grace=grace.total_seconds(), down=6.0, how=how
    )
    sid = ids[policy]
    jobs = jobs_by_slot(db, sid)
    slots = every_slot(db, sid)
    assert set(jobs) <= set(slots) and all(len(created) == 1 for created in jobs.values())
    on_time = [s for s in slots if s in jobs and lateness(jobs[s], s) <= grace]
    missed = [s for s in slots if s not in on_time]
    # Missed: the slots of the outage, up to the grace before the schedulers came back; at
    # least those from the first second down to the grace before the outage's end.
    certain = [s for s in slots if began + SECOND <= s <= ended - grace]
    assert len(certain) >= 3 and set(certain) <= set(missed), (missed, began, ended)
    assert all(began - 2 * SECOND <= s <= ended + 5 * SECOND for s in missed), (missed, began, ended)
    backfilled = sorted(s for s in missed if s in jobs)
    expected = {"skip": [], "once": missed[-1:], "all": missed[-MAX_BACKFILL:]}[policy]
    assert backfilled == expected, (policy, backfilled, missed)
    # The backfill ran when the schedulers came back, in the same tick as the on-time slots.
    comeback = min(jobs[s][0] for s in on_time if s > began)
    assert all(jobs[s][0] == comeback for s in backfilled)

    row = schedule_row(db, sid)
    assert row["grace_seconds"] == grace.total_seconds()
    assert (row["missed_count"], row["backfilled_count"]) == (len(missed), len(expected))
    assert [datetime.fromisoformat(s) for s in row["missed_slots"]] == missed[-20:]
    [line] = outage_lines(procs, f"outage-{policy}")  # one line for the outage, not one per slot
    first, last = missed[0].isoformat(), missed[-1].isoformat()
    assert f"missed {len(missed)} slot(s) from {first} to {last}" in line, line
    assert f"grace of 2s; policy {policy}" in line, line
