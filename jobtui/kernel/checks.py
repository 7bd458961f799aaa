"""Checks of what users give: payloads, job types, keys, delays, leases, attempts, error
texts. Each returns the value when PostgreSQL can store it as meant, or raises InvalidInput
with one line that says what to give instead.

    >>> check_delay(30)
    30.0
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from jobtui.kernel.domain import MAX_DELAY_SECONDS, MAX_PAYLOAD_BYTES
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote

# Error texts are kept whole up to this size; longer ones (huge tracebacks) are cut.
MAX_ERROR_CHARS = 8000
MAX_TYPE_CHARS = 200
MAX_KEY_CHARS = 1000
# PostgreSQL compiles a case-insensitive regular expression (`~*`, the error matcher) in time
# that grows with the square of its length: 0.1 s at 5,000 characters, about a minute at
# 100,000, a backend's CPU all along. This bound keeps it to hundredths of a second.
MAX_PATTERN_CHARS = 2000


# json.dumps with non-default options builds a new encoder per call; bulk enqueue encodes
# one payload per job, so the encoder is built once (same options, same output).
_JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def encode_payload(payload: Any) -> str:
    """The payload as JSON text, or InvalidInput saying why it cannot be stored."""
    try:
        text = _JSON_ENCODER.encode({} if payload is None else payload)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"payload is not JSON-serialisable ({exc}); pass dicts, lists, str, numbers") from None
    except RecursionError:
        raise InvalidInput("payload nests too deeply to encode; flatten it") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("payload holds text that is not valid UTF-8; clean it before enqueueing") from None
    if "\\u0000" in text or "\x00" in text:
        raise InvalidInput("payload holds a NUL character, which PostgreSQL cannot store in jsonb")
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidInput(
            f"payload is {size} bytes, over the {MAX_PAYLOAD_BYTES} limit; "
            "store the data elsewhere and pass a reference"
        )
    return text


def check_text(value: str, what: str) -> str:
    """`value` if PostgreSQL can store it as text: no NUL, and valid UTF-8 (no lone surrogates,
    which is how Python decodes bytes that are not UTF-8, e.g. in argv or file names)."""
    if "\x00" in value:
        raise InvalidInput(f"bad {what}: it holds a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"bad {what} {quote(value)}: it is not valid UTF-8 text") from None
    return value


def check_pattern(pattern: str, what: str = "error pattern") -> str:
    """An error matcher (a regular expression) PostgreSQL can store and compile quickly."""
    check_text(pattern, what)
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidInput(
            f"bad {what} {quote(pattern)}: give at most {MAX_PATTERN_CHARS:,} characters, "
            "a distinctive part of the error"
        )
    return pattern


def check_type(job_type: str) -> str:
    if not isinstance(job_type, str) or not job_type.strip() or len(job_type) > MAX_TYPE_CHARS:
        raise InvalidInput(
            f"bad job type {quote(job_type)}: give a non-empty name of at most {MAX_TYPE_CHARS} characters"
        )
    return check_text(job_type, "job type")


def check_queue(queue: str) -> str:
    """A queue's name: like a job type's, at most MAX_TYPE_CHARS characters."""
    if not isinstance(queue, str) or not queue.strip() or len(queue) > MAX_TYPE_CHARS:
        raise InvalidInput(
            f"bad queue name {quote(queue)}: give a non-empty name of at most {MAX_TYPE_CHARS} characters"
        )
    return check_text(queue, "queue name")


def check_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_CHARS or "\x00" in key:
        raise InvalidInput(f"bad idempotency key {quote(key)}: give 1 to {MAX_KEY_CHARS} characters, no NUL")
    return check_text(key, "idempotency key")


def check_delay(delay: float) -> float:
    if not isinstance(delay, (int, float)) or not math.isfinite(delay) or delay < 0 or delay > MAX_DELAY_SECONDS:
        raise InvalidInput(f"bad delay {quote(delay)}: give seconds between 0 and 10 years")
    return float(delay)


def check_lease(lease: float) -> float:
    if not isinstance(lease, (int, float)) or not math.isfinite(lease) or lease < 0 or lease > 10 * 365 * 86400:
        raise InvalidInput(f"bad lease {quote(lease)}: give seconds between 0 and 10 years")
    return float(lease)


def check_run_at(run_at: Any) -> Any:
    """None (now) or a timezone-aware datetime: a naive one would be read in the session's zone."""
    if run_at is not None and not (isinstance(run_at, datetime) and run_at.utcoffset() is not None):
        raise InvalidInput(f"bad run_at {quote(run_at)}: give a timezone-aware datetime")
    return run_at


def check_max_attempts(max_attempts: int | None) -> int | None:
    """None leaves the limit to the job's handler (or the default of 25)."""
    if max_attempts is None:
        return None
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= 1000:
        raise InvalidInput(f"bad max attempts {quote(max_attempts)}: give a whole number from 1 to 1000")
    return max_attempts


def clip_error(error: str) -> str:
    """An error text that fits the row: NULs removed, text that is not UTF-8 (lone surrogates,
    from undecodable bytes in a message) escaped, long texts cut in the middle."""
    # Whatever a handler raised, its outcome must be writable.
    error = error.replace("\x00", "").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(error) <= MAX_ERROR_CHARS:
        return error
    half = MAX_ERROR_CHARS // 2
    return f"{error[:half]}\n... [{len(error) - MAX_ERROR_CHARS} characters cut] ...\n{error[-half:]}"
