"""Log formats for the long-running commands: escaped text lines, or one JSON object a line.

Both carry job data (types, errors, worker ids) that other people's code wrote. Text goes
through `safetext.SafeFormatter`; JSON keeps the exact text, with every character outside
ASCII printables written as a JSON escape, so a line can neither be forged nor reach the
terminal raw. A log call names its job with `extra=job_fields(...)`.

>>> import logging
>>> record = logging.makeLogRecord({"msg": "job %d failed", "args": (7,), "levelname": "WARNING",
...                                 "name": "jobtui.worker", "job_id": 7, "job_type": "a\\x1b"})
>>> JsonFormatter().format(record).endswith('"job_id": 7, "type": "a\\\\u001b"}')
True
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import SafeFormatter

FORMATS = ("text", "json")
ENV = "JOBTUI_LOG_FORMAT"
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# LogRecord attributes a job's log lines may carry, and their names in the JSON object.
JOB_FIELDS = {
    "job_id": "job_id",
    "job_type": "type",
    "queue": "queue",
    "schema": "schema",
    "attempt": "attempt",
    "worker": "worker",
}


def job_fields(
    job_id: int, job_type: str, attempt: int, worker: str | None, queue: str | None, schema: str
) -> dict[str, Any]:
    """The `extra=` of a log call about one job: `queue` is its named queue (None when the
    line does not know it), `schema` the schema of jobtui's tables."""
    return {
        "job_id": job_id,
        "job_type": job_type,
        "attempt": attempt,
        "worker": worker,
        "queue": queue,
        "schema": schema,
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the job's
    fields when the record has them, and the traceback as `exc`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for attr, key in JOB_FIELDS.items():
            value = record.__dict__.get(attr)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=True, default=str)


def chosen_format(given: str | None) -> str:
    """The format asked for with --log-format, else JOBTUI_LOG_FORMAT, else text."""
    value = given or os.environ.get(ENV) or "text"
    if value not in FORMATS:
        raise InvalidInput(f"unknown log format {value!r} (from {'--log-format' if given else ENV}): use text or json")
    return value


def formatter(name: str) -> logging.Formatter:
    return JsonFormatter() if name == "json" else SafeFormatter(TEXT)
