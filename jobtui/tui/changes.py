"""The console's changes to the queue, run in a worker thread once the operator said yes.

Each returns the line the toast shows, saying what differs from what the question promised.
Panes and drill-downs ask the question; `JobtuiApp.confirm_then` asks it and runs these.
"""

from __future__ import annotations

from jobtui.kernel.domain import JobStatus
from jobtui.tui.data import Actions, DataSource


def requeue_job(actions: Actions, job_id: int) -> str:
    return f"requeued {actions.requeue_jobs([job_id])} job(s)"


def requeue_group_question(
    status: str, job_type: str, fingerprint: str, ids: list[int], error: str | None
) -> list[str]:
    """The question before a group is requeued: exactly the `ids` counted will change."""
    which = (
        [f"Requeue every {status} job of type {job_type} with error"]
        if error is None
        else [
            f"Requeue the {status} jobs of type {job_type} whose error matches {error!r},",
            "of the group with error",
        ]
    )
    return [
        *which,
        f"  {fingerprint or '-'}",
        f"{len(ids)} row(s) will change (back to ready, attempts reset).",
        f"Only these {len(ids)}: jobs that join the group before you answer",
        f"stay {status} (press r again for them).",
    ]


def requeue_group(
    actions: Actions,
    source: DataSource,
    status: str,
    job_type: str,
    fingerprint: str,
    ids: list[int],
    error: str | None = None,
) -> str:
    """Requeue exactly the `ids` the question counted, then say what differs from it."""
    n = actions.requeue_group(status, job_type, fingerprint, ids)
    message = f"requeued {n} job(s)"
    if n < len(ids):
        message = (
            f"requeued {n} of the {len(ids)} job(s) counted: {len(ids) - n} left the group before you"
            " confirmed (requeued, cancelled or deleted elsewhere)"
        )
    joined = len(source.dead_group_ids(status, job_type, fingerprint, error))
    if joined:
        message += (
            f"; {joined} job(s) joined the group after the count and are still {status} (not shown to you,"
            " so not requeued): press r again for them"
        )
    return message


def kill_lease_question(what: str, attempt: int, max_attempts: int) -> list[str]:
    """The question before a lease is killed: what becomes of the job, and that only this
    attempt is killed."""
    after = (
        f"It was its last attempt ({attempt} of {max_attempts}): it becomes dead."
        if attempt >= max_attempts
        else f"It returns to ready now (attempt {attempt} of {max_attempts} counts)."
    )
    return [f"Kill the lease of {what}?", after, "Only this attempt: 1 row will change."]


def kill_lease(actions: Actions, job_id: int, token: int | None) -> str:
    """Kill the attempt the question named, then say what became of the job."""
    killed, row = actions.kill_lease(job_id, token)
    if killed:
        if row is None:
            after = "it has left the table since"
        elif row.status is JobStatus.DEAD:
            after = "it was its last attempt: it is dead"
        elif row.status is JobStatus.READY:
            after = "it is ready again"
        else:  # read after the kill: another worker may have claimed it meanwhile
            after = f"it is {row.status.value} again since (attempt {row.attempts}, {row.locked_by or '-'})"
        return f"lease of job {job_id} killed; {after}"
    if row is None:
        return f"job {job_id} is gone (deleted or archived): nothing killed"
    if row.status is not JobStatus.RUNNING:
        return f"job {job_id} was no longer running (it is {row.status.value}): nothing killed"
    if token is not None and row.lease_token != token:
        return (
            f"job {job_id} was not killed: the attempt you saw ended, and attempt {row.attempts} now runs"
            f" on {row.locked_by or '-'} (press k again for it)"
        )
    return (
        f"job {job_id} was not killed: a change holds its row now (an effect committing in job.once(),"
        " a heartbeat or an outcome being written); try again in a moment"
    )


def cancel(actions: Actions, job_id: int) -> str:
    n = actions.cancel(job_id)
    return f"job {job_id} cancelled" if n else f"job {job_id} was no longer ready or running"


def pause_schedule(actions: Actions, name: str) -> str:
    return f"schedule {name} " + ("paused" if actions.pause_schedule(name) else "was already paused")


def resume_schedule(actions: Actions, name: str) -> str:
    return f"schedule {name} " + ("resumed" if actions.resume_schedule(name) else "was not paused")


def run_schedule_now(actions: Actions, name: str) -> str:
    return f"enqueued job {actions.run_schedule_now(name)}"
