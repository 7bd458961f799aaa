"""Handlers for the tests of handlers that are stopped, die or outlive their lease
(tests/chaos/test_stoppable.py), run by workers in either executor.

Each handler appends its start and end to the file named by JOBTUI_TEST_EVENTS, one line per
event, with its process id and the system-wide monotonic clock, since the database may be
away while it runs:

    <event> <job id> <lease token> <worker> <pid> <time.monotonic()>

None of them looks at `job.lost`: most real handlers never do.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import psycopg

from jobtui.core.registry import Job, Jobs
from jobtui.kernel.backoff import BackoffPolicy
from tests.apps.work import note, work

jobs = Jobs()
FAST = BackoffPolicy(base=0.1, cap=0.2)


def event(job: Job, what: str) -> None:
    note(job, what, str(os.getpid()))


def _work(job: Job) -> None:
    event(job, "start")
    first = job.lease_token == 1
    work(float(job.payload["seconds"] if first else job.payload.get("then", job.payload["seconds"])))
    event(job, "end")


@jobs.handler("sleeper", backoff=FAST)
def sleeper(job: Job) -> None:
    """Sleeps `seconds` (on later claims `then`, if given), and that is all."""
    _work(job)


@jobs.handler("sleeper.timeout", backoff=FAST, timeout=2, max_attempts=2)
def sleeper_timeout(job: Job) -> None:
    _work(job)


@jobs.handler("sleeper.effect", backoff=FAST)
def sleeper_effect(job: Job) -> None:
    """Sleeps, then does its effect once (effect_log, through job.once)."""
    event(job, "start")
    work(float(job.payload["seconds"]))
    with psycopg.connect(os.environ["JOBTUI_DSN"]) as conn:
        if job.once(conn, f"sleeper:{job.id}"):
            conn.execute(
                "INSERT INTO effect_log (key, job_id, attempt, worker) VALUES (%s, %s, %s, %s)",
                (f"sleeper:{job.id}", job.id, job.lease_token, job.worker_id),
            )
    event(job, "end")


@jobs.handler("quick")
def quick(job: Job) -> None:
    pass


@jobs.handler("segfault", max_attempts=2, backoff=FAST)
def segfault(job: Job) -> None:
    event(job, "start")
    ctypes.string_at(0)  # reads address 0: SIGSEGV


@jobs.handler("exit3", max_attempts=2, backoff=FAST)
def exit3(job: Job) -> None:
    event(job, "start")
    os._exit(3)


@jobs.handler("hog", max_attempts=2, backoff=FAST)
def hog(job: Job) -> None:
    """Allocates `mib` MiB, 8 MiB at a time (each page touched), then sleeps."""
    event(job, "start")
    held: list[Any] = []
    for _ in range(int(job.payload["mib"]) // 8):
        held.append(b"\x01" * (8 << 20))  # every page written, so resident
        work(0.02)  # memory that grows over a while, as a leaking job's does
    work(30)
    event(job, "end")


def resident() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@jobs.handler("hog.brief", max_attempts=1)
def hog_brief(job: Job) -> None:
    """Allocates `mib` MiB at once (each page touched) and returns; the memory is freed
    `linger` seconds later, by a thread that holds it until then."""
    event(job, "start")
    held = [b"\x01" * (int(job.payload["mib"]) << 20)]

    def release() -> None:
        work(float(job.payload["linger"]))
        held.clear()

    threading.Thread(target=release, daemon=True).start()
    event(job, "end")


KEPT: list[bytes] = []  # what `hog.keeps` holds, until its process ends


@jobs.handler("hog.keeps", max_attempts=1)
def hog_keeps(job: Job) -> None:
    """Grows its process's resident memory to 8 MiB over `limit` bytes and returns, holding it.

    All but the last 24 MiB are allocated first, staying 16 MiB under the limit; the last
    24 MiB at once, so the limit is crossed only in the last few milliseconds of the job.
    """
    event(job, "start")
    missing = int(job.payload["limit"]) + (8 << 20) - resident()
    last = 24 << 20
    if missing > last:
        KEPT.append(b"\x01" * (missing - last))
    KEPT.append(b"\x01" * min(missing, last))
    event(job, "end")
