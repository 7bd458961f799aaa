"""A worker cut off by a silent network partition (tests/netns.py: blackhole routes in a
router namespace, both ways) is back within 3 s of the heal, in both executors: it completes
a job of a queue only it serves, no job runs twice because of the heal, nothing is lost, each
effect is done once, and no stale write lands (tests/chaos/partition.py runs and checks it).

The default run keeps one short partition per executor; `-m slow` runs 45 s, 120 s and 300 s,
and bench/partition.py runs any length from the command line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui.core import scheduler as sched
from jobtui.core.jobs import enqueue, enqueue_call
from jobtui.core.registry import ScheduleSpec
from jobtui.kernel import migrate
from tests.apps.chaos_app import APP_TABLES
from tests.chaos.harness import ROOT, Procs, child_env
from tests.chaos.outages import cut_off_for
from tests.chaos.partition import LEASE, run_partition
from tests.netns import Topology
from tests.waits import wait_until
from tests.workers import scheduler_started

Conn = psycopg.Connection[Any]

BACK_WITHIN = 3.0


def _check(seconds: float, executor: str, tmp_path: Path, *, pooler: bool = False) -> None:
    result = run_partition(seconds, executor, log_dir=tmp_path, pooler=pooler)
    assert not result.problems, f"{result.line()}\n--- A ---\n{result.log[-6000:]}"
    assert result.reclaimed_after >= LEASE, result.line()  # B waited for A's leases to expire
    assert result.back_after < BACK_WITHIN, f"{result.line()}\n--- A ---\n{result.log[-6000:]}"
    print(result.line())


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_worker_is_back_within_3s_of_a_partitions_heal(executor: str, tmp_path: Path) -> None:
    _check(15.0, executor, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seconds", [45.0, 120.0, 300.0])
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_long_partitions(seconds: float, executor: str, tmp_path: Path) -> None:
    _check(seconds, executor, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seconds", [15.0, 45.0])
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_partitions_behind_pgbouncer(seconds: float, executor: str, tmp_path: Path) -> None:
    _check(seconds, executor, tmp_path, pooler=True)


# -- a scheduler --------------------------------------------------------------------------------

POLICIES = ("skip", "once", "all")
GRACE = 2.0


def _schedule(dsn: str, policy: str) -> int:
    spec = ScheduleSpec(
        f"tick-{policy}", "* * * * * *", "chaos.tick", payload={}, offset=0.0, missed=policy, grace=GRACE
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sched.upsert(conn, spec, source="cli")


def _slots(db: Conn, schedule_id: int) -> dict[datetime, datetime]:
    """Each slot that has a job, and when the job was enqueued (the database's clock)."""
    prefix = f"schedule:{schedule_id}:"
    rows = db.execute(
        "SELECT idempotency_key, created_at, run_at FROM jobtui.job WHERE idempotency_key LIKE %s", (prefix + "%",)
    ).fetchall()
    found = {}
    for key, created, run_at in rows:
        slot = datetime.fromisoformat(str(key)[len(prefix) :])
        assert run_at == slot, (key, run_at)  # one job per slot, due at its slot
        found[slot] = created
    return found


def _schedule_row(db: Conn, schedule_id: int) -> dict[str, Any]:
    found = db.execute("SELECT to_jsonb(s) FROM jobtui.schedule s WHERE id = %s", (schedule_id,)).fetchone()
    assert found is not None
    return dict(found[0])


def _db_now(db: Conn) -> datetime:
    found = db.execute("SELECT clock_timestamp()").fetchone()
    assert found is not None
    return found[0]  # type: ignore[no-any-return]


def test_a_scheduler_cut_off_counts_the_partitions_slots_by_policy_and_is_back_within_3s(tmp_path: Path) -> None:
    seconds = 10.0
    with Topology.create(hosts=1) as net:
        assert net.cluster is not None
        dsn = net.cluster.dsn("postgres")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.migrate(conn)
        procs = Procs(tmp_path, child_env(dsn))
        try:
            s = procs.start(
                "S", ["scheduler", "-v"], env={"JOBTUI_DSN": net.dsn("postgres")}, prefix=net.exec_prefix(0)
            )
            wait_until(
                lambda: scheduler_started(s.log()) or not s.alive(),
                30,
                "the scheduler to start",
                s.log,
            )
            ids = {policy: _schedule(dsn, policy) for policy in POLICIES}
            with psycopg.connect(dsn, autocommit=True) as db:
                wait_until(lambda: all(len(_slots(db, i)) >= 2 for i in ids.values()), 30, "slots fired", s.log)
                cut_at = _db_now(db)
                with cut_off_for(net, 0, seconds):
                    pass
                healed = _db_now(db)
                created = {p: _schedule_row(db, i)["created_at"] for p, i in ids.items()}

                def fired_after_heal() -> bool:
                    return all(any(c > healed for c in _slots(db, i).values()) for i in ids.values())

                wait_until(fired_after_heal, 20, "the scheduler to fire after the heal", s.log)
                back = min(c for i in ids.values() for c in _slots(db, i).values() if c > healed) - healed
                # Slots past the heal's grace handled: the partition's misses end before them.
                past = healed + timedelta(seconds=GRACE + 1)

                def handled(i: int) -> bool:
                    return datetime.fromisoformat(_schedule_row(db, i)["last_slot"]) >= past

                wait_until(
                    lambda: all(handled(i) for i in ids.values()),
                    20,
                    "the scheduler to handle the slots past the heal's grace",
                    s.log,
                )
                rows = {p: _schedule_row(db, i) for p, i in ids.items()}
                slots = {p: _slots(db, i) for p, i in ids.items()}
        finally:
            procs.close()
    print(f"a scheduler cut off {seconds:g}s: firing again {back.total_seconds():.2f}s after the heal")
    assert back < timedelta(seconds=BACK_WITHIN), (back, s.log())
    grace = timedelta(seconds=GRACE)
    for policy in POLICIES:
        row, fired = rows[policy], slots[policy]
        last = datetime.fromisoformat(row["last_slot"])
        first = datetime.fromisoformat(created[policy]).replace(microsecond=0) + timedelta(seconds=1)
        universe = [first + timedelta(seconds=n) for n in range(int((last - first).total_seconds()) + 1)]
        late = {slot for slot, at in fired.items() if at - slot > grace}
        missed = sorted((set(universe) - set(fired)) | late)
        # Missed only for the partition: from the tick before the cut to the heal, and the
        # scheduler's way back (within 3 s).
        assert missed and all(
            cut_at - timedelta(seconds=1.5) <= m <= healed + timedelta(seconds=BACK_WITHIN) for m in missed
        ), (
            policy,
            missed,
            cut_at,
            healed,
        )
        assert len(missed) >= seconds - GRACE - 1, (policy, missed)
        assert row["missed_count"] == len(missed), (policy, row, missed)
        expected_late = {"skip": 0, "once": 1, "all": len(missed)}[policy]
        assert len(late) == expected_late and row["backfilled_count"] == len(late), (policy, late, row)


# -- the console, in a terminal -----------------------------------------------------------------


class Terminal:
    """A tmux server of the test's own (its socket named after the pid), one pane."""

    def __init__(self, tmp_path: Path) -> None:
        self.socket = str(tmp_path / f"tmux-{os.getpid()}")

    def tmux(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        done = subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=10, env=env)
        return done.stdout

    def screen(self) -> str:
        """The pane with its colours (SGR sequences)."""
        return self.tmux("capture-pane", "-p", "-e", "-t", "console")

    def close(self) -> None:
        self.tmux("kill-server")


# The console's alarm line is white on red (header.ALARM): tmux writes its background as
# one of these.
_RED = re.compile(r"\x1b\[[0-9;]*(?:41|48;5;(?:1|9|124|160|196)|48;2;(?:1[5-9]\d|2\d\d);\d{1,2};\d{1,2})[;m]")


def _alarm(screen: str) -> bool:
    """The header's red line is on the screen: a line saying so, drawn on red."""
    return any(("NOT ANSWERING" in line or "UNREACHABLE" in line) and _RED.search(line) for line in screen.splitlines())


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: apt-get install -y tmux")
def test_the_consoles_header_turns_red_when_cut_off_and_clears_within_2s_of_the_heal(tmp_path: Path) -> None:
    with Topology.create(hosts=1) as net:
        assert net.cluster is not None
        dsn = net.cluster.dsn("postgres")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.migrate(conn)
            conn.execute(APP_TABLES)
        term = Terminal(tmp_path)
        # The console with an embedded worker, both across the router.
        command = " ".join(
            [*net.exec_prefix(0), sys.executable, "-m", "jobtui.cli", "--work", "tests.apps.chaos_app:jobs"]
        )
        try:
            term.tmux(
                "-f", "/dev/null", "new-session", "-d", "-s", "console", "-x", "140", "-y", "40",
                "-c", str(ROOT), "-e", f"JOBTUI_DSN={net.dsn('postgres')}", "-e", f"PYTHONPATH={ROOT}",
                f"unset COLUMNS LINES; exec {command}",
            )  # fmt: skip
            with psycopg.connect(dsn, autocommit=True) as db:
                first = enqueue(db, enqueue_call("chaos.sync", {}))
                wait_until(lambda: _status(db, first) == "done", 30, "the embedded worker to run a job", term.screen)
                wait_until(
                    lambda: "ready" in term.screen() and not _alarm(term.screen()), 20, "a calm header", term.screen
                )
                with cut_off_for(net, 0, 10) as cut:
                    wait_until(lambda: _alarm(term.screen()), 10, "the red header", term.screen)
                    red_after = time.monotonic() - cut
                healed = time.monotonic()
                wait_until(lambda: not _alarm(term.screen()), 10, "the header to clear", term.screen)
                cleared_after = time.monotonic() - healed
                late = enqueue(db, enqueue_call("chaos.sync", {}))
                wait_until(lambda: _status(db, late) == "done", 10, "the embedded worker after the heal", term.screen)
                worker_after = time.monotonic() - healed
        finally:
            term.close()
    print(
        f"the console cut off 10s: red after {red_after:.1f}s, clear {cleared_after:.1f}s after the heal,"
        f" its worker's job done {worker_after:.1f}s after"
    )
    assert red_after <= 3.0 + 0.5, red_after  # header.HUNG_AFTER and a refresh: red within 3 s
    assert cleared_after < 2.0, cleared_after
    assert worker_after < BACK_WITHIN, worker_after  # a job enqueued once the header cleared


def _status(db: Conn, job_id: int) -> str:
    found = db.execute("SELECT status FROM jobtui.job WHERE id = %s", (job_id,)).fetchone()
    return str(found[0]) if found else ""
