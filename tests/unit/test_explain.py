"""A job row told in words, for every status, at a fixed moment."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobtui.kernel.domain import ErrorEntry, JobRow, JobStatus
from jobtui.kernel.durations import age_text
from jobtui.kernel.explain import explain, first_line, state_sentence

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def row(**changes: Any) -> JobRow:
    base = JobRow(
        id=7,
        type="email.send",
        payload={"user_id": 42, "a": [1, 2]},
        idempotency_key=None,
        status=JobStatus.READY,
        run_at=NOW - timedelta(seconds=5),
        attempts=0,
        max_attempts=25,
        locked_by=None,
        locked_until=None,
        lease_token=0,
        heartbeat_at=None,
        last_error=None,
        created_at=NOW - timedelta(minutes=10),
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        (
            row(),
            "Ready: waiting for a worker since 2024-05-01T11:59:55+00:00 (5s ago); 0 of 25 attempts used.",
        ),
        (
            row(run_at=NOW + timedelta(minutes=5), attempts=2, max_attempts=5),
            "Waiting: will run 2024-05-01T12:05:00+00:00 (in 5m00s); 2 of 5 attempts used.",
        ),
        (
            row(
                status=JobStatus.RUNNING,
                attempts=3,
                max_attempts=10,
                locked_by="host:123",
                locked_until=NOW + timedelta(seconds=25),
                lease_token=3,
            ),
            "Running (attempt 3 of 10) on host:123, lease held until 2024-05-01T12:00:25+00:00 (in 25s).",
        ),
        (
            row(
                status=JobStatus.RUNNING,
                attempts=1,
                locked_by="host:9",
                locked_until=NOW - timedelta(minutes=2, seconds=3),
                lease_token=1,
            ),
            "Running (attempt 1 of 25) on host:9, but its lease expired 2024-05-01T11:57:57+00:00 (2m03s ago): "
            "the worker is probably gone and the reaper will return the job.",
        ),
        (
            row(status=JobStatus.DONE, attempts=2, locked_by="w1", finished_at=NOW - timedelta(hours=2, minutes=5)),
            "Done 2024-05-01T09:55:00+00:00 (2h05m ago) after 2 attempt(s), last run by w1.",
        ),
        (
            row(
                status=JobStatus.FAILED,
                attempts=1,
                max_attempts=3,
                finished_at=NOW - timedelta(days=1, hours=3),
                last_error="ValueError: no such user\nTraceback (most recent call last):\n  ...",
            ),
            "Failed for good 2024-04-30T09:00:00+00:00 (1d03h ago) (attempt 1 of 3): ValueError: no such user",
        ),
        (
            row(status=JobStatus.FAILED, finished_at=NOW, last_error=None),
            "Failed for good 2024-05-01T12:00:00+00:00 (0s ago) (attempt 0 of 25): -",
        ),
        (
            row(status=JobStatus.DEAD, attempts=5, max_attempts=5, finished_at=NOW - timedelta(seconds=59)),
            "Dead 2024-05-01T11:59:01+00:00 (59s ago): all 5 attempts failed; requeue it to try again.",
        ),
    ],
    ids=["ready", "waiting", "running", "running-expired", "done", "failed", "failed-no-error", "dead"],
)
def test_state_sentence(job: JobRow, expected: str) -> None:
    assert state_sentence(job, NOW) == expected


@pytest.mark.parametrize("status", list(JobStatus))
def test_explain_every_status(status: JobStatus) -> None:
    locked_until = NOW + timedelta(seconds=30) if status == JobStatus.RUNNING else None
    finished = NOW - timedelta(minutes=1) if status in (JobStatus.DONE, JobStatus.FAILED, JobStatus.DEAD) else None
    job = row(
        status=status,
        attempts=1,
        locked_by="w1",
        locked_until=locked_until,
        finished_at=finished,
        last_error="boom",
        lease_token=4,
        idempotency_key="welcome:42",
    )
    lines = explain(job, NOW)
    assert lines[0] == f"Job 7 (email.send): {status.value}"
    assert lines[1] == state_sentence(job, NOW)
    assert "  attempts      1 of 25" in lines
    assert "  lease token   4" in lines
    assert "  key           welcome:42" in lines
    assert "  worker        w1" in lines
    assert "  last error    boom" in lines
    assert "  created       2024-05-01T11:50:00+00:00 (10m00s ago)" in lines
    expected_finish = "-" if finished is None else "2024-05-01T11:59:00+00:00 (1m00s ago)"
    assert f"  finished      {expected_finish}" in lines
    expected_lease = "-" if locked_until is None else "2024-05-01T12:00:30+00:00 (in 30s)"
    assert f"  lease until   {expected_lease}" in lines
    # The payload comes last, as sorted, indented JSON.
    payload_at = lines.index("Payload:")
    assert "\n".join(lines[payload_at + 1 :]) == '{\n  "a": [\n    1,\n    2\n  ],\n  "user_id": 42\n}'
    assert not any(line.startswith("History") for line in lines)


def test_explain_shows_history_and_blank_fields() -> None:
    job = row(
        status=JobStatus.READY,
        attempts=2,
        last_error="lease expired: worker w2 stopped heartbeating\nmore",
        lease_expirations=1,
        errors=[
            ErrorEntry(at="2024-05-01T11:00:00+00:00", attempt=1, worker="w1", kind="error", error="KeyError: 'x'"),
            ErrorEntry(at="2024-05-01T11:30:00+00:00", attempt=2, worker=None, kind="lease_expired", error="late\n2"),
        ],
        payload={"text": "héllo"},
    )
    lines = explain(job, NOW)
    blank = ["  worker        -", "  key           -", "  started       -", "  heartbeat     -"]
    shown = ["  expired leases 1", "  last error    lease expired: worker w2 stopped heartbeating"]
    assert [line for line in [*blank, *shown] if line not in lines] == [], lines
    at = lines.index("History (2):")
    assert lines[at + 1] == "  2024-05-01T11:00:00+00:00  attempt 1  error         w1"
    assert lines[at + 2] == "      KeyError: 'x'"
    assert lines[at + 3] == "  2024-05-01T11:30:00+00:00  attempt 2  lease_expired -"
    assert lines[at + 4] == "      late"
    assert lines[-2:] == ["Payload:", '{\n  "text": "héllo"\n}']  # not escaped to \\u00e9


@pytest.mark.parametrize("status", [JobStatus.READY, JobStatus.RUNNING])
def test_a_limit_not_yet_set_is_told_in_words(status: JobStatus) -> None:
    job = row(status=status, max_attempts=None, locked_by="w1", locked_until=NOW + timedelta(seconds=9))
    lines = explain(job, NOW)
    assert "None" not in lines[1] and "handler" in lines[1]
    attempts_line = next(line for line in lines if line.startswith("  attempts"))
    assert "None" not in attempts_line and "handler" in attempts_line


def test_explain_uses_the_database_clock_when_no_now_is_given() -> None:
    job = row(db_now=NOW + timedelta(hours=1))
    assert explain(job)[1] == state_sentence(job, NOW + timedelta(hours=1))
    assert "(1h00m ago)" in explain(job)[1]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59, "59s"), (60, "1m00s"), (192, "3m12s"), (3599, "59m59s"), (3600, "1h00m"), (7500, "2h05m"),
     (86399, "23h59m"), (86400, "1d00h"), (97200, "1d03h"), (-45, "45s")],
)  # fmt: skip
def test_age_text(seconds: int, text: str) -> None:
    assert age_text(seconds) == text


@pytest.mark.parametrize(
    ("text", "first"), [(None, "-"), ("", "-"), ("   \n  ", "-"), ("one", "one"), ("\n  two\nthree", "two")]
)
def test_first_line(text: str | None, first: str) -> None:
    assert first_line(text) == first
