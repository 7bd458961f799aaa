"""Cron slots: which slots are due, which were missed, and each schedule's spread offset.

Pure: every function takes `now` (the database's clock) as an argument.

    >>> from datetime import datetime, timezone
    >>> t0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=timezone.utc)
    >>> [s.minute for s in slots_between("*/15 * * * *", "UTC", t0, t0.replace(hour=1))]
    [15, 30, 45, 0]
"""

from __future__ import annotations

import enum
import math
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from jobtui.kernel.errors import InvalidInput, first_line
from jobtui.kernel.safetext import quote

# Spread offsets stay below this, so a slot's job never runs closer to the next slot.
MAX_OFFSET_SECONDS = 60.0
# A slot handled within this long after its time is on time, whatever the schedule's interval
# (a scheduler restarting, a busy machine, a database failover); later, it was missed.
DEFAULT_GRACE_SECONDS = 30.0
# Longest grace a schedule may ask for: every slot within it is fired when a scheduler comes
# back, so it bounds the jobs one tick enqueues (a day of a per-second schedule at most).
MAX_GRACE_SECONDS = 86400.0
# Backfill bound of the `all` missed-slot policy.
MAX_BACKFILL = 100


class MissedPolicy(enum.StrEnum):
    """What to do with slots that passed while no scheduler ran."""

    SKIP = "skip"  # fire none of them
    ONCE = "once"  # fire one job, for the latest missed slot
    ALL = "all"  # fire every missed slot, the newest MAX_BACKFILL at most


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
        raise InvalidInput(f"bad cron expression {quote(expr)}: {first_line(exc)}") from None
    return expr


def check_timezone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory such as "Europe"
        raise InvalidInput(f"unknown timezone {quote(name)}: use an IANA name such as UTC or Europe/Paris") from None


def validate_schedule(
    name: str, cron: str, timezone: str, missed: str, offset: float | None, grace: float = DEFAULT_GRACE_SECONDS
) -> None:
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
    check_grace(name, grace)


def check_grace(name: str, grace: float) -> float:
    """`grace` in seconds if a schedule may have it (0 to a day); InvalidInput otherwise."""
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not math.isfinite(grace):
        raise InvalidInput(f"schedule {quote(name)}: grace must be a number of seconds, not {grace!r}")
    if not 0 <= grace <= MAX_GRACE_SECONDS:
        raise InvalidInput(
            f"schedule {quote(name)}: grace must be between 0 and {MAX_GRACE_SECONDS:.0f} seconds (a day)"
        )
    return float(grace)


def next_slot(cron: str, timezone: str, after: datetime) -> datetime:
    """The first slot strictly after `after`."""
    tz = check_timezone(timezone)
    result: datetime = _cron(cron, after.astimezone(tz)).get_next(datetime)
    return result


def slots_between(cron: str, timezone: str, after: datetime, upto: datetime, limit: int = 10_000) -> list[datetime]:
    """Slots s with after < s <= upto, oldest first, at most `limit` (the newest kept)."""
    return list(deque(_slots(cron, timezone, after, upto), maxlen=limit))


def _slots(cron: str, timezone: str, after: datetime, upto: datetime) -> Iterator[datetime]:
    """Every slot in (after, upto], oldest first, in the schedule's zone."""
    tz = check_timezone(timezone)
    it = _cron(cron, after.astimezone(tz))
    # Compared in UTC: two datetimes with the same ZoneInfo compare by wall clock, ignoring
    # `fold`, which puts the repeated hour of a DST change before or after the wrong instants.
    upto = upto.astimezone(UTC)
    while True:
        slot: datetime = it.get_next(datetime)
        if slot > upto:
            return
        yield slot


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
    """What a scheduler does for one schedule at `now`.

    A slot is on time when handled within the schedule's grace after it, and fired. Older
    due slots were missed (every scheduler was down past the grace): `policy` decides which
    of them are fired late, the backfill.
    """

    fire: list[datetime]  # oldest first: the backfill, then the on-time slots
    missed: list[datetime]  # the newest missed slots (at most MAX_BACKFILL), oldest first
    next_slot: datetime
    missed_count: int = 0  # every missed slot, also those older than the `missed` list
    backfilled: int = 0  # missed slots in `fire`
    first_missed: datetime | None = None  # the oldest missed slot: where the outage began


def plan(
    cron: str,
    timezone: str,
    last_slot: datetime,
    now: datetime,
    policy: MissedPolicy,
    grace: timedelta = timedelta(seconds=0),
) -> SlotPlan:
    """Slots after `last_slot` up to `now`: on time (within `grace` of `now`) or missed.

    Every on-time slot is fired, however many there are (a per-second schedule whose
    schedulers were down for 12 s with a 30 s grace fires all 12). Of the missed ones,
    `skip` fires none, `once` the newest, `all` the newest MAX_BACKFILL; all are counted.
    """
    on_time: list[datetime] = []
    missed: deque[datetime] = deque(maxlen=MAX_BACKFILL)
    missed_count = 0
    first_missed = None
    cutoff = now.astimezone(UTC) - grace
    for slot in _slots(cron, timezone, last_slot, now):
        if slot < cutoff:
            missed_count += 1
            first_missed = first_missed or slot
            missed.append(slot)
        else:
            on_time.append(slot)
    match policy:
        case MissedPolicy.SKIP:
            backfill: list[datetime] = []
        case MissedPolicy.ONCE:
            backfill = list(missed)[-1:]
        case MissedPolicy.ALL:
            backfill = list(missed)
    return SlotPlan(
        backfill + on_time,
        list(missed),
        next_slot(cron, timezone, now),
        missed_count,
        len(backfill),
        first_missed,
    )
