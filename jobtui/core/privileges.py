"""What each use of jobtui needs of its database role, and which of it the role lacks.

A worker checks at start, so that a role without a grant stops at once with one line
naming what is missing, instead of failing statement after statement; docs/grants.sql
gives exactly these.

    missing = run(conn, missing_privileges_call("jobtui", WORKER_NEEDS))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobtui.kernel.db import Call

GRANTS_HINT = "grant what docs/grants.sql gives the worker role (see Privileges in jobtui's README)"


@dataclass(frozen=True, slots=True)
class Needs:
    """Table privileges by table, and whether the schema's sequences and functions are used."""

    tables: Mapping[str, Sequence[str]]
    sequences: bool = True
    functions: bool = True


# Workers: claims, outcomes, heartbeats, reaping, the scheduler and the archiver.
WORKER_NEEDS = Needs(
    {
        "job": ("SELECT", "INSERT", "UPDATE", "DELETE"),
        # Keys: claimed by enqueues, kept as jobs leave (the trigger), pruned by the archiver.
        "job_key": ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "schedule": ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "job_archive": ("SELECT", "INSERT", "DELETE"),
        "lease_expiry": ("SELECT", "INSERT", "DELETE"),
        "stats_hourly": ("SELECT", "INSERT", "DELETE"),
        "done_tally": ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "queue_minute": ("SELECT", "INSERT", "DELETE"),
        "effect": ("SELECT", "INSERT", "DELETE"),
        "audit": ("SELECT", "INSERT"),
        "migration": ("SELECT",),
        # Read by every claim; written by operators' pauses and limits.
        "queue_control": ("SELECT", "INSERT", "UPDATE"),
        # Taken from by the claims of rated queues and types.
        "rate_bucket": ("SELECT", "INSERT", "UPDATE"),
        # The drain forecast's spans, written and pruned by the archiver.
        "queue_flow": ("SELECT", "INSERT", "DELETE"),
        # Its own row in the fleet: written at start, refreshed, deleted at exit; the
        # archiver prunes lost ones.
        "fleet": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    }
)

# A scheduler on its own: schedules in, jobs out.
SCHEDULER_NEEDS = Needs(
    {
        "job": ("SELECT", "INSERT"),
        "job_key": ("SELECT", "INSERT"),
        "schedule": ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "migration": ("SELECT",),
        "fleet": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    },
    functions=False,
)


def missing_privileges_call(schema: str, needs: Needs) -> Call[list[str]]:
    """The privileges of `needs` that the session's role lacks, as 'UPDATE on jobtui.job'."""
    pairs = [(table, privilege) for table, privileges in needs.tables.items() for privilege in privileges]
    params = {
        "schema_name": schema,
        "tables": [t for t, _ in pairs],
        "privileges": [p for _, p in pairs],
        "sequences": needs.sequences,
        "functions": needs.functions,
    }
    return Call("privileges_missing", params, lambda rows: [str(r[0]) for r in rows])


def privilege_message(command: str, missing: Sequence[str]) -> str:
    """One line: what `command` cannot do without, and what to do about it."""
    return f"the database role lacks {shown(missing)}, which {command} needs; {GRANTS_HINT}"


# Viewers' consoles (`jobtui serve --viewer-dsn`): what docs/grants.sql gives the read-only
# role, and nothing that changes the schema's contents (role_changes_call).
VIEWER_NEEDS = Needs(
    {table: ("SELECT",) for table in ("job", "schedule", "lease_expiry", "audit", "queue_control", "migration")},
    sequences=False,
    functions=False,
)
READ_ONLY_ROLE = (
    'psql "$OWNER_DSN" -v schema={schema} -v role=jobtui_readonly -v read_only=1 -v create_role=1 -f docs/grants.sql'
)


def role_changes_call(schema: str) -> Call[list[str]]:
    """What the session's role (or a role it may SET ROLE to) may change in the schema, as
    'INSERT on jobtui.job'; empty for the read-only role of docs/grants.sql."""
    return Call("privileges_changes", {"schema_name": schema}, lambda rows: [str(r[0]) for r in rows])


def shown(items: Sequence[str], most: int = 6) -> str:
    """The first `most` of `items`, and how many more."""
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")
