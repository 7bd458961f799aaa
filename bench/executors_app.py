"""The sync handlers of bench/executors.py: one that does nothing and one that sleeps 10 ms."""

from __future__ import annotations

import time

from jobtui import Job, Jobs

jobs = Jobs()


@jobs.handler("bench.sync_noop")
def sync_noop(job: Job) -> None:
    pass


@jobs.handler("bench.sync_10ms")
def sync_10ms(job: Job) -> None:
    time.sleep(0.01)
