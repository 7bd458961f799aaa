"""What `--json` prints: JSON that any parser reads.

Values come from the database, where a float column can hold NaN or infinity (a hand edit,
a check that `NaN >= 0` passes): JSON has neither, so they are printed as null rather than as
Python's `NaN` and `Infinity`, which strict parsers refuse. What JSON cannot hold otherwise
(times, dates) is printed as its text.
"""

from __future__ import annotations

import json
import math
from typing import Any


def print_json(value: Any) -> None:
    """Print `value` as indented JSON, its non-finite floats as null."""
    print(json.dumps(_finite(value), default=str, indent=2, allow_nan=False))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
