"""jobtui: background jobs and cron schedules on one PostgreSQL table.

import jobtui
client = jobtui.Client("postgresql://localhost/app")
client.enqueue("email.send", {"user_id": 42}, key="welcome:42")
"""

from typing import TYPE_CHECKING

from jobtui.clients.aclient import AsyncClient
from jobtui.clients.base import ClientBase, renamed
from jobtui.clients.client import Client, check_schema, migrate_schema
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
    "AsyncClient",
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
    "Client",
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

if TYPE_CHECKING:
    # The names of 0.2.0, kept for one release: at run time __getattr__ hands them out with a
    # DeprecationWarning, so they stay out of __all__ and of `from jobtui import *`. Type
    # checkers see plain aliases and no __getattr__, which would let any misspelt name pass.
    Queue = Client
    AsyncQueue = AsyncClient
else:

    def __getattr__(name: str) -> type[ClientBase]:
        return renamed(__name__, name, {"Queue": Client, "AsyncQueue": AsyncClient})
