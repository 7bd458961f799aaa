"""jobtui: background jobs and cron schedules on one PostgreSQL table.

import jobtui
queue = jobtui.Queue("postgresql://localhost/app")
queue.enqueue("email.send", {"user_id": 42}, key="welcome:42")
"""

from .aclient import AsyncQueue
from .backoff import BackoffPolicy
from .client import Queue, check_schema, migrate_schema
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
from .jobfilter import JobFilter
from .jobquery import JobCount, JobSummary, SearchCancelled, SearchResult
from .registry import Job, Jobs, LeaseLost, Permanent, Retry, ScheduleSpec
from .typed import checked_payloads
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
    "JobCount",
    "JobFilter",
    "JobStatus",
    "JobSummary",
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
    "SearchCancelled",
    "SearchResult",
    "SchemaNotMigrated",
    "SchemaTooNew",
    "UnknownJob",
    "check_schema",
    "checked_payloads",
    "migrate_schema",
    "Worker",
]
