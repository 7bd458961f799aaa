"""Which jobs an operator means: by status, type, queue, error, payload and age. One filter
for the payload search (`jobtui jobs --payload`, the console's `payload:` filter) and the
bulk actions (`jobtui bulk`), checked here and bound as parameters of their statements.

    f = JobFilter(statuses=("dead",), payload={"account": "acme"}, older_than=3600)
    f = parse_filter("payload:account=acme status:dead,failed type:invoice.render")
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobtui.kernel.checks import check_pattern, check_queue, check_run_at, check_type, encode_payload
from jobtui.kernel.domain import JobStatus
from jobtui.kernel.durations import duration_text, parse_duration
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote

PREFIXES = ("payload", "status", "type", "queue", "error", "older", "since")


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Jobs matching every field given (None, or empty: any).

    `error` is the error matcher of `jobtui dead --error` (a case-insensitive regular
    expression on the error's first line or its fingerprint); `payload` matches by JSON
    containment (`payload @> ...`: every key given, with its value, anywhere else anything);
    `older_than` and `newer_than` are seconds since the job was enqueued.
    """

    statuses: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    queue: str | None = None
    error: str | None = None
    payload: dict[str, Any] | None = None
    older_than: float | None = None
    newer_than: float | None = None
    since: datetime | None = None  # enqueued at or after it (the query API's `since`)

    def __post_init__(self) -> None:
        for s in self.statuses:
            if s not in {m.value for m in JobStatus}:
                known = ", ".join(m.value for m in JobStatus)
                raise InvalidInput(f"unknown status {quote(s)}: use {known}")
        for t in self.types:
            check_type(t)
        if self.queue is not None:
            check_queue(self.queue)
        if self.error is not None:
            check_pattern(self.error)
            if not self.error:
                raise InvalidInput("an empty error pattern matches every job: leave it out instead")
        if self.payload is not None:
            if not isinstance(self.payload, dict) or not self.payload:
                raise InvalidInput(f"bad payload filter {quote(self.payload)}: give a JSON object with a key")
            encode_payload(self.payload)
        check_run_at(self.since)
        for what, seconds in (("older than", self.older_than), ("newer than", self.newer_than)):
            if seconds is not None and not 0 <= seconds <= 10 * 365 * 86400:
                raise InvalidInput(f"bad age {what} {quote(seconds)}: give a duration like 1h")

    @property
    def empty(self) -> bool:
        return self == JobFilter()

    def params(self) -> dict[str, Any]:
        """The parameters of sql/jobfilter.sql's predicate, in the statements of sql/jobquery.sql
        and sql/bulk.sql: NULL for a field not given. `error` (the whole error, `jobtui jobs`)
        and `at` (when ages count from, a bulk run's) are the statement's to set."""
        return {
            "statuses": list(self.statuses) or None,
            "types": list(self.types) or None,
            "queue": self.queue,
            "matcher": self.error,
            "payload": None if self.payload is None else encode_payload(self.payload),
            "older_than": self.older_than,
            "newer_than": self.newer_than,
            "since": self.since,
            "error": None,
            "at": None,
        }

    def to_json(self) -> dict[str, Any]:
        """The filter as the audit log and a bulk run keep it: the fields given, sorted."""
        data: dict[str, Any] = {
            "statuses": sorted(self.statuses),
            "types": sorted(self.types),
            "queue": self.queue,
            "error": self.error,
            "payload": self.payload,
            "older_than": self.older_than,
            "newer_than": self.newer_than,
            "since": None if self.since is None else self.since.isoformat(),
        }
        return {k: v for k, v in data.items() if v not in (None, [])}

    def describe(self) -> str:
        """One line for a question, a toast or an audit target.

        >>> JobFilter(statuses=("dead", "failed"), payload={"account": "acme"}, older_than=3600).describe()
        'status=dead,failed payload={"account": "acme"} older=1h'
        """
        parts = [f"status={','.join(self.statuses)}"] if self.statuses else []
        parts += [f"type={','.join(self.types)}"] if self.types else []
        parts += [f"queue={self.queue}"] if self.queue is not None else []
        parts += [f"error={self.error}"] if self.error is not None else []
        parts += [f"payload={json.dumps(self.payload, ensure_ascii=False)}"] if self.payload is not None else []
        parts += [f"older={duration_text(self.older_than)}"] if self.older_than is not None else []
        parts += [f"since={duration_text(self.newer_than)}"] if self.newer_than is not None else []
        parts += [f"since={self.since.isoformat()}"] if self.since is not None else []
        return " ".join(parts) or "every job"


