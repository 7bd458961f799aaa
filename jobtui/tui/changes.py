"""The console's changes to the queue, run in a worker thread once the operator said yes.

Each returns the line the toast shows, saying what differs from what the question promised.
Panes and drill-downs ask the question; `JobtuiApp.confirm_then` asks it and runs these.
"""

from __future__ import annotations

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


def kill_lease(actions: Actions, job_id: int) -> str:
    n = actions.kill_lease(job_id)
    return f"lease of job {job_id} killed; it is ready again" if n else f"job {job_id} was no longer running"


def cancel(actions: Actions, job_id: int) -> str:
    n = actions.cancel(job_id)
    return f"job {job_id} cancelled" if n else f"job {job_id} was no longer ready or running"


def pause_schedule(actions: Actions, name: str) -> str:
    return f"schedule {name} " + ("paused" if actions.pause_schedule(name) else "was already paused")


def resume_schedule(actions: Actions, name: str) -> str:
    return f"schedule {name} " + ("resumed" if actions.resume_schedule(name) else "was not paused")


def run_schedule_now(actions: Actions, name: str) -> str:
    return f"enqueued job {actions.run_schedule_now(name)}"
