"""Cron slots: which slots are due, which were missed, and each schedule's spread offset.

Pure: every function takes `now` (the database's clock) as an argument.

    >>> from datetime import datetime, timezone
    >>> t0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=timezone.utc)
    >>> [s.minute for s in slots_between("*/15 * * * *", "UTC", t0, t0.replace(hour=1))]
    [15, 30, 45, 0]
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from .errors import InvalidInput
from .safetext import quote

# Spread offsets stay below this, so a slot's job never runs closer to the next slot.
MAX_OFFSET_SECONDS = 60.0
# A scheduler this many slot intervals late still fires those slots as on time.
LATE_SLOTS = 3
# Backfill bound of the `all` missed-slot policy.
MAX_BACKFILL = 100


class MissedPolicy(enum.StrEnum):
    """What to do with slots that passed while no scheduler ran."""

    SKIP = "skip"  # fire none of them; count them as missed
    ONCE = "once"  # fire one job for the latest missed slot
    ALL = "all"  # fire every missed slot, up to MAX_BACKFILL


def _cron(expr: str, start: datetime) -> croniter:
    # Six fields put seconds first, as in Quartz and most cron libraries with seconds.
    return croniter(expr, start, second_at_beginning=len(expr.split()) == 6)


def check_cron(expr: str) -> str:
    """Return `expr` if it is a 5-field (or 6-field, seconds first) cron expression."""
    fields = expr.split()
    if len(fields) not in (5, 6):
        raise InvalidInput(
            f"bad cron expression {quote(expr)}: it has {len(fields)} fields, give 5 "
            "(minute hour day month weekday) or 6 (seconds first)"
        )
    try:
        _cron(expr, datetime(2026, 1, 1, tzinfo=ZoneInfo("UTC"))).get_next(datetime)
    except CroniterBadDateError:
        # croniter gives up after decades without a match: a date that does not exist.
        raise InvalidInput(
            f"bad cron expression {quote(expr)}: it never fires (no date matches it, like 31 February)"
        ) from None
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidInput(f"bad cron expression {quote(expr)}: {str(exc).splitlines()[0]}") from None
    return expr


def check_timezone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory such as "Europe"
        raise InvalidInput(f"unknown timezone {quote(name)}: use an IANA name such as UTC or Europe/Paris") from None


def validate_schedule(name: str, cron: str, timezone: str, missed: str, offset: float | None) -> None:
    """Raise InvalidInput with one line naming what is wrong with a schedule's settings."""
    if not name or len(name) > 200 or "\x00" in name:
        raise InvalidInput(f"bad schedule name {quote(name)}: give 1 to 200 characters")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"bad schedule name {quote(name)}: it is not valid UTF-8 text") from None
    check_cron(cron)
    check_timezone(timezone)
    if missed not in {p.value for p in MissedPolicy}:
        raise InvalidInput(f"schedule {quote(name)}: missed policy must be skip, once or all, not {quote(missed)}")
    if offset is not None and not 0 <= offset <= MAX_OFFSET_SECONDS:
        raise InvalidInput(f"schedule {quote(name)}: offset must be between 0 and {MAX_OFFSET_SECONDS:.0f} seconds")


def next_slot(cron: str, timezone: str, after: datetime) -> datetime:
    """The first slot strictly after `after`."""
    tz = check_timezone(timezone)
    result: datetime = _cron(cron, after.astimezone(tz)).get_next(datetime)
    return result


def slots_between(cron: str, timezone: str, after: datetime, upto: datetime, limit: int = 10_000) -> list[datetime]:
    """Slots s with after < s <= upto, oldest first, at most `limit` (the newest kept)."""
    return _due(cron, timezone, after, upto, limit)[0]


def _due(cron: str, timezone: str, after: datetime, upto: datetime, limit: int) -> tuple[list[datetime], int]:
    """The newest `limit` slots in (after, upto], and how many slots that interval holds."""
    tz = check_timezone(timezone)
    it = _cron(cron, after.astimezone(tz))
    # Compared in UTC: two datetimes with the same ZoneInfo compare by wall clock, ignoring
    # `fold`, which puts the repeated hour of a DST change before or after the wrong instants.
    upto = upto.astimezone(UTC)
    found: list[datetime] = []
    count = 0
    while True:
        slot: datetime = it.get_next(datetime)
        if slot > upto:
            return (found[-limit:] if limit else []), count
        count += 1
        found.append(slot)
        if len(found) > 2 * limit:
            del found[:limit]


def stable_offset(name: str, bound: float = MAX_OFFSET_SECONDS) -> float:
    """A spread offset in [0, bound) seconds derived from the schedule's name alone, so every
    instance computes the same one and many `0 * * * *` schedules do not fire together."""
    return (zlib.crc32(name.encode()) % 1000) / 1000 * bound


def spread_bound(cron: str, timezone: str, now: datetime) -> float:
    """The largest offset that keeps a slot's job before the next slot: a tenth of the gap
    between slots, at most MAX_OFFSET_SECONDS."""
    first = next_slot(cron, timezone, now)
    second = next_slot(cron, timezone, first)
    gap = second.astimezone(UTC) - first.astimezone(UTC)  # real time, not wall clock, across DST
    return min(MAX_OFFSET_SECONDS, gap.total_seconds() / 10)


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """What a scheduler does for one schedule at `now`."""

    fire: list[datetime]
    missed: list[datetime]  # the newest missed slots (at most MAX_BACKFILL + 1)
    next_slot: datetime
    missed_count: int = 0  # every missed slot, also those older than the `missed` list


def plan(
    cron: str,
    timezone: str,
    last_slot: datetime,
    now: datetime,
    policy: MissedPolicy,
    grace: timedelta = timedelta(seconds=0),
) -> SlotPlan:
    """Slots after `last_slot` up to `now`, split into those to fire and those missed.

    The newest due slot is on time within `grace`; older due slots are on time within
    LATE_SLOTS slot intervals (and `grace`), so a scheduler that ticks a little late (a busy
    machine, a database hiccup) still fires a per-second schedule's slots it was late for.
    Slots older than that passed while no scheduler ran, and `policy` decides their fate.
    """
    due, total = _due(cron, timezone, last_slot, now, MAX_BACKFILL + 1)
    upcoming = next_slot(cron, timezone, now)
    if not due:
        return SlotPlan([], [], upcoming)
    now_utc = now.astimezone(UTC)
    interval = upcoming.astimezone(UTC) - due[-1].astimezone(UTC)
    window = min(grace, LATE_SLOTS * interval)
    fire = [s for s in due[:-1] if now_utc - s <= window]
    if now_utc - due[-1] <= grace:
        fire.append(due[-1])
    missed = [s for s in due if s not in fire]
    match policy:
        case MissedPolicy.SKIP:
            pass
        case MissedPolicy.ONCE:
            if missed and not fire:
                fire = [missed[-1]]
                missed = missed[:-1]
        case MissedPolicy.ALL:
            missed, fire = (missed + fire)[:-MAX_BACKFILL], (missed + fire)[-MAX_BACKFILL:]
    # Slots older than the newest MAX_BACKFILL + 1 were neither fired nor listed: missed too.
    return SlotPlan(fire, missed, upcoming, total - len(fire))
