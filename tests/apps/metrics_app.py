"""A minimal app for `jobtui worker --metrics-port` (tests/integration/test_operator_cli.py,
test_probes.py)."""

from __future__ import annotations

from jobtui.core.registry import Job, Jobs
from tests.apps.work import awork

jobs = Jobs()


@jobs.handler("metrics.noop")
def noop(job: Job) -> None:
    return None


@jobs.handler("metrics.sleep")
async def in_flight(job: Job) -> None:
    """Sleep `seconds`: a job still in flight while its worker drains."""
    await awork(float(job.payload.get("seconds", 5)))
