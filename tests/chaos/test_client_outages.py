"""An application enqueueing through `Client` and `AsyncClient` in a loop (tests/apps/enqueue_loop.py)
while PostgreSQL is stopped for 30 s, and while it is cut off silently: every failed enqueue is
a DatabaseUnavailable raised within the dead-socket bound (at once while the outage is known),
and enqueues succeed again within 2 s of the database's return, without the application doing
anything: the pool's own reconnect back-off does not keep them failing.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import psycopg
import pytest

from jobtui.kernel import migrate
from jobtui.kernel.db import DEAD_SOCKET_SECONDS
from tests.chaos.outages import cut_off_for
from tests.cluster import LocalCluster
from tests.netns import Topology
from tests.waits import hold, wait_until

CLIENTS = ("Client", "AsyncClient")
BACK_WITHIN = 2.0
# Calls of each client begun BACK_WITHIN after the database's return, which must not fail:
# the loop calls every 50 ms, so about half a second of them.
CALLS_AFTER = 10
# A call that finds the outage waits at most the dead-socket bound (a silent one); the load
# of a shared machine gets a second more.
FAIL_WITHIN = DEAD_SOCKET_SECONDS + 1.5


@dataclass(frozen=True)
class Call:
    client: str
    began: float
    ended: float
    ok: bool
    error: str = ""
    message: str = ""


class Loop:
    """The enqueueing application, as a process (in a host namespace when given `prefix`)."""

    def __init__(self, dsn: str, prefix: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "tests.apps.enqueue_loop", dsn, "0.05"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def calls(self) -> list[Call]:
        found = []
        for line in list(self.lines):
            if line.startswith("{"):
                found.append(Call(**json.loads(line)))
        return found

    def log(self) -> str:
        return "".join(self.lines[-80:])

    def succeeded_after(self, moment: float) -> bool:
        return all(any(c.ok and c.ended > moment for c in self.calls() if c.client == k) for k in CLIENTS)

    def called_after(self, moment: float, n: int) -> bool:
        """Whether each client made `n` calls, failed or not, begun after `moment`."""
        return all(len([c for c in self.calls() if c.client == k and c.began > moment]) >= n for k in CLIENTS)

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)


def _check(loop: Loop, back: float, what: str) -> None:
    """Every failure a DatabaseUnavailable within FAIL_WITHIN; enqueues back within 2 s of
    `back`; prints the figures."""
    calls = loop.calls()
    for client in CLIENTS:
        mine = [c for c in calls if c.client == client]
        failed = [c for c in mine if not c.ok]
        assert failed, f"{client} never failed: the outage was not seen\n{loop.log()}"
        others = {(c.error, c.message) for c in failed if c.error != "DatabaseUnavailable"}
        assert not others, f"{client} failed otherwise than with DatabaseUnavailable: {others}"
        took = [c.ended - c.began for c in failed]
        slowest = max(failed, key=lambda c: c.ended - c.began)
        assert max(took) <= FAIL_WITHIN, f"{client}: a failed enqueue took {max(took):.1f}s: {slowest}"
        recovered = min(c.ended for c in mine if c.ok and c.ended > back) - back
        late = [c for c in failed if c.began > back + BACK_WITHIN]
        assert recovered < BACK_WITHIN and not late, (
            f"{client}: enqueues back {recovered:.1f}s after {what}; {len(late)} failed later\n{loop.log()}"
        )
        print(
            f"{what}, {client}: {len(failed)} failures, the slowest {max(took):.2f}s, "
            f"median {statistics.median(took):.3f}s; enqueues back {recovered:.2f}s after the database"
        )


def _recovered(loop: Loop, back: float, what: str) -> None:
    """Until both clients enqueue again after `back`, and each made CALLS_AFTER calls begun
    BACK_WITHIN after it, any of which failing would show a recovery that did not hold."""
    wait_until(lambda: loop.succeeded_after(back), 20, f"enqueues after {what}", loop.log)
    wait_until(lambda: loop.called_after(back + BACK_WITHIN, CALLS_AFTER), 20, f"calls after {what}", loop.log)


def _migrated(cluster: LocalCluster) -> str:
    dsn = cluster.dsn("postgres")
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.migrate(conn)
    return dsn


def test_enqueues_come_back_within_2s_of_a_restart_after_30s_down() -> None:
    with LocalCluster.create() as cluster:
        dsn = _migrated(cluster)
        loop = Loop(dsn)
        try:
            wait_until(lambda: loop.succeeded_after(0), 30, "both clients to enqueue", loop.log)
            cluster.stop()
            hold(30, "the outage")
            back = cluster.start_accepting()
            _recovered(loop, back, "the restart")
        finally:
            loop.stop()
        _check(loop, back, "a restart after 30s down")


@pytest.mark.parametrize("seconds", [15.0, pytest.param(120.0, marks=pytest.mark.slow)])
def test_enqueues_come_back_within_2s_of_a_silent_partitions_heal(seconds: float) -> None:
    with Topology.create(hosts=1) as net:
        assert net.cluster is not None
        _migrated(net.cluster)
        loop = Loop(net.dsn("postgres"), net.exec_prefix(0))
        try:
            wait_until(lambda: loop.succeeded_after(0), 30, "both clients to enqueue", loop.log)
            with cut_off_for(net, 0, seconds):
                pass
            back = time.monotonic()
            _recovered(loop, back, "the heal")
        finally:
            loop.stop()
        _check(loop, back, f"a heal after {seconds:g}s cut off")
