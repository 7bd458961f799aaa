"""A job row told in words, for `jobtui job ID` and the console's detail screen. Pure."""

from __future__ import annotations

import json
from datetime import datetime

from jobtui.kernel.domain import JobRow, JobStatus
from jobtui.kernel.durations import age_text
from jobtui.kernel.safetext import block, line


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    delta = moment - now
    word = (
        "in " + age_text(delta.total_seconds())
        if delta.total_seconds() > 0
        else age_text(delta.total_seconds()) + " ago"
    )
    return f"{moment.isoformat(timespec='seconds')} ({word})"


def state_sentence(job: JobRow, now: datetime) -> str:
    """One sentence saying what the job is doing and what happens next."""
    limit = job.max_attempts if job.max_attempts is not None else "the handler's limit"
    attempts = f"attempt {job.attempts} of {limit}"
    match job.status:
        case JobStatus.READY:
            if job.run_at > now:
                return f"Waiting: will run {_when(job.run_at, now)}; {job.attempts} of {limit} attempts used."
            return (
                f"Ready: waiting for a worker since {_when(job.run_at, now)}; {job.attempts} of {limit} attempts used."
            )
        case JobStatus.RUNNING:
            assert job.locked_until is not None
            if job.locked_until < now:
                return (
                    f"Running ({attempts}) on {job.locked_by}, but its lease expired {_when(job.locked_until, now)}: "
                    "the worker is probably gone and the reaper will return the job."
                )
            return f"Running ({attempts}) on {job.locked_by}, lease held until {_when(job.locked_until, now)}."
        case JobStatus.DONE:
            return f"Done {_when(job.finished_at, now)} after {job.attempts} attempt(s), last run by {job.locked_by}."
        case JobStatus.FAILED:
            return f"Failed for good {_when(job.finished_at, now)} ({attempts}): {first_line(job.last_error)}"
        case JobStatus.DEAD:
            return (
                f"Dead {_when(job.finished_at, now)}: all {job.max_attempts} attempts failed; requeue it to try again."
            )
    raise AssertionError(job.status)


def runs_in(job: JobRow) -> str:
    """What runs a running job, as its worker's last heartbeat said."""
    runner = job.runner
    if runner is None:
        return "- (not reported yet: the worker's first heartbeat says)"
    if runner.executor == "process":
        pid = f" (pid {runner.pid})" if runner.pid is not None else ""
        rss = f", {runner.rss / (1 << 20):,.0f} MiB resident at the last heartbeat" if runner.rss is not None else ""
        return f"a handler process{pid}{rss}"
    return "a thread of the worker's process" if runner.executor == "thread" else "the worker's event loop (async)"


def first_line(text: str | None) -> str:
    if not text:
        return "-"
    return text.strip().splitlines()[0] if text.strip() else "-"


def _indented(text: str, prefix: str = "      ") -> list[str]:
    """Every line of `text`, indented, each escaped on its own."""
    return [prefix + line(part) for part in (text.rstrip("\n") or "-").split("\n")]


def attempts(job: JobRow, now: datetime) -> list[str]:
    """Each recorded attempt, newest first: which, on which worker, when it started and
    ended and how, and its whole stored error (a traceback is kept line by line, each line
    escaped)."""
    out = [f"Attempts and events ({len(job.errors)} recorded, newest first):"]
    if job.status is JobStatus.RUNNING:
        out.append(f"  attempt {job.attempts}  running on {line(job.locked_by or '-')}")
        out.append(f"      started {_when(job.started_at, now)}, lease until {_when(job.locked_until, now)}")
    for entry in reversed(job.errors):
        out.append(f"  attempt {entry.attempt}  {line(entry.kind)} on {line(entry.worker or '-')}")
        started = f"started {line(entry.started)}, " if entry.started else ""
        out.append(f"      {started}ended {line(entry.at)}")
        out.extend(_indented(entry.error))
    if len(out) == 1:
        out.append("  none recorded")
    return out


def explain(job: JobRow, now: datetime | None = None, *, full: bool = False) -> list[str]:
    """The job as lines of text: state, facts, error history, payload.

    The type, worker, key, errors and payload are data: each line is escaped (`safetext`),
    so a newline or an escape sequence in them cannot reach the terminal. The payload is
    the last item, JSON on several lines (its strings' newlines are JSON-escaped). `full`
    (the console's job view) lists every attempt with its whole error instead of first lines.
    """
    now = now or job.db_now or datetime.now().astimezone()
    lines = [
        f"Job {job.id} ({job.type}): {job.status.value}",
        state_sentence(job, now),
        "",
        f"  attempts      {job.attempts} of {job.max_attempts or 'the handler limit (set at first claim)'}",
        f"  created       {_when(job.created_at, now)}",
        f"  run at        {_when(job.run_at, now)}",
        f"  started       {_when(job.started_at, now)}",
        f"  finished      {_when(job.finished_at, now)}",
        f"  worker        {job.locked_by or '-'}",
        *([f"  runs in       {runs_in(job)}"] if job.status is JobStatus.RUNNING else []),
        f"  lease until   {_when(job.locked_until, now)}",
        f"  heartbeat     {_when(job.heartbeat_at, now)}",
        f"  lease token   {job.lease_token}",
        f"  key           {job.idempotency_key or '-'}",
        f"  expired leases {job.lease_expirations}",
        f"  last error    {first_line(job.last_error)}",
    ]
    if full:
        payload = json.dumps(job.payload, indent=2, ensure_ascii=False, sort_keys=True)
        last = ["", "Last error:", *_indented(job.last_error or "-", "  ")] if job.last_error else []
        told = [line(text) for text in lines] + last + ["", *attempts(job, now)]
        return [*told, "", "Payload:", block(payload)]
    if job.errors:
        lines += ["", f"History ({len(job.errors)}):"]
        for entry in job.errors:
            lines.append(f"  {entry.at}  attempt {entry.attempt}  {entry.kind:<13} {entry.worker or '-'}")
            lines.append(f"      {first_line(entry.error)}")
    payload = json.dumps(job.payload, indent=2, ensure_ascii=False, sort_keys=True)
    return [*(line(text) for text in lines), "", "Payload:", block(payload)]
