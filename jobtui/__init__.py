"""jobtui: background jobs and cron schedules on one PostgreSQL table.

import jobtui
queue = jobtui.Queue("postgresql://localhost/app")
queue.enqueue("email.send", {"user_id": 42}, key="welcome:42")
"""

from .backoff import BackoffPolicy
from .client import AsyncQueue, Queue
from .domain import ClaimedJob, FailOutcome, Failure, JobRow, JobStatus, Lease, NewJob, Reaped
from .errors import (
    DatabaseUnavailable,
    InvalidInput,
    JobtuiError,
    PrivilegeMissing,
    SchemaNotMigrated,
    SchemaTooNew,
    UnknownJob,
)
from .registry import Job, Jobs, LeaseLost, Permanent, Retry, ScheduleSpec
from .worker import Worker

__all__ = [
    "AsyncQueue",
    "BackoffPolicy",
    "ClaimedJob",
    "DatabaseUnavailable",
    "FailOutcome",
    "Failure",
    "InvalidInput",
    "Job",
    "JobRow",
    "JobStatus",
    "Jobs",
    "JobtuiError",
    "Lease",
    "LeaseLost",
    "NewJob",
    "Permanent",
    "PrivilegeMissing",
    "Queue",
    "Reaped",
    "Retry",
    "ScheduleSpec",
    "SchemaNotMigrated",
    "SchemaTooNew",
    "UnknownJob",
    "Worker",
]
