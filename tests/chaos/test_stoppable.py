"""Sync handlers stopped for real (the process executor), handlers that kill their own
process, and sync handlers outliving their lease in either executor: real worker processes,
real PostgreSQL, and a TCP proxy the test cuts.

The handlers (tests/apps/stoppable_app.py) log each start and end with their pid and the
machine's monotonic clock to a file; the test watches each handler's process through a
pidfd, so it knows the moment a stopped one was gone.

`-m slow` runs 20 outage trials per executor; the default run keeps one each.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import select
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui import Client, JobFilter, NewJob
from jobtui.core.bulk import Bulk
from jobtui.core.jobs import enqueue, enqueue_call
from tests.chaos.app_workers import LEASE, Start, db_with, overlapping
from tests.chaos.outages import outage_into_a_job
from tests.cluster import _free_port
from tests.proxy import Proxy
from tests.waits import wait_until
from tests.workers import APP_TABLES

APP = "tests.apps.stoppable_app:jobs"
Conn = psycopg.Connection[Any]


db = db_with(APP_TABLES)


@dataclass
class Run:
    """One attempt as its handler logged it, and when its process was gone (if it was)."""

    token: int
    worker: str
    pid: int
    started: float
    ended: float | None = None  # the handler logged its end
    gone: float | None = None  # its process was gone (process mode, watched by Deaths)

    @property
    def stopped(self) -> float | None:
        """When the attempt surely ran no more: its end, or its process gone."""
        found = [t for t in (self.ended, self.gone) if t is not None]
        return min(found) if found else None


class Deaths:
    """Watches the process of each handler start (a pidfd each) and notes when it is gone."""

    def __init__(self, events: Path) -> None:
        self._events = events
        self.gone: dict[int, float] = {}
        self._watched: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fds: dict[int, int] = {}
        while not self._stop.is_set():
            text = self._events.read_text() if self._events.exists() else ""
            for line in text.splitlines():
                pid = int(line.split()[4])
                if line.startswith("start") and pid not in self._watched:
                    self._watched.add(pid)
                    try:
                        fds[os.pidfd_open(pid)] = pid
                    except ProcessLookupError:
                        self.gone[pid] = time.monotonic()
            if fds:
                readable, _, _ = select.select(list(fds), [], [], 0.01)
                for fd in readable:
                    self.gone[fds.pop(fd)] = time.monotonic()
                    os.close(fd)
            else:
                self._stop.wait(0.01)  # no handler yet: read the events file again soon

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def deaths(events: Path) -> Iterator[Deaths]:
    watcher = Deaths(events)
    try:
        yield watcher
    finally:
        watcher.close()


def runs(events: Path, job_id: int, deaths: Deaths | None = None) -> list[Run]:
    found: dict[int, Run] = {}
    text = events.read_text() if events.exists() else ""
    for line in text.splitlines():
        what, job, token, worker, pid, at = line.split()
        if int(job) != job_id:
            continue
        if what == "start":
            assert int(token) not in found, f"attempt {token} of job {job_id} started twice"
            found[int(token)] = Run(int(token), worker, int(pid), float(at))
        else:
            found[int(token)].ended = float(at)
    for run in found.values():
        if deaths is not None:
            run.gone = deaths.gone.get(run.pid)
    return [found[t] for t in sorted(found)]


def all_stopped(events: Path, job_id: int, deaths: Deaths, timeout: float = 5.0) -> list[Run]:
    """The attempts of `job_id` once each has ended or its process is gone (the death of a
    process lands in the watcher a moment later); as they are after `timeout` otherwise."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: all(r.stopped is not None for r in runs(events, job_id, deaths)), timeout, "")
    return runs(events, job_id, deaths)


def job_row(db: Conn, job_id: int) -> dict[str, Any]:
    cur = db.execute(
        "SELECT status, attempts, lease_token, lease_expirations, last_error, errors FROM jobtui.job WHERE id = %s",
        (job_id,),
    )
    names = [c.name for c in cur.description or []]
    found = cur.fetchone()
    assert found is not None
    return dict(zip(names, found, strict=True))


