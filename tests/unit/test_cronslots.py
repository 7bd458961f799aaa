"""Slot arithmetic: which slots are due, which were missed, offsets and validation."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from jobtui.kernel.cronslots import (
    MAX_BACKFILL,
    MAX_OFFSET_SECONDS,
    MissedPolicy,
    SlotPlan,
    next_slot,
    plan,
    slots_between,
    spread_bound,
    stable_offset,
    validate_schedule,
)
from jobtui.kernel.errors import InvalidInput

PARIS = ZoneInfo("Europe/Paris")
GRACE = timedelta(seconds=30)


def utc(text: str) -> datetime:
    """An aware UTC datetime from 'YYYY-MM-DD HH:MM[:SS[.ffffff]]'."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def in_utc(slots: list[datetime]) -> list[str]:
    return [s.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") for s in slots]


# -- slots_between ----------------------------------------------------------------------------

SLOTS_BETWEEN = [
    pytest.param(
        "*/15 * * * *",
        "UTC",
        utc("2026-01-01 00:00:30"),
        utc("2026-01-01 01:00"),
        ["2026-01-01 00:15:00", "2026-01-01 00:30:00", "2026-01-01 00:45:00", "2026-01-01 01:00:00"],
        id="5-field-quarter-hours",
    ),
    pytest.param(
        "0 * * * *",
        "UTC",
        utc("2026-01-01 10:00"),
        utc("2026-01-01 12:00"),
        ["2026-01-01 11:00:00", "2026-01-01 12:00:00"],
        id="after-exclusive-upto-inclusive",
    ),
    pytest.param("0 * * * *", "UTC", utc("2026-01-01 10:00"), utc("2026-01-01 10:59:59"), [], id="none-due"),
    pytest.param(
        "*/20 * * * * *",
        "UTC",
        utc("2026-01-01 12:00"),
        utc("2026-01-01 12:01"),
        ["2026-01-01 12:00:20", "2026-01-01 12:00:40", "2026-01-01 12:01:00"],
        id="6-field-every-20-seconds",
    ),
    pytest.param(
        # Seconds first: second 30 of minute 0 of every hour (seconds last would mean 00:30).
        "30 0 * * * *",
        "UTC",
        utc("2026-01-01 10:00"),
        utc("2026-01-01 12:00:30"),
        ["2026-01-01 10:00:30", "2026-01-01 11:00:30", "2026-01-01 12:00:30"],
        id="6-field-seconds-first",
    ),
    pytest.param(
        "0 9 * * MON-FRI",
        "America/New_York",
        utc("2026-01-02 00:00"),  # a Friday
        utc("2026-01-06 23:00"),
        ["2026-01-02 14:00:00", "2026-01-05 14:00:00", "2026-01-06 14:00:00"],
        id="weekdays-new-york",
    ),
    pytest.param(
        "0 9 * * *",
        "Asia/Kolkata",
        utc("2026-01-01 00:00"),
        utc("2026-01-02 12:00"),
        ["2026-01-01 03:30:00", "2026-01-02 03:30:00"],
        id="half-hour-zone",
    ),
    pytest.param(
        # Paris goes from UTC+1 to UTC+2 on 2026-03-29: 09:00 local stays 09:00 local.
        "0 9 * * *",
        "Europe/Paris",
        utc("2026-03-27 12:00"),
        utc("2026-03-31 12:00"),
        ["2026-03-28 08:00:00", "2026-03-29 07:00:00", "2026-03-30 07:00:00", "2026-03-31 07:00:00"],
        id="paris-daily-spring-forward",
    ),
    pytest.param(
        # Back from UTC+2 to UTC+1 on 2026-10-25.
        "0 9 * * *",
        "Europe/Paris",
        utc("2026-10-23 12:00"),
        utc("2026-10-27 12:00"),
        ["2026-10-24 07:00:00", "2026-10-25 08:00:00", "2026-10-26 08:00:00", "2026-10-27 08:00:00"],
        id="paris-daily-fall-back",
    ),
    pytest.param(
        # 02:00 local does not exist on 2026-03-29; every real hour still gets one slot.
        "0 * * * *",
        "Europe/Paris",
        utc("2026-03-28 23:00"),
        utc("2026-03-29 04:00"),
        [f"2026-03-29 {h:02d}:00:00" for h in range(5)],
        id="paris-hourly-spring-forward",
    ),
    pytest.param(
        # 02:00-03:00 local happens twice on 2026-10-25; both real hours get their slot.
        "0 * * * *",
        "Europe/Paris",
        utc("2026-10-24 22:00"),
        utc("2026-10-25 04:00"),
        ["2026-10-24 23:00:00"] + [f"2026-10-25 {h:02d}:00:00" for h in range(5)],
        id="paris-hourly-fall-back",
    ),
    pytest.param(
        "0 * * * * *",
        "Europe/Paris",
        utc("2026-10-25 00:58"),
        utc("2026-10-25 01:02"),
        ["2026-10-25 00:59:00", "2026-10-25 01:00:00", "2026-10-25 01:01:00", "2026-10-25 01:02:00"],
        id="paris-6-field-across-fall-back",
    ),
    pytest.param(
        # The database's session time zone can be the schedule's own: bounds given in Paris
        # time. At 00:45 UTC (02:45 CEST) the 02:00 CET slot (01:00 UTC) is still to come.
        "0 * * * *",
        "Europe/Paris",
        utc("2026-10-24 23:00").astimezone(PARIS),
        utc("2026-10-25 00:45").astimezone(PARIS),
        ["2026-10-25 00:00:00"],
        id="paris-fall-back-bounds-in-paris-time",
    ),
]


@pytest.mark.parametrize(("cron", "tz", "after", "upto", "expected"), SLOTS_BETWEEN)
def test_slots_between(cron: str, tz: str, after: datetime, upto: datetime, expected: list[str]) -> None:
    slots = slots_between(cron, tz, after, upto)
    assert in_utc(slots) == expected
    assert all(s.tzinfo == ZoneInfo(tz) for s in slots)  # slots are in the schedule's zone


def test_slots_between_keeps_the_newest_when_limited() -> None:
    start = utc("2026-01-01 12:00")
    slots = slots_between("* * * * * *", "UTC", start, start + timedelta(seconds=50), limit=3)
    assert in_utc(slots) == ["2026-01-01 12:00:48", "2026-01-01 12:00:49", "2026-01-01 12:00:50"]


# -- next_slot ----------------------------------------------------------------------------------

NEXT_SLOT = [
    pytest.param("*/15 * * * *", "UTC", utc("2026-01-01 00:07:10"), "2026-01-01 00:15:00", id="quarter"),
    pytest.param("0 * * * *", "UTC", utc("2026-01-01 10:00"), "2026-01-01 11:00:00", id="strictly-after"),
    pytest.param("*/10 * * * * *", "UTC", utc("2026-01-01 12:00:05.5"), "2026-01-01 12:00:10", id="6-field"),
    pytest.param("* * * * * *", "UTC", utc("2026-01-01 12:00:00.999"), "2026-01-01 12:00:01", id="per-second"),
    pytest.param("* * * * * *", "UTC", utc("2026-01-01 12:00:00"), "2026-01-01 12:00:01", id="per-second-on-slot"),
    pytest.param("0 0 1 * *", "Australia/Sydney", utc("2026-01-15 00:00"), "2026-01-31 13:00:00", id="sydney"),
    pytest.param("0 9 * * *", "Europe/Paris", utc("2026-03-28 12:00"), "2026-03-29 07:00:00", id="paris-spring"),
    pytest.param("0 9 * * *", "Europe/Paris", utc("2026-10-24 12:00"), "2026-10-25 08:00:00", id="paris-fall"),
    pytest.param("0 * * * *", "Europe/Paris", utc("2026-10-25 00:30"), "2026-10-25 01:00:00", id="paris-repeated-hour"),
    pytest.param(
        "0 * * * *",
        "Europe/Paris",
        utc("2026-10-25 00:30").astimezone(PARIS),
        "2026-10-25 01:00:00",
        id="paris-repeated-hour-from-paris-time",
    ),
]


@pytest.mark.parametrize(("cron", "tz", "after", "expected"), NEXT_SLOT)
def test_next_slot(cron: str, tz: str, after: datetime, expected: str) -> None:
    assert in_utc([next_slot(cron, tz, after)]) == [expected]


# -- plan -------------------------------------------------------------------------------------

MINUTE = "* * * * *"
T0 = utc("2026-01-01 12:00")  # a slot of MINUTE


def at(minutes: int, seconds: float = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


PLANS = [
    # (id, last_slot, now, policy, fire, missed, missed_count, backfilled)
    ("on-time-skip", at(-1), at(0, 10), MissedPolicy.SKIP, [at(0)], [], 0, 0),
    ("on-time-once", at(-1), at(0, 10), MissedPolicy.ONCE, [at(0)], [], 0, 0),
    ("on-time-all", at(-1), at(0, 10), MissedPolicy.ALL, [at(0)], [], 0, 0),
    ("exactly-on-slot", at(-1), at(0), MissedPolicy.SKIP, [at(0)], [], 0, 0),
    ("nothing-due", at(0), at(0, 59), MissedPolicy.ALL, [], [], 0, 0),
    # Five slots passed (11:56 to 12:00); the newest is on time, the four before it missed.
    ("missed-on-time-skip", at(-5), at(0, 10), MissedPolicy.SKIP, [at(0)], [at(-4), at(-3), at(-2), at(-1)], 4, 0),
    # once: one job for the latest missed slot, besides the on-time one (not the same as skip).
    (
        "missed-on-time-once",
        at(-5), at(0, 10), MissedPolicy.ONCE, [at(-1), at(0)], [at(-4), at(-3), at(-2), at(-1)], 4, 1,
    ),
    (
        "missed-on-time-all",
        at(-5), at(0, 10), MissedPolicy.ALL, [at(-4), at(-3), at(-2), at(-1), at(0)],
        [at(-4), at(-3), at(-2), at(-1)], 4, 4,
    ),
    # Five slots passed and even the newest is 45 s late: all missed.
    ("missed-late-skip", at(-5), at(0, 45), MissedPolicy.SKIP, [], [at(-4), at(-3), at(-2), at(-1), at(0)], 5, 0),
    ("missed-late-once", at(-5), at(0, 45), MissedPolicy.ONCE, [at(0)], [at(-4), at(-3), at(-2), at(-1), at(0)], 5, 1),
    (
        "missed-late-all",
        at(-5), at(0, 45), MissedPolicy.ALL, [at(-4), at(-3), at(-2), at(-1), at(0)],
        [at(-4), at(-3), at(-2), at(-1), at(0)], 5, 5,
    ),
    # Grace boundary: 30 s late is on time, a microsecond more is missed.
    ("grace-boundary-on-time", at(-1), at(0, 30), MissedPolicy.SKIP, [at(0)], [], 0, 0),
    ("grace-boundary-late", at(-1), at(0, 30.000001), MissedPolicy.SKIP, [], [at(0)], 1, 0),
    ("grace-boundary-late-once", at(-1), at(0, 30.000001), MissedPolicy.ONCE, [at(0)], [at(0)], 1, 1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("last_slot", "now", "policy", "fire", "missed", "missed_count", "backfilled"),
    [pytest.param(*p[1:], id=p[0]) for p in PLANS],
)
def test_plan(
    last_slot: datetime,
    now: datetime,
    policy: MissedPolicy,
    fire: list[datetime],
    missed: list[datetime],
    missed_count: int,
    backfilled: int,
) -> None:
    result = plan(MINUTE, "UTC", last_slot, now, policy, GRACE)
    assert result.fire == fire
    assert result.missed == missed
    assert (result.missed_count, result.backfilled) == (missed_count, backfilled)
    assert result.first_missed == (missed[0] if missed else None)
    assert result.next_slot == next_slot(MINUTE, "UTC", now)
    assert result.next_slot > now


def test_plan_without_grace_only_fires_a_slot_at_now() -> None:
    assert plan(MINUTE, "UTC", at(-1), at(0), MissedPolicy.SKIP).fire == [at(0)]
    assert plan(MINUTE, "UTC", at(-1), at(0, 0.5), MissedPolicy.SKIP).fire == []


def seconds_after(base: datetime, *offsets: float) -> list[datetime]:
    return [base + timedelta(seconds=o) for o in offsets]


S0 = utc("2026-01-01 12:00:00")

# The grace is a time, whatever the schedule's interval: how many slots fall within it
# depends on the cron line, never on a count of intervals. (id, cron, last_slot, now, grace
# in seconds, on-time slots, missed count.)
GRACE_IN_TIME = [
    # The case: every scheduler down for 12 s, grace 30 s: all 12 slots on time.
    ("per-second-12s-down-30s-grace", "* * * * * *", S0, S0 + timedelta(seconds=12.4), 30,
     seconds_after(S0, *range(1, 13)), 0),
    ("per-second-40s-down-30s-grace", "* * * * * *", S0, S0 + timedelta(seconds=40.2), 30,
     seconds_after(S0, *range(11, 41)), 10),
    ("per-second-grace-0", "* * * * * *", S0, S0 + timedelta(seconds=3), 0, seconds_after(S0, 3), 2),
    ("every-10s-40s-down-30s-grace", "*/10 * * * * *", S0, S0 + timedelta(seconds=41), 30,
     seconds_after(S0, 20, 30, 40), 1),
    ("every-10s-per-schedule-grace-5s", "*/10 * * * * *", S0, S0 + timedelta(seconds=41), 5,
     seconds_after(S0, 40), 3),
    ("minutely-3min-down-30s-grace", MINUTE, S0, S0 + timedelta(minutes=3, seconds=20), 30,
     [S0 + timedelta(minutes=3)], 2),
    ("minutely-3min-down-5min-grace", MINUTE, S0, S0 + timedelta(minutes=3, seconds=20), 300,
     [S0 + timedelta(minutes=m) for m in (1, 2, 3)], 0),
    ("hourly-20min-late-1h-grace", "0 * * * *", S0, S0 + timedelta(hours=1, minutes=20), 3600,
     [S0 + timedelta(hours=1)], 0),
    ("daily-2h-late-30s-grace", "0 12 * * *", S0, S0 + timedelta(days=1, hours=2), 30, [], 1),
    ("daily-2h-late-1d-grace", "0 12 * * *", S0, S0 + timedelta(days=1, hours=2), 86400,
     [S0 + timedelta(days=1)], 0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("cron", "last_slot", "now", "grace", "on_time", "missed_count"),
    [pytest.param(*p[1:], id=p[0]) for p in GRACE_IN_TIME],
)
@pytest.mark.parametrize("policy", list(MissedPolicy))
def test_slots_within_the_grace_fire_whatever_the_interval(
    cron: str,
    last_slot: datetime,
    now: datetime,
    grace: float,
    on_time: list[datetime],
    missed_count: int,
    policy: MissedPolicy,
) -> None:
    result = plan(cron, "UTC", last_slot, now, policy, timedelta(seconds=grace))
    every = slots_between(cron, "UTC", last_slot, now)
    assert result.missed == every[:missed_count] and result.missed_count == missed_count
    late = {MissedPolicy.SKIP: [], MissedPolicy.ONCE: result.missed[-1:], MissedPolicy.ALL: result.missed}[policy]
    assert result.fire == late + on_time
    assert result.backfilled == len(late)
    assert set(result.fire) | set(result.missed) == set(every)  # every due slot handled, once


PER_SECOND = "* * * * * *"
NOW = utc("2026-01-01 12:00:10.5")
TEN_MINUTES_AGO = NOW - timedelta(minutes=10)  # 600 per-second slots due, the newest 0.5 s late


def test_all_backfills_at_most_max_backfill_and_counts_every_missed_slot() -> None:
    result = plan(PER_SECOND, "UTC", TEN_MINUTES_AGO, NOW, MissedPolicy.ALL, GRACE)
    on_time = [utc("2026-01-01 11:59:41") + timedelta(seconds=n) for n in range(30)]  # 30 s before 12:00:10.5
    backfill = [on_time[0] - timedelta(seconds=n) for n in range(MAX_BACKFILL, 0, -1)]
    assert result.fire == backfill + on_time
    assert result.missed_count == 600 - 30 and result.backfilled == MAX_BACKFILL
    assert result.missed == backfill
    assert result.first_missed == TEN_MINUTES_AGO.replace(microsecond=0) + timedelta(seconds=1)


@pytest.mark.parametrize(("policy", "backfilled"), [(MissedPolicy.SKIP, 0), (MissedPolicy.ONCE, 1)])
def test_every_missed_slot_is_counted_beyond_the_backfill_bound(policy: MissedPolicy, backfilled: int) -> None:
    result = plan(PER_SECOND, "UTC", TEN_MINUTES_AGO, NOW, policy, GRACE)
    # The newest 30 s of slots are within the grace: on time, a scheduler coming back.
    on_time = [utc("2026-01-01 11:59:41") + timedelta(seconds=n) for n in range(30)]
    assert result.fire == result.missed[len(result.missed) - backfilled :] + on_time
    assert result.missed_count == 570 and result.backfilled == backfilled
    assert len(result.missed) == MAX_BACKFILL
    assert result.missed[-1] == utc("2026-01-01 11:59:40")


def test_a_late_tick_on_a_per_second_schedule_fires_every_slot_it_was_late_for() -> None:
    last = utc("2026-01-01 12:00:07")
    result = plan(PER_SECOND, "UTC", last, utc("2026-01-01 12:00:09.8"), MissedPolicy.SKIP, GRACE)
    assert result.fire == [utc("2026-01-01 12:00:08"), utc("2026-01-01 12:00:09")]
    assert result.missed == [] and result.missed_count == 0


def test_all_with_exactly_max_backfill_late_slots_fires_them_all() -> None:
    now = utc("2026-01-01 12:00:45")  # every slot late
    last = now - timedelta(minutes=MAX_BACKFILL)
    result = plan("0 * * * * *", "UTC", last, now, MissedPolicy.ALL, GRACE)
    assert len(result.fire) == MAX_BACKFILL
    assert result.missed == result.fire and result.missed_count == result.backfilled == MAX_BACKFILL


def test_plan_across_fall_back_with_bounds_in_the_schedule_zone() -> None:
    """At 00:45 UTC (02:45 CEST) the 02:00 CET slot is 15 minutes away: not due, not fired."""
    last = utc("2026-10-24 23:00").astimezone(PARIS)
    now = utc("2026-10-25 00:45").astimezone(PARIS)
    result = plan("0 * * * *", "Europe/Paris", last, now, MissedPolicy.ONCE, GRACE)
    assert in_utc(result.fire) == ["2026-10-25 00:00:00"]
    assert in_utc(result.missed) == ["2026-10-25 00:00:00"] and result.missed_count == result.backfilled == 1
    assert in_utc([result.next_slot]) == ["2026-10-25 01:00:00"]


def test_slot_plan_defaults() -> None:
    empty = SlotPlan([], [], T0)
    assert (empty.missed_count, empty.backfilled, empty.first_missed) == (0, 0, None)


# -- offsets ----------------------------------------------------------------------------------


def test_stable_offset_is_stable_across_calls_and_processes() -> None:
    names = ["nightly-report", "jobtui.archive", "a", "ünïcödé"]
    here = [stable_offset(n, 60.0) for n in names]
    assert here == [stable_offset(n, 60.0) for n in names]
    code = f"from jobtui.kernel.cronslots import stable_offset; print([stable_offset(n, 60.0) for n in {names!r}])"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # hash() would differ; the offset must not
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == repr(here)


def test_stable_offsets_spread_within_the_bound() -> None:
    bound = spread_bound("0 * * * *", "UTC", T0)
    assert bound == MAX_OFFSET_SECONDS
    offsets = [stable_offset(f"report-{i}", bound) for i in range(100)]
    assert all(0 <= o < bound for o in offsets)
    assert len(set(offsets)) >= 90
    # Spread over the whole range: every tenth of it holds some schedule.
    assert {int(o // (bound / 10)) for o in offsets} == set(range(10))
    assert stable_offset("x", 0.0) == 0.0


SPREAD_BOUNDS = [
    pytest.param("0 * * * *", "UTC", T0, 60.0, id="hourly-capped"),
    pytest.param("* * * * *", "UTC", T0, 6.0, id="minutely"),
    pytest.param("* * * * * *", "UTC", T0, 0.1, id="per-second"),
    pytest.param("*/10 * * * * *", "UTC", T0, 1.0, id="every-10-seconds"),
    pytest.param("0 0 * * *", "UTC", T0, 60.0, id="daily"),
    # The two next slots are 02:00 CEST and 02:00 CET: an hour apart, not zero.
    pytest.param("0 * * * *", "Europe/Paris", utc("2026-10-24 23:30"), 60.0, id="paris-fall-back"),
]


@pytest.mark.parametrize(("cron", "tz", "now", "expected"), SPREAD_BOUNDS)
def test_spread_bound(cron: str, tz: str, now: datetime, expected: float) -> None:
    assert math.isclose(spread_bound(cron, tz, now), expected)


# -- validation -------------------------------------------------------------------------------

VALID = dict(name="nightly", cron="0 3 * * *", timezone="UTC", missed="once", offset=None, grace=30.0)

BAD = [
    pytest.param({"cron": "* * * *"}, ["'* * * *'", "4 fields"], id="cron-4-fields"),
    pytest.param({"cron": "* * * * * * *"}, ["'* * * * * * *'", "7 fields"], id="cron-7-fields"),
    pytest.param({"cron": ""}, ["''", "0 fields"], id="cron-empty"),
    pytest.param({"cron": "61 * * * *"}, ["'61 * * * *'", "out of range"], id="cron-minute-61"),
    pytest.param({"cron": "* 24 * * *"}, ["'* 24 * * *'", "out of range"], id="cron-hour-24"),
    pytest.param({"cron": "* * 32 * *"}, ["'* * 32 * *'"], id="cron-day-32"),
    pytest.param({"cron": "* * * 13 *"}, ["'* * * 13 *'"], id="cron-month-13"),
    pytest.param({"cron": "60 * * * * *"}, ["'60 * * * * *'", "out of range"], id="cron-second-60"),
    pytest.param({"cron": "foo * * * *"}, ["'foo * * * *'"], id="cron-word"),
    pytest.param({"cron": "*/0 * * * *"}, ["'*/0 * * * *'"], id="cron-step-0"),
    pytest.param({"cron": "0 0 31 2 *"}, ["'0 0 31 2 *'"], id="cron-never"),
    pytest.param({"cron": "* * * * *\n* * * * *"}, ["10 fields"], id="cron-newline"),
    pytest.param({"timezone": "Mars/Olympus"}, ["'Mars/Olympus'", "IANA"], id="tz-unknown"),
    pytest.param({"timezone": "Europe"}, ["'Europe'", "IANA"], id="tz-directory"),
    pytest.param({"timezone": ""}, ["''", "IANA"], id="tz-empty"),
    pytest.param({"timezone": "../../etc/passwd"}, ["'../../etc/passwd'"], id="tz-path"),
    pytest.param({"missed": "never"}, ["'never'", "skip, once or all"], id="missed-policy"),
    pytest.param({"missed": "ONCE"}, ["'ONCE'"], id="missed-policy-case"),
    pytest.param({"offset": 60.5}, ["'nightly'", "offset"], id="offset-too-big"),
    pytest.param({"offset": -1.0}, ["'nightly'", "offset"], id="offset-negative"),
    pytest.param({"offset": float("nan")}, ["offset"], id="offset-nan"),
    pytest.param({"grace": -1.0}, ["'nightly'", "grace", "between 0 and 86400"], id="grace-negative"),
    pytest.param({"grace": 86401.0}, ["'nightly'", "grace", "between 0 and 86400"], id="grace-over-a-day"),
    pytest.param({"grace": float("inf")}, ["grace"], id="grace-inf"),
    pytest.param({"grace": float("nan")}, ["grace"], id="grace-nan"),
    pytest.param({"grace": "30"}, ["grace"], id="grace-text"),
    pytest.param({"name": ""}, ["schedule name"], id="name-empty"),
    pytest.param({"name": "x" * 201}, ["schedule name"], id="name-too-long"),
]


@pytest.mark.parametrize(("change", "needles"), BAD)
def test_validate_schedule_rejects(change: dict[str, object], needles: list[str]) -> None:
    args = {**VALID, **change}
    with pytest.raises(InvalidInput) as info:
        validate_schedule(**args)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message and message.strip() == message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"cron": "*/5 9-17 * * MON-FRI"},
        {"cron": "*/10 * * * * *"},
        {"timezone": "Europe/Paris"},
        {"missed": "skip"},
        {"missed": "all"},
        {"offset": 0.0},
        {"offset": MAX_OFFSET_SECONDS},
        {"grace": 0},
        {"grace": 86400.0},
    ],
)
def test_validate_schedule_accepts(change: dict[str, object]) -> None:
    validate_schedule(**{**VALID, **change})  # type: ignore[arg-type]
