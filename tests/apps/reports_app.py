"""An app whose only handler declares a named queue, with a per-second schedule of its jobs:
the schedule's jobs go to the handler's queue, and a worker serving only that queue runs them
(and jobtui's own archiver)."""

from __future__ import annotations

from jobtui.core.registry import Job, Jobs

jobs = Jobs()


@jobs.handler("rep.build", queue="reports")
def build(job: Job) -> None:
    """A report that takes no time."""


jobs.schedule("rep-every-second", cron="* * * * * *", type="rep.build")
# A schedule that names its queue: the handler's is not the only choice.
jobs.schedule("rep-hourly-urgent", cron="0 * * * *", type="rep.build", queue="urgent")
