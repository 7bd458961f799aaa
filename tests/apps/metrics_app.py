"""A minimal app for `jobtui worker --metrics-port` in tests/integration/test_operator_cli.py."""

from __future__ import annotations

from jobtui.registry import Job, Jobs

jobs = Jobs()


@jobs.handler("metrics.noop")
def noop(job: Job) -> None:
    return None
