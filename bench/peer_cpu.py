"""CPU time of one peers.py configuration over its drain: its server backends' and its workers'.

A thread samples, every INTERVAL seconds, the utime + stime (from /proc) of

- the server backends connected to the configuration's database, found in pg_stat_activity
  over a connection to another database (so it is not among them), leaving out the bench's
  own connections, which set application_name to OBSERVER; autovacuum workers in that
  database count, the server's shared background processes (WAL writer, checkpointer) do not;
- the configuration's worker processes and their descendants (graphile-worker's: the forked
  workers of drain.mjs, not drain.mjs itself, which enqueues and watches).

Once the drain is over, `used` takes each process's CPU between the last sample at or before
the drain's first start and the first sample at or after its last finish (the database's
timestamps, the rate's own window): a process's last reading is kept once it exits, and a
backend that connects during the drain counts from zero, its whole life being in the drain.
Connections shorter than one interval can be missed. Start-up inside the window (a worker
still loading while the other claims) counts, as it slows that drain.
"""

from __future__ import annotations

import contextlib
import threading
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OBSERVER = "jobtui-bench-observer"
INTERVAL = 0.075
RESCAN = 4  # samples between two searches for the workers' descendants (a scan of all of /proc)
BACKENDS_SQL = """
    SELECT pid FROM pg_stat_activity
    WHERE datname = %s AND application_name IS DISTINCT FROM %s AND pid <> pg_backend_pid()"""


def proc_cpu(pid: int) -> float | None:
    """utime + stime of a process in seconds, or None once it is gone (or not on this machine)."""
    import psutil  # in the project's venv only; peers.py's helpers, in the peers', import this module

    try:
        times = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return float(times.user + times.system)


def is_postgres(pid: int) -> bool:
    """Whether pid is a PostgreSQL process of this machine (the server may be elsewhere)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() in ("postgres", "postmaster")
    except OSError:
        return False


@dataclass
class Series:
    """Readings of a set of processes: sample times, and for each pid its (time, cpu) readings."""

    times: list[float] = field(default_factory=list)
    readings: dict[int, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, at: float, cpu: dict[int, float]) -> None:
        self.times.append(at)
        for pid, seconds in cpu.items():
            self.readings.setdefault(pid, []).append((at, seconds))

    def used(self, start: float, end: float, from_zero: bool) -> float | None:
        """CPU seconds between the samples around [start, end]; from_zero: a process first seen
        inside the window counts from zero (else from its first reading). None: no readings."""
        if not self.readings:
            return None
        t0 = self.times[max(0, bisect_right(self.times, start) - 1)]
        t1 = self.times[min(len(self.times) - 1, bisect_left(self.times, end))]
        total = 0.0
        for readings in self.readings.values():
            inside = [r for r in readings if r[0] <= t1]
            if not inside:
                continue
            before = [cpu for at, cpu in inside if at <= t0]
            base = before[-1] if before else (0.0 if from_zero else inside[0][1])
            total += inside[-1][1] - base
        return total


class Sampler:
    """Samples a configuration's backends and worker processes until stopped (see the module)."""

    def __init__(self, admin_dsn: str, dbname: str, roots: list[int], roots_count: bool = True) -> None:
        self.admin_dsn, self.dbname = admin_dsn, dbname
        self.roots, self.roots_count = roots, roots_count
        self.server, self.workers = Series(), Series()
        self.local_server = False  # whether any backend was readable here
        self._descendants: list[int] = []
        self._samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-cpu", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def worker_pids(self) -> list[int]:
        import psutil

        if self._samples % RESCAN == 0:
            found = set(self._descendants)
            for root in self.roots:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                    found.update(p.pid for p in psutil.Process(root).children(recursive=True))
            self._descendants = sorted(found)
        self._samples += 1
        return self._descendants + (self.roots if self.roots_count else [])

    def _run(self) -> None:
        import psycopg

        conn: Any = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.admin_dsn, autocommit=True, application_name=OBSERVER)
                backends = [int(r[0]) for r in conn.execute(BACKENDS_SQL, (self.dbname, OBSERVER)).fetchall()]
            except psycopg.Error:
                # The shared server may restart; the run is then thrown away, and retried.
                conn, backends = None, []
            self.sample(backends)
            self._stop.wait(INTERVAL)
        self.sample([])  # the last readings of the workers
        if conn is not None:
            conn.close()

    def sample(self, backends: list[int]) -> None:
        at = time.time()  # the server's now() is this machine's clock (a local server)
        server = {}
        for pid in backends:
            if is_postgres(pid) and (cpu := proc_cpu(pid)) is not None:
                server[pid] = cpu
        self.local_server = self.local_server or bool(server)
        workers = {pid: cpu for pid in self.worker_pids() if (cpu := proc_cpu(pid)) is not None}
        self.server.add(at, server)
        self.workers.add(at, workers)

    def per_job(self, start: float, end: float, jobs: int) -> tuple[float | None, float | None]:
        """(server us/job, worker us/job) over the drain window [start, end] (epoch seconds)."""
        if jobs <= 0:
            return None, None
        server = self.server.used(start, end, from_zero=True) if self.local_server else None
        workers = self.workers.used(start, end, from_zero=False)
        return (
            None if server is None else server / jobs * 1e6,
            None if workers is None else workers / jobs * 1e6,
        )
