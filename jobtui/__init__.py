"""jobtui: background jobs and cron schedules on one PostgreSQL table.

import jobtui
queue = jobtui.Queue("postgresql://localhost/app")
queue.enqueue("email.send", {"user_id": 42}, key="welcome:42")
"""

from jobtui.clients.aclient import AsyncQueue
from jobtui.clients.client import Queue, check_schema, migrate_schema
from jobtui.core import otel
from jobtui.core.registry import Job, Jobs, LeaseLost, Permanent, Retry, ScheduleSpec
from jobtui.core.typed import checked_payloads
from jobtui.kernel.backoff import BackoffPolicy
from jobtui.kernel.db import connection_options
from jobtui.kernel.domain import ClaimedJob, FailOutcome, Failure, JobRow, JobStatus, Lease, NewJob, Reaped
from jobtui.kernel.errors import (
    DatabaseUnavailable,
    InvalidInput,
    JobtuiError,
    PrivilegeMissing,
    SchemaNotMigrated,
    SchemaTooNew,
    UnknownJob,
)
from jobtui.kernel.jobfilter import JobFilter
from jobtui.reads.jobquery import JobCount, JobSummary, SearchCancelled, SearchResult
from jobtui.worker import Worker

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
    "connection_options",
    "migrate_schema",
    "otel",
    "Worker",
]