def alive(pid: int) -> bool:
    """Whether process `pid` still exists and is not a zombie (it may end between the looks)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


# -- stopped for real -----------------------------------------------------------------------


def test_cancel_stops_a_sleeping_handler_process_within_two_seconds(
    db: Conn, dsn: str, start: Start, events: Path
) -> None:
    w = start("W", dsn, "--executor", "process")
    job_id = enqueue(db, enqueue_call("sleeper", {"seconds": 60}))
    [run] = wait_until(lambda: runs(events, job_id), 15, "the handler to start", w.log)
    assert run.pid != w.pid and alive(run.pid)
    with Client(dsn) as queue:
        cancelled_at = time.monotonic()
        assert queue.cancel([job_id], actor="test") == [job_id]
    wait_until(lambda: not alive(run.pid), 2, "the handler's process gone", w.log)
    took = time.monotonic() - cancelled_at
    row = job_row(db, job_id)
    assert row["status"] == "failed" and took < 2, (row, took)
    print(f"cancel to process gone: {took:.2f}s")
    assert runs(events, job_id)[0].ended is None  # it never slept its 60 s out
    w.wait_log("its handler process is being stopped", 5)
    # The worker runs on, and its pool starts another process for the next job.
    again = enqueue(db, enqueue_call("sleeper", {"seconds": 0}))
    wait_until(lambda: job_row(db, again)["status"] == "done", 15, "the next job done", w.log)
    assert w.proc.poll() is None


def test_a_bulk_cancel_stops_the_handler_processes_of_its_running_jobs(
    db: Conn, dsn: str, start: Start, events: Path
) -> None:
    """`jobtui bulk cancel` writes the row `cancel` writes: the worker hears it in its heartbeat's
    answer and stops each handler process for real, while a job outside the filter runs on."""
    w = start("W", dsn, "--executor", "process")
    acme = [enqueue(db, enqueue_call("sleeper", {"seconds": 60, "account": "acme"})) for _ in range(2)]
    other = enqueue(db, enqueue_call("sleeper", {"seconds": 60, "account": "other"}))
    started = {j: wait_until(lambda j=j: runs(events, j), 15, f"job {j}'s handler to start", w.log)[0] for j in acme}
    [kept] = wait_until(lambda: runs(events, other), 15, "the other job's handler to start", w.log)
    assert all(run.pid != w.pid and alive(run.pid) for run in [*started.values(), kept])
    with psycopg.connect(dsn, autocommit=True) as conn:
        bulk = Bulk(conn, "cancel", JobFilter(types=("sleeper",), payload={"account": "acme"}), actor="test")
        assert bulk.count() == 2
        cancelled_at = time.monotonic()
        outcome = bulk.run(bulk.start())
    assert (outcome.changed, outcome.busy) == (2, [])
    for job_id, run in started.items():
        wait_until(lambda run=run: not alive(run.pid), 3, f"job {job_id}'s handler process gone", w.log)
        row = job_row(db, job_id)
        assert row["status"] == "failed" and row["errors"][-1]["kind"] == "cancelled", row
        assert runs(events, job_id)[0].ended is None  # it never slept its 60 s out
    print(f"bulk cancel to processes gone: {time.monotonic() - cancelled_at:.2f}s")
    # Stopped as cancelled (job.cancelled set in the child), not merely as a lease gone.
    for job_id in acme:
        w.wait_log(f"job {job_id} (sleeper) attempt 1: the job was cancelled by an operator", 5)
    assert alive(kept.pid) and job_row(db, other)["status"] == "running"
    assert w.proc.poll() is None


def test_a_timeout_stops_the_process_and_its_retry_never_overlaps_it(
    db: Conn, dsn: str, start: Start, events: Path, deaths: Deaths
) -> None:
    w = start("W", dsn, "--executor", "process")
    job_id = enqueue(db, enqueue_call("sleeper.timeout", {"seconds": 60}))  # timeout 2 s, 2 attempts
    wait_until(lambda: job_row(db, job_id)["status"] == "dead", 30, "the job dead after two timeouts", w.log)
    wait_until(lambda: all(r.gone for r in runs(events, job_id, deaths)), 5, "both processes seen gone")
    found = runs(events, job_id, deaths)
    assert len(found) == 2, found
    for run in found:
        assert run.ended is None and run.gone is not None
        assert run.gone - run.started < 4, f"process {run.pid} lived {run.gone - run.started:.2f}s"
    assert not overlapping(found), found
    assert found[1].started > found[0].gone  # type: ignore[operator]
    row = job_row(db, job_id)
    assert row["attempts"] == 2 and [e["kind"] for e in row["errors"]] == ["error", "error"]
    assert all("ran over its timeout of 2s; its process was stopped" in e["error"] for e in row["errors"])


def _metrics(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        m.group(1): float(m.group(2)) for m in re.finditer(r"^(jobtui_worker_children\S*) (\S+)$", body, re.MULTILINE)
    }


def test_handlers_that_kill_their_process_go_dead_with_their_reason_while_the_rest_run_on(
    db: Conn, dsn: str, start: Start, events: Path
) -> None:
    port = _free_port()
    w = start(
        "W",
        dsn,
        "--executor",
        "process",
        "--concurrency",
        "4",
        "--max-memory-per-child",
        "160M",
        "--metrics-port",
        str(port),
    )
    deadly = {
        enqueue(db, enqueue_call("segfault")): "ProcessDied: handler process died of a segmentation fault",
        enqueue(db, enqueue_call("exit3")): "ProcessDied: handler process exited with status 3",
        enqueue(db, enqueue_call("hog", {"mib": 400})): "MemoryLimit: handler process went over "
        "--max-memory-per-child (",
    }
    with Client(dsn) as queue:
        quick = queue.enqueue_many([NewJob("quick") for _ in range(300)])
    ids = [*deadly, *quick]

    def final() -> bool:
        rows = dict(db.execute("SELECT id, status FROM jobtui.job WHERE id = ANY(%s)", (ids,)).fetchall())
        return all(rows[i] == "dead" for i in deadly) and all(rows[i] == "done" for i in quick)

    wait_until(final, 90, "the deadly jobs dead and the 300 others done", w.log)
    for job_id, reason in deadly.items():
        row = job_row(db, job_id)
        assert row["attempts"] == 2, row
        assert [e["kind"] for e in row["errors"]] == ["error", "error"], row["errors"]
        assert all(e["error"].startswith(reason) for e in row["errors"]), (reason, row["errors"])
    # One worker process all along: it started once and never stopped.
    assert w.proc.poll() is None and w.log().count("worker W started") == 1
    counters = _metrics(port)
    assert counters['jobtui_worker_children_died_total{reason="SIGSEGV"}'] == 2, counters
    assert counters['jobtui_worker_children_died_total{reason="exit"}'] == 2, counters
    assert counters['jobtui_worker_children_killed_total{reason="memory"}'] == 2, counters
    assert counters["jobtui_worker_children_started_total"] >= 6, counters  # one at least per death


def test_a_child_over_its_jobs_is_replaced_and_its_worker_says_how_many(
    db: Conn, dsn: str, start: Start, events: Path
) -> None:
    port = _free_port()
    w = start(
        "W", dsn, "--executor", "process", "--concurrency", "1", "--max-jobs-per-child", "3",
        "--metrics-port", str(port),
    )  # fmt: skip
    ids = [enqueue(db, enqueue_call("sleeper", {"seconds": 0})) for _ in range(7)]
    wait_until(lambda: all(job_row(db, i)["status"] == "done" for i in ids), 30, "the jobs done", w.log)
    pids = [runs(events, i)[0].pid for i in ids]
    # Three jobs per process, one process at a time.
    assert len(set(pids)) == 3 and [pids.count(p) for p in dict.fromkeys(pids)] == [3, 3, 1], pids
    counters = wait_until(
        lambda: (c := _metrics(port)).get('jobtui_worker_children_recycled_total{reason="jobs"}') == 2 and c,
        10,
        "two children recycled",
    )
    assert counters['jobtui_worker_children{state="busy"}'] == 0


def test_a_child_over_its_memory_when_its_job_returns_is_replaced_and_the_job_done(
    db: Conn, dsn: str, start: Start, events: Path
) -> None:
    port = _free_port()
    limit = 96 << 20
    w = start(
        "W", dsn, "--executor", "process", "--concurrency", "1", "--max-memory-per-child", "96M",
        "--metrics-port", str(port),
    )  # fmt: skip
    # `hog.keeps` crosses the limit only in the last milliseconds of its job, and keeps the
    # memory after it returns. The watch of busy children (every 0.5 s) catches it in those
    # milliseconds about once in a hundred: that attempt fails with its MemoryLimit, as it
    # should, and the test tries again with another job (one attempt each).
    caught = 0
    for _ in range(3):
        hog = enqueue(db, enqueue_call("hog.keeps", {"limit": limit}))
        status = wait_until(
            lambda hog=hog: (s := job_row(db, hog)["status"]) in ("done", "dead") and s, 30, "the job to end", w.log
        )
        if status == "done":
            break
        assert job_row(db, hog)["errors"][0]["error"].startswith("MemoryLimit: "), job_row(db, hog)
        caught += 1
    else:
        raise AssertionError("the busy children's watch caught the job three times in a row")
    row = job_row(db, hog)
    assert (row["attempts"], row["errors"]) == (1, []), row
    [grew] = runs(events, hog)
    assert grew.ended is not None
    w.wait_log(f"handler process {grew.pid} holds ", 5)
    w.wait_log("between jobs, over --max-memory-per-child 96 MiB: replaced", 5)
    wait_until(lambda: not alive(grew.pid), 10, "the child over the limit gone", w.log)
    # The next job gets a new child.
    after = enqueue(db, enqueue_call("sleeper", {"seconds": 0}))
    wait_until(lambda: job_row(db, after)["status"] == "done", 15, "the next job done", w.log)
    [ran] = runs(events, after)
    assert ran.pid != grew.pid
    counters = _metrics(port)
    assert counters['jobtui_worker_children_recycled_total{reason="memory"}'] == 1, counters
    assert counters.get('jobtui_worker_children_killed_total{reason="memory"}', 0) == caught, counters
    assert not any(k.startswith("jobtui_worker_children_died_total") and v for k, v in counters.items()), counters


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_job_claimed_again_waits_for_its_earlier_handler_on_the_same_worker(
    executor: str, db: Conn, dsn: str, start: Start, events: Path, deaths: Deaths
) -> None:
    w = start("W", dsn, "--executor", executor, lease=30.0)
    job_id = enqueue(db, enqueue_call("sleeper", {"seconds": 4, "then": 0.1}))
    wait_until(lambda: runs(events, job_id), 15, "the handler to start", w.log)
    with Client(dsn) as queue:
        # The job is ready again at once, and W (the only worker) claims it back at its next poll.
        assert queue.kill_lease([job_id], actor="test") == [job_id]
    wait_until(lambda: job_row(db, job_id)["status"] == "done", 30, "the job done", w.log)
    found = all_stopped(events, job_id, deaths)
    assert len(found) == 2 and not overlapping(found), found
    row = job_row(db, job_id)
    assert (row["attempts"], row["lease_token"]) == (2, 2), row  # the kill counts, as an operator's kill does
    assert [e["kind"] for e in row["errors"]] == ["lease_killed"], row["errors"]
    if executor == "thread":
        # The thread could not be stopped: the new attempt waited for it to return.
        assert found[0].ended is not None and found[1].started >= found[0].ended
        w.wait_log(f"job {job_id} (sleeper) attempt 2 waits for the handler of its attempt 1", 5)
    else:
        assert found[0].ended is None and found[0].gone is not None and found[1].started >= found[0].gone


def test_a_frozen_workers_handler_process_ends_before_its_lease_could_expire(
    db: Conn, dsn: str, start: Start, events: Path, deaths: Deaths
) -> None:
    port = _free_port()
    x = start("X", dsn, "--executor", "process", "--metrics-port", str(port))
    job_id = enqueue(db, enqueue_call("sleeper", {"seconds": 15, "then": 0.1}))
    [first] = wait_until(lambda: runs(events, job_id), 15, "X to start the job", x.log)
    x.signal(signal.SIGSTOP)  # X cannot stop its child now; the child must stop itself
    frozen = time.monotonic()
    try:
        y = start("Y", dsn, "--executor", "process")
        wait_until(lambda: runs(events, job_id)[1:], 20, "Y to run the job after its reaper took it", y.log)
        found = runs(events, job_id, deaths)
        assert found[0].gone is not None and found[0].gone - frozen < LEASE + 0.5, found
        assert not overlapping(found), found
        assert (found[0].pid, found[1].worker) == (first.pid, "Y")
    finally:
        x.signal(signal.SIGCONT)
    wait_until(lambda: job_row(db, job_id)["status"] == "done", 30, "Y to finish the job", y.log)
    x.wait_gave_up(job_id, "sleeper", 10)
    row = job_row(db, job_id)
    assert (row["lease_token"], row["lease_expirations"]) == (2, 1), row  # a frozen worker's lease expires
    # X tells this death from the OOM killer's SIGKILL: the child said why before it died.
    x.wait_log(f"handler process {first.pid} ended itself at its lease's deadline: its worker did not answer", 10)
    counters = _metrics(port)
    deaths_counted = {k: v for k, v in counters.items() if k.startswith("jobtui_worker_children_died_total")}
    assert deaths_counted == {'jobtui_worker_children_died_total{reason="deadline"}': 1}, counters
    assert not any(k.startswith("jobtui_worker_children_killed_total") and v for k, v in counters.items()), counters
    assert "killed by signal 9" not in x.log()
    assert x.proc.poll() is None


def test_a_frozen_workers_own_job_is_released_uncounted_when_its_child_ended_itself(
    db: Conn, dsn: str, start: Start, events: Path, deaths: Deaths
) -> None:
    """Alone, nobody reaps the frozen worker's job: once it wakes it finds its child ended
    at the lease's deadline. The lease failed, not the job: the attempt is not counted."""
    x = start("X", dsn, "--executor", "process")
    job_id = enqueue(db, enqueue_call("sleeper", {"seconds": 3 * LEASE, "then": 0.1}))
    [first] = wait_until(lambda: runs(events, job_id), 15, "X to start the job", x.log)
    x.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: not alive(first.pid), LEASE + 5, "the child to end itself", x.log)
    finally:
        x.signal(signal.SIGCONT)
    wait_until(lambda: job_row(db, job_id)["status"] == "done", 30, "X to run the job again and finish it", x.log)
    found = runs(events, job_id, deaths)
    assert len(found) == 2 and not overlapping(found), found
    row = job_row(db, job_id)
    assert (row["attempts"], row["lease_token"], row["lease_expirations"]) == (1, 2, 0), row
    assert [e["kind"] for e in row["errors"]] == ["abandoned"], row["errors"]


