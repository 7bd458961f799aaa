"""Real `jobtui worker` processes for tests, and polling with a deadline.

worker = WorkerProcess("A", ["--lease", "2s"], env, tmp_path / "A.log", app="tests.apps.worker_app:jobs")
worker.wait_started()
wait_until(lambda: done(job_id), 10, "the job done", worker.log)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[1]

# What the test apps record: each run of a handler, and each effect (no unique key, so that
# a duplicated effect would show as two rows).
APP_TABLES = """
CREATE TABLE run_log (
    id bigserial PRIMARY KEY, job_id bigint, attempt int, worker text, event text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE effect_log (id bigserial PRIMARY KEY, key text NOT NULL, job_id bigint, attempt int, worker text);
"""


# Gates of the test apps: advisory lock keys, apart from any lock jobtui takes.
_GATES = itertools.count(0x6A7B0000)


def close_gate(conn: Any) -> int:
    """A gate, closed: its key, an advisory lock held on `conn` (an autocommit connection to
    the app's database), which a handler given the key waits for until `open_gate`."""
    key = next(_GATES)
    conn.execute("SELECT pg_advisory_lock(%s)", (key,))
    return key


def open_gate(conn: Any, key: int) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def nothing_in_flight(conn: Any, name: str) -> Callable[[], bool]:
    """Whether worker `name`'s row in the fleet, refreshed after this call, counts no job in
    flight: each attempt it had has ended, and its outcome was written or refused (a job
    leaves `in_flight` only then). For a worker that claims nothing meanwhile."""
    since = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    query = "SELECT in_flight = 0 FROM jobtui.fleet WHERE name = %s AND seen_at > %s"
    return lambda: conn.execute(query, (name, since)).fetchone() == (True,)


def scheduler_started(log: str) -> bool:
    """Whether a scheduler's log holds its start line (`scheduler NAME started`)."""
    return re.search(r"scheduler \S+ started", log) is not None


class WorkerProcess:
    """A `jobtui worker` subprocess whose stderr (its log) goes to a file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path, *, app: str) -> None:
        self.name = name
        self.log_path = log_path
        self._log_file = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobtui.cli", "worker", "--app", app, "--id", name, *args],
            cwd=ROOT,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_started(self, timeout: float = 15) -> None:
        wait_until(
            lambda: f"worker {self.name} started" in self.log() or self.proc.poll() is not None,
            timeout,
            f"worker {self.name} to start",
            self.log,
        )
        assert self.proc.poll() is None, f"worker {self.name} exited with {self.proc.returncode}:\n{self.log()}"

    def wait_log(self, text: str, timeout: float) -> None:
        wait_until(lambda: text in self.log(), timeout, f"{text!r} in the log of worker {self.name}", self.log)

    def wait_gave_up(self, job_id: int, job_type: str, timeout: float) -> None:
        """Until the worker says it gave up attempt 1 of a job whose lease it lost while it
        was frozen. Whichever noticed first says it: the lease watch, the heartbeat's answer,
        or the handler's own once(), refused by the database before either looked."""
        head = f"job {job_id} ({job_type}) attempt 1: "
        lines = [f"{head}its lease was not extended in time", f"{head}its lease was lost", f"{head}outcome not written"]
        wait_until(
            lambda: any(line in self.log() for line in lines),
            timeout,
            f"worker {self.name} to give up job {job_id}",
            self.log,
        )

    def claims(self, pool: str = "every queue") -> int:
        """How many claims of `pool`'s producer (a queue, or "every queue") its log tells were
        answered: the DEBUG lines of a worker started with --verbose. A change committed before
        this count was read is seen by claim count + 2 on: claim count + 1 may have been sent
        before, but each next claim is sent after the previous one's line was written."""
        told = re.findall(rf"producer {re.escape(pool)}: claim (\d+) answered", self.log())
        return int(told[-1]) if told else 0

    def wait_claims(self, count: int, timeout: float, pool: str = "every queue") -> None:
        """Until `pool`'s producer has had `count` claims answered (see `claims`)."""
        wait_until(
            lambda: self.claims(pool) >= count,
            timeout,
            f"claim {count} of {pool} by worker {self.name}",
            self.log,
        )

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {self.name} still running after {timeout}s:\n{self.log()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()  # SIGKILL ends a stopped (SIGSTOP) process too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._log_file.close()
