"""Durations as people write them (`30`, `30s`, `5m`, `1h30m`, `2d`, `250ms`), and as the
consoles and the CLI show them: the one place durations become text.

>>> parse_duration("1m30s")
90.0
>>> duration_text(parse_duration("1d12h"))
'1d12h'
"""

from __future__ import annotations

import math
import re

from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_MAX_SECONDS = 10 * 365 * 86400.0


def parse_duration(text: str) -> float:
    """Seconds in `text`; a bare number is seconds. Raises InvalidInput with an example."""
    value = text.strip().lower()
    seconds: float | None = None
    try:
        seconds = float(value)
    except ValueError:
        pos = 0
        total = 0.0
        for match in _PART.finditer(value):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if value and pos == len(value):
            seconds = total
    if seconds is None or not math.isfinite(seconds):
        raise InvalidInput(f"bad duration {quote(text)}: write it like 30s, 5m, 1h30m or 250ms")
    if seconds < 0:
        raise InvalidInput(f"bad duration {quote(text)}: it must not be negative")
    if seconds > _MAX_SECONDS:
        raise InvalidInput(f"bad duration {quote(text)}: at most 10 years")
    return seconds


def duration_text(seconds: float) -> str:
    """`seconds` as an option would be written: its whole days, hours, minutes and seconds,
    those that are not zero (`7d`, `1d12h`, `1h30m`, `0s`).

    >>> duration_text(604800), duration_text(5400.4), duration_text(0)
    ('7d', '1h30m', '0s')
    """
    left = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def age_text(seconds: float | None, *, tenths: bool = False, none: str = "-") -> str:
    """A duration an operator reads, two units at most: 45s, 3m12s, 2h05m, 4d03h (whole
    seconds, the sign dropped); with `tenths`, under 10 s to a tenth (0.4s); `none` for None
    or NaN.

    >>> age_text(192.4), age_text(7500), age_text(97200), age_text(0.42, tenths=True), age_text(None)
    ('3m12s', '2h05m', '1d03h', '0.4s', '-')
    """
    if seconds is None or math.isnan(seconds):
        return none
    if tenths and abs(seconds) < 10:
        return f"{abs(seconds):.1f}s"
    whole = int(abs(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
