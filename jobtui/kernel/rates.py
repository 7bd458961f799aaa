"""Rates as operators write them (`20/s`, `1200/min`, `none`) and as jobtui shows them.

A rate is kept as jobs per second. Pure: no database, no clock.

    >>> parse_rate("20/s"), parse_rate("90/min"), parse_rate("none")
    (20.0, 1.5, None)
    >>> rate_text(20.0), rate_text(0.5), rate_text(1 / 3600)
    ('20/s', '30/min', '1/h')
"""

from __future__ import annotations

import math
import re

from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote

MAX_RATE = 1_000_000.0  # jobs per second, as the table's check says
# Below this a rate is one job every ten hours: a pause says that better.
MIN_RATE = 1 / 36_000
RAMP_TOP = 10_000.0  # where a ramp ends for a queue or type without a rate (control_rate)

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([a-z]+?)s?\s*$")

WRITE_IT = "write it like 20/s, 1200/min or 30/h (or none)"


def parse_rate(text: str) -> float | None:
    """Jobs per second from `N/s`, `N/min` or `N/h`; None for `none` (no rate).

    >>> parse_rate("1,5/s")
    Traceback (most recent call last):
    ...
    jobtui.kernel.errors.InvalidInput: bad rate '1,5/s': write it like 20/s, 1200/min or 30/h (or none)
    """
    lowered = text.strip().lower()
    if lowered in ("none", "off"):
        return None
    match = _RATE.match(lowered)
    unit = _UNITS.get(match.group(2)) if match else None
    if match is None or unit is None:
        raise InvalidInput(f"bad rate {quote(text)}: {WRITE_IT}")
    return check_rate(float(match.group(1)) / unit, text)


def check_rate(rate: float | None, given: object = None) -> float | None:
    """`rate` (jobs per second) if a queue can have it; None stays None (no rate)."""
    if rate is None:
        return None
    shown = quote(given if given is not None else rate)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate):
        raise InvalidInput(f"bad rate {shown}: {WRITE_IT}")
    if rate < MIN_RATE:
        raise InvalidInput(f"rate {shown} is below 1 job every 10 hours: pause the queue instead")
    if rate > MAX_RATE:
        raise InvalidInput(f"rate {shown} is over {MAX_RATE:,.0f}/s: give none for no rate")
    return float(rate)


def rate_text(rate: float | None) -> str:
    """A rate in the unit that shows it as a number people read: per second from 1/s up,
    else per minute, else per hour; `none` for no rate.

    >>> rate_text(None), rate_text(12.5), rate_text(1234.0), rate_text(0.05)
    ('none', '12.5/s', '1,234/s', '3/min')
    """
    if rate is None:
        return "none"
    for per, unit in ((1.0, "s"), (60.0, "min"), (3600.0, "h")):
        value = rate * per
        if value >= 1 or unit == "h":
            return f"{_number(value)}/{unit}"
    raise AssertionError("unreachable")


def rate_at_least(rate: float) -> float:
    """The lowest rate of at least `rate` (and of MIN_RATE) that `rate_text` shows exactly, in
    the unit it shows it in: a rate suggested as text that the same command takes back.

    >>> rate_text(rate_at_least(1 / 60)), rate_text(rate_at_least(0.0123)), rate_text(rate_at_least(12.34))
    ('1/min', '44.3/h', '12.4/s')
    """
    rate = max(rate, MIN_RATE)
    for per in (1.0, 60.0, 3600.0):
        value = rate * per
        if value >= 1 or per == 3600.0:
            step = 1.0 if value >= 100 else 0.1
            return math.ceil(round(value / step, 6)) * step / per
    raise AssertionError("unreachable")


def _number(value: float) -> str:
    rounded = round(value, 1) if value < 100 else round(value)
    return f"{rounded:,.0f}" if float(rounded).is_integer() else f"{rounded:,.1f}"


def ramp_rate(rate: float | None, fraction: float) -> float:
    """The rate `fraction` (0 to 1) of the way through a ramp, as control_rate computes it
    in SQL (migration 0013): tenfold in equal steps from 1/s (or the rate, when lower) to
    the rate, or to RAMP_TOP without one.

    >>> round(ramp_rate(100.0, 0.0), 3), round(ramp_rate(100.0, 0.5), 3), ramp_rate(100.0, 1.0)
    (1.0, 10.0, 100.0)
    """
    top = RAMP_TOP if rate is None else rate
    low = min(1.0, top)
    f = min(1.0, max(0.0, fraction))
    return float(low ** (1 - f) * top**f)
