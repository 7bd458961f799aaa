"""Handlers whose job types and errors carry terminal escapes and forged log lines, for the
worker log tests of issue 16."""

from __future__ import annotations

from typing import Any

from jobtui.core.registry import Job, Jobs, Permanent

FORGED = "\n2025-01-01 00:00:00,000 ERROR jobtui.worker: forged line"
REFUSED = "refuse\x1b]0;pwned-title\x07[/]" + FORGED  # fails for good
CRASHES = "crash\x1b[2J\x1b[H\u202e" + FORGED  # raises; dead at once, and its callback fails too

jobs = Jobs()


@jobs.handler(REFUSED)
def refuse(job: Job) -> None:
    raise Permanent("no \x9b2J[bold red]way[/]" + FORGED)


@jobs.handler(CRASHES, max_attempts=1)
def crash(job: Job) -> None:
    raise RuntimeError("boom \x1b]8;;http://evil.example\x1b\\click" + FORGED)


@jobs.on_dead
def complain(outcome: Any) -> None:
    raise ValueError(f"callback for {outcome.type}" + FORGED)
