"""Errors jobtui reports to people: each message is one line that says what to do."""

from __future__ import annotations


class JobtuiError(Exception):
    """A problem the user can fix; the CLI prints the message alone and exits with 2."""


class InvalidInput(JobtuiError):
    """A value given by the user (payload, duration, type, attempts) is not acceptable."""


class DatabaseUnavailable(JobtuiError):
    """The database did not answer."""


class SchemaNotMigrated(JobtuiError):
    """The jobtui schema is missing or older than this code."""


class SchemaTooNew(JobtuiError):
    """The schema was migrated by a newer jobtui than this one."""


class UnknownJob(JobtuiError):
    """No job has the given id."""


class PrivilegeMissing(JobtuiError):
    """The database role lacks a privilege a command needs; granting it is the fix."""


class MigrationLockTimeout(JobtuiError):
    """A migration did not get a table's lock in the tries it was given; nothing was applied."""


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its class name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