# -- outages longer than the lease, a sync handler that only sleeps --------------------------


@dataclass(frozen=True)
class Trial:
    executor: str
    outage: float  # seconds the proxy is cut
    offset: float  # seconds from the handler's start to the cut
    sleep: float  # seconds the handler sleeps

    def __str__(self) -> str:
        return f"{self.executor}-{self.outage:g}s-at{self.offset:g}s-sleep{self.sleep:g}s"


def _trial(trial: Trial, db: Conn, dsn: str, proxy: Proxy, start: Start, events: Path, deaths: Deaths) -> None:
    w = start("W", proxy.dsn(dsn), "--executor", trial.executor, "--concurrency", "2")
    # A later attempt (a stopped process's job, run again) is short: only the first can overlap.
    job_id = enqueue(db, enqueue_call("sleeper", {"seconds": trial.sleep, "then": 1.0}))
    wait_until(lambda: runs(events, job_id), 15, "the handler to start", w.log)
    outage_into_a_job(trial.offset, trial.outage, proxy.cut, proxy.restore)
    wait_until(lambda: job_row(db, job_id)["status"] == "done", 60, "the job done after the outage", w.log)
    found = all_stopped(events, job_id, deaths)
    row = job_row(db, job_id)
    detail = f"{found}\n{row}\n{w.log()}"
    assert not overlapping(found), f"two attempts ran at once: {detail}"
    # No attempt counted, no lease expired; the outage cost time only.
    assert (row["attempts"], row["lease_expirations"]) == (1, 0), detail
    assert db.execute("SELECT count(*) FROM jobtui.lease_expiry").fetchone() == (0,)
    if trial.executor == "process":
        # The process was stopped before the lease could expire and the job handed back
        # (uncounted) once it was gone; each attempt that was stopped never logged its end.
        assert found[-1].ended is not None, detail
        for run in found[:-1]:
            assert run.ended is None and run.gone is not None, detail
        assert [e["kind"] for e in row["errors"]] == ["abandoned"] * (len(found) - 1), detail
    else:
        # The thread could not be stopped: the job stayed running under this worker, which
        # never started it again meanwhile; its thread came back and its outcome was written.
        assert len(found) == 1 and found[0].ended is not None, detail
        assert (row["lease_token"], row["errors"]) == (1, []), detail
    assert w.proc.poll() is None


