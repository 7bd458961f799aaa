"""Sizes as people write them: `512M`, `1.5G`, `300MiB`, `2048k`, or bytes.

>>> parse_size("512M")
536870912
>>> parse_size("1.5GiB")
1610612736
"""

from __future__ import annotations

import re

from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote

# Binary multiples either way: memory is counted in pages, and `512M` means 512 MiB to most.
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?")


def parse_size(text: str) -> int:
    """Bytes in `text`. Raises InvalidInput with an example."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None:
        raise InvalidInput(f"bad size {quote(text)}: write it like 512M, 1.5G or 300MiB")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def size_text(size: int | None) -> str:
    """A size in the largest unit under it, for a table: `85 MiB`, `1.2 GiB`, `-` for none.

    >>> size_text(89_128_960), size_text(1_288_490_188), size_text(None)
    ('85 MiB', '1.2 GiB', '-')
    """
    if size is None:
        return "-"
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= unit:
            value = size / unit
            return f"{value:.1f} {name}" if value < 10 else f"{value:,.0f} {name}"
    return f"{size} B"