def payload_path(text: str) -> dict[str, Any]:
    """`account=acme` as {"account": "acme"}; a dotted path nests (`user.plan=pro`). The value
    is read as JSON when it is JSON (`42`, `true`, `null`, `"42"`), else taken as text.

    >>> payload_path("account=acme"), payload_path("user.id=42"), payload_path('code="007"')
    ({'account': 'acme'}, {'user': {'id': 42}}, {'code': '007'})
    """
    path, sep, raw = text.partition("=")
    keys = path.strip().split(".")
    if not sep or not all(k.strip() for k in keys):
        raise InvalidInput(f"bad payload path {quote(text)}: write KEY=VALUE, e.g. account=acme or user.plan=pro")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    for key in reversed(keys):
        value = {key.strip(): value}
    return value  # type: ignore[no-any-return]


def merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Two containment objects as one: both must match.

    >>> merge({"a": {"b": 1}}, {"a": {"c": 2}, "d": 3})
    {'a': {'b': 1, 'c': 2}, 'd': 3}
    """
    out = dict(into)
    for key, value in more.items():
        if isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = merge(out[key], value)
        elif key in out and out[key] != value:
            raise InvalidInput(f"payload key {quote(key)} is given twice with different values")
        else:
            out[key] = value
    return out


def payload_of(json_text: str | None, paths: Sequence[str] = ()) -> dict[str, Any] | None:
    """The containment object of `--payload JSON` and each `--payload-path K=V`, merged."""
    found: dict[str, Any] | None = None
    if json_text is not None:
        try:
            found = json.loads(json_text)
        except ValueError as exc:
            raise InvalidInput(f'--payload is not valid JSON ({exc}); e.g. \'{{"account": "acme"}}\'') from None
        if not isinstance(found, dict):
            raise InvalidInput('--payload matches by containment: give a JSON object, e.g. \'{"account": "acme"}\'')
    for text in paths:
        found = merge(found or {}, payload_path(text))
    return found


def parse_filter(text: str) -> JobFilter:
    """The console's filter written as `prefix:value` words: `payload:account=acme` (or
    `payload:{"account": "acme"}`), `status:dead,failed`, `type:T`, `queue:Q`, `error:P`,
    `older:1h`, `since:30m`. Quote a value with spaces (`error:'no such user'`).

    >>> parse_filter("payload:account=acme status:dead,failed").to_json()
    {'statuses': ['dead', 'failed'], 'payload': {'account': 'acme'}}
    """
    # JSON objects first (`payload:{"a": [1, 2]}` holds spaces and quotes of its own), then words.
    objects: list[dict[str, Any]] = []
    rest, at = "", 0
    decoder = json.JSONDecoder()
    for match in re.finditer(r"(?:^|\s)payload:(?=\{)", text):
        if match.start() < at:
            continue
        try:
            obj, end = decoder.raw_decode(text, match.end())
        except ValueError as exc:
            raise InvalidInput(f"bad filter {quote(text)}: the payload is not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise InvalidInput("payload: matches by containment: give a JSON object")
        rest += text[at : match.start()] + f" payload:{{{len(objects)}}} "
        objects.append(obj)
        at = end
    rest += text[at:]
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise InvalidInput(f"bad filter {quote(text)}: {exc}") from None
    fields: dict[str, Any] = {}
    payload: dict[str, Any] | None = None
    for word in words:
        prefix, sep, value = word.partition(":")
        if not sep or prefix not in PREFIXES:
            raise InvalidInput(f"bad filter word {quote(word)}: use {', '.join(p + ':' for p in PREFIXES)}")
        if prefix == "payload":
            held = re.fullmatch(r"\{(\d+)\}", value)
            more = objects[int(held.group(1))] if held else payload_path(value)
            payload = merge(payload or {}, more)
        elif prefix == "status":
            fields["statuses"] = tuple(v for v in value.split(",") if v)
        elif prefix == "type":
            fields["types"] = tuple(v for v in value.split(",") if v)
        elif prefix == "queue":
            fields["queue"] = value
        elif prefix == "error":
            fields["error"] = value
        else:
            fields["older_than" if prefix == "older" else "newer_than"] = parse_duration(value)
    return JobFilter(payload=payload, **fields)


def is_search(text: str) -> bool:
    """Whether the console's filter text asks for the jobs search (it starts with a prefix)."""
    head = text.strip().split(":", 1)[0]
    return ":" in text and head in PREFIXES