SHORT_TRIALS = [Trial("process", 2.5 * LEASE, 0.5, 4 * LEASE), Trial("thread", 2.5 * LEASE, 0.5, 4 * LEASE)]


def _slow_trials(n: int = 20, seed: int = 27) -> list[Trial]:
    rng = random.Random(seed)
    trials = []
    for executor in ("process", "thread"):
        # The outage ends at times the link's back-off is long, and the handler ends before,
        # during or after the outage.
        trials.append(Trial(executor, 12.0, 1.0, 9.0))
        while len(trials) % n:
            trials.append(
                Trial(
                    executor,
                    round(rng.uniform(2 * LEASE, 6 * LEASE), 1),
                    round(rng.uniform(0.1, 2.0), 1),
                    round(rng.uniform(5.5, 10.0), 1),
                )
            )
    return trials


@pytest.mark.parametrize("trial", SHORT_TRIALS, ids=str)
def test_an_outage_longer_than_the_lease_runs_a_sleeping_sync_handler_once_at_a_time(
    trial: Trial, db: Conn, dsn: str, proxy: Proxy, start: Start, events: Path, deaths: Deaths
) -> None:
    _trial(trial, db, dsn, proxy, start, events, deaths)


@pytest.mark.slow
@pytest.mark.parametrize("trial", _slow_trials(), ids=str)
def test_outage_trials_of_a_sleeping_sync_handler(
    trial: Trial, db: Conn, dsn: str, proxy: Proxy, start: Start, events: Path, deaths: Deaths
) -> None:
    _trial(trial, db, dsn, proxy, start, events, deaths)


# -- shutdown -------------------------------------------------------------------------------


def test_sigterm_stops_the_handler_processes_and_releases_their_jobs(
    db: Conn, dsn: str, start: Start, events: Path
) -> None:
    w = start("W", dsn, "--executor", "process", "--shutdown-timeout", "1s", lease=5.0)
    job_id = enqueue(db, enqueue_call("sleeper", {"seconds": 60}))
    [run] = wait_until(lambda: runs(events, job_id), 15, "the handler to start", w.log)
    w.signal(signal.SIGTERM)
    assert w.wait_exit(15) == 0, w.log()
    assert not alive(run.pid)
    row = job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("ready", 0), row
    assert [e["kind"] for e in row["errors"]] == ["shutdown"]
    # Nothing of the pool is left behind.
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == w.pid]
    assert leftover == [], leftover


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None
