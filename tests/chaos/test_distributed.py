"""Distributed faults against real worker and scheduler processes and real PostgreSQL.

* A worker in a network namespace of its own, reaching PostgreSQL over a veth pair, is cut
  off mid-job (the link taken down: its packets vanish, no connection is reset) until its
  leases expired and another worker took its jobs; then the link comes back and the cut-off
  worker wakes up with stale leases. Its effect is refused, its late outcome discarded or
  rejected, nothing is lost, duplicated or overwritten, and it goes on working.
* Workers whose clocks are hours off (libfaketime) run jobs, hold leases and retry with
  backoff by the database's clock, and their schedulers fire every slot once.
* Schedulers killed and restarted at random during a per-second schedule: one job per slot,
  and slots missed only while every instance was down, counted on the schedule row.

Traffic goes to loopback and to the /30 of the veth pair created here; every process,
namespace and interface created is removed at the end, whatever happened.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.core import scheduler as sched
from jobtui.core.jobs import enqueue, enqueue_call
from jobtui.core.registry import ScheduleSpec
from tests.apps.chaos_app import effect_key
from tests.chaos.harness import Proc, Procs, worker_args
from tests.proxy import Proxy
from tests.waits import hold, wait_until
from tests.workers import nothing_in_flight, scheduler_started

Conn = psycopg.Connection[Any]
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
WORKER_FLAGS = ["--no-scheduler", "--poll", "0.5s"]


def add(db: Conn, job_type: str, payload: Any = None, **kwargs: Any) -> int:
    return enqueue(db, enqueue_call(job_type, payload or {}, **kwargs))


def row(db: Conn, job_id: int) -> dict[str, Any]:
    """The whole job row, to compare before and after a write that must not happen."""
    found = db.execute("SELECT to_jsonb(j) FROM jobtui.job j WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return dict(found[0])


def attempts(db: Conn, job_id: int, event: str = "start") -> list[tuple[int, str]]:
    """(token, worker) of each attempt of `job_id` that logged `event`, in order."""
    rows = db.execute(
        "SELECT token, worker FROM chaos_attempt WHERE job_id = %s AND event = %s ORDER BY id", (job_id, event)
    ).fetchall()
    return [(int(r[0]), str(r[1])) for r in rows]


def effects(db: Conn, job_id: int) -> list[tuple[int, str, int, str]]:
    """(token, worker, token the row had, status the row had) of each effect of `job_id`."""
    rows = db.execute(
        "SELECT token, worker, seen_token, seen_status FROM chaos_effect WHERE job_id = %s ORDER BY id", (job_id,)
    ).fetchall()
    return [(int(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in rows]


def status(db: Conn, job_id: int) -> str:
    return str(row(db, job_id)["status"])


# -- (a) a worker cut off from PostgreSQL by a network partition ----------------------------------


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


@dataclass
class Netns:
    name: str
    host_if: str
    host_addr: str
    ns_addr: str

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def link(self, up: bool) -> None:
        done = ip("link", "set", self.host_if, "up" if up else "down")
        assert done.returncode == 0, done.stderr


def _free_subnet() -> int:
    """A /30 of 10.200.0.0/16 that no interface uses (the third and fourth octet's base)."""
    used = ip("-o", "-4", "addr", "show").stdout
    rng = random.Random(os.getpid())
    for _ in range(50):
        base = rng.randrange(0, 65536, 4)
        hosts = [f"10.200.{base // 256}.{base % 256 + n}/" for n in (1, 2)]
        if not any(h in used for h in hosts):
            return base
    pytest.skip("no free /30 in 10.200.0.0/16 for the test's veth pair")


@pytest.fixture
def netns() -> Iterator[Netns]:
    """A network namespace joined to this one by a veth pair with a /30 of 10.200.0.0/16."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace needs root and iproute2 (ip netns)")
    tag = f"{os.getpid() % 100000}"
    base = _free_subnet()
    prefix = f"10.200.{base // 256}"
    ns = Netns(f"jtchaos{tag}", f"jth{tag}", f"{prefix}.{base % 256 + 1}", f"{prefix}.{base % 256 + 2}")
    ns_if = f"jtn{tag}"
    added = ip("netns", "add", ns.name)
    if added.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {added.stderr.strip()}")
    try:
        steps = [
            ("link", "add", ns.host_if, "type", "veth", "peer", "name", ns_if, "netns", ns.name),
            ("addr", "add", f"{ns.host_addr}/30", "dev", ns.host_if),
            ("link", "set", ns.host_if, "up"),
            ("-n", ns.name, "addr", "add", f"{ns.ns_addr}/30", "dev", ns_if),
            ("-n", ns.name, "link", "set", ns_if, "up"),
            ("-n", ns.name, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = ip(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot set up the veth pair (ip {' '.join(step)}): {done.stderr.strip()}")
        yield ns
    finally:
        # Only processes of this test live in the namespace; they are killed by their fixture
        # first, this is in case one escaped it.
        for pid in ip("netns", "pids", ns.name).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        ip("link", "del", ns.host_if)
        ip("netns", "del", ns.name)


@pytest.fixture
def relay(netns: Netns, server_dsn: str) -> Iterator[Proxy]:
    """A relay from the host end of the veth pair to the server, which listens on loopback
    only: rather than change its listen_addresses (a restart) and pg_hba.conf for the test,
    the worker in the namespace connects to this, over the veth pair. Cutting the link leaves
    both ends of every connection open with nothing getting through, as a real partition does."""
    with Proxy(server_dsn, host=netns.host_addr) as forwarder:
        yield forwarder


def test_partitioned_worker_comes_back_to_stale_leases(
    netns: Netns, relay: Proxy, db: Conn, chaos_dsn: str, procs: Procs
) -> None:
    # (Fixtures in this order: the processes are killed before the relay and the namespace go.)
    params = conninfo_to_dict(chaos_dsn)
    params.pop("hostaddr", None)
    remote_dsn = make_conninfo("", **{**params, "host": netns.host_addr, "port": str(relay.port)})
    a = procs.start(
        "A",
        worker_args("A", lease=2, concurrency=2, extra=WORKER_FLAGS),
        env={"JOBTUI_DSN": remote_dsn},
        prefix=netns.exec_prefix(),
    )
    wait_until(lambda: "worker A started" in a.log() or not a.alive(), 20, "worker A to start", a.log)
    assert a.alive(), a.log()
    # Cut off before its effect: A's attempt 1 sleeps 3 s first; B's attempt 2 sleeps 6 s,
    # so that A comes back while B holds the job and has not done the effect yet.
    before = add(db, "chaos.sync", {"before": [3, 6]})
    # Cut off after its effect, before its outcome: A's attempt sleeps 3 s after the effect.
    after = add(db, "chaos.async", {"after": [3]})
    wait_until(lambda: attempts(db, before) and effects(db, after), 10, "A to start both jobs", a.log)

    netns.link(up=False)
    cut = time.monotonic()
    try:
        b = procs.start("B", worker_args("B", lease=2, concurrency=2, extra=WORKER_FLAGS))
        # B's reaper takes both jobs back once A's leases expired (A cannot heartbeat), and B runs them.
        wait_until(
            lambda: len(attempts(db, before)) == 2 and len(attempts(db, after)) == 2,
            20,
            "B to re-claim both jobs",
            b.log,
        )
        assert time.monotonic() - cut >= 2, "re-claimed before the lease could have expired"
    finally:
        netns.link(up=True)
    assert attempts(db, before) == [(1, "A"), (2, "B")] and attempts(db, after) == [(1, "A"), (2, "B")]

    wait_until(lambda: status(db, before) == status(db, after) == "done", 30, "both jobs done by B", b.log)
    done = {job_id: row(db, job_id) for job_id in (before, after)}
    # A wakes up with stale leases: its late effect is refused and its outcomes are not written.
    gave_up = [
        f"job {before} (chaos.sync) attempt 1: its lease was not extended in time",
        f"job {after} (chaos.async) attempt 1: its lease was not extended in time",
    ]
    wait_until(lambda: all(line in a.log() for line in gave_up), 40, "A to give up its stale jobs", a.log)
    # Anything A still had in flight has ended and tried to write, which must change nothing.
    wait_until(nothing_in_flight(db, "A"), 20, "A's row in the fleet: nothing in flight", a.log)
    for job_id in (before, after):
        now = row(db, job_id)
        assert now == done[job_id], f"job {job_id} was overwritten after it was done"
        assert (now["status"], now["locked_by"], now["attempts"], now["lease_expirations"]) == ("done", "B", 2, 1)
    expiries = db.execute("SELECT job_id, worker, attempt FROM jobtui.lease_expiry ORDER BY job_id").fetchall()
    assert sorted(expiries) == sorted([(before, "A", 1), (after, "A", 1)])
    # Each effect exactly once, done under the lease current at the time: B's for the job A
    # was cut off before its effect, A's own for the job it was cut off after.
    assert effects(db, before) == [(2, "B", 2, "running")]
    assert effects(db, after) == [(1, "A", 1, "running")]
    assert db.execute("SELECT count(*) FROM jobtui.effect").fetchone() == (2,)
    assert attempts(db, before, "end") == [(2, "B")]

    # A reconnected by itself and goes on working once B is gone.
    assert a.alive(), a.log()
    b.terminate()
    late = add(db, "chaos.async", {})
    wait_until(lambda: status(db, late) == "done", 40, "A to run a job after the partition", a.log)
    assert attempts(db, late) == [(1, "A")] and len(effects(db, late)) == 1
    assert effect_key(late) in {r[0] for r in db.execute("SELECT key FROM jobtui.effect")}


# -- (b) workers whose clocks are hours off --------------------------------------------------------


def db_now(db: Conn) -> datetime:
    found = db.execute("SELECT clock_timestamp()").fetchone()
    assert found is not None
    return found[0]  # type: ignore[no-any-return]


def add_schedule(dsn: str, name: str, missed: str = "once", grace: float = 30.0) -> int:
    spec = ScheduleSpec(name, "* * * * * *", "chaos.tick", payload={}, offset=0.0, missed=missed, grace=grace)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sched.upsert(conn, spec, source="cli")


def slot_jobs(db: Conn, schedule_id: int) -> list[tuple[datetime, datetime]]:
    """(slot, run_at) of every job the schedule's slots enqueued, by slot."""
    prefix = f"schedule:{schedule_id}:"
    rows = db.execute(
        "SELECT idempotency_key, run_at FROM jobtui.job WHERE idempotency_key LIKE %s", (prefix + "%",)
    ).fetchall()
    return sorted((datetime.fromisoformat(str(key)[len(prefix) :]), run_at) for key, run_at in rows)


def schedule_row(db: Conn, schedule_id: int) -> dict[str, Any]:
    found = db.execute("SELECT to_jsonb(s) FROM jobtui.schedule s WHERE id = %s", (schedule_id,)).fetchone()
    assert found is not None
    return dict(found[0])


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason=f"libfaketime is not installed ({LIBFAKETIME})")
def test_workers_with_clocks_hours_off_go_by_the_database_clock(db: Conn, chaos_dsn: str, procs: Procs) -> None:
    skews = {"minus3h": timedelta(hours=-3), "plus5h": timedelta(hours=5)}
    workers = {}
    for name, skew in (("minus3h", "-3h"), ("plus5h", "+5h")):
        env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": skew}
        # With their schedulers (no --no-scheduler): slots come from the database's clock too.
        workers[name] = procs.start(name, worker_args(name, lease=2, concurrency=3, extra=["--poll", "0.5s"]), env=env)
    for name, proc in workers.items():
        wait_until(lambda p=proc: f"worker {p.name} started" in p.log() or not p.alive(), 20, name, proc.log)
        assert proc.alive(), proc.log()
    started = db_now(db)
    tick = add_schedule(chaos_dsn, "skewed-tick")

    flaky = add(db, "chaos.async", {"fail_first": True})  # retried after a backoff of 0.15-0.25 s
    poison = add(db, "chaos.poison")  # 3 attempts, backoff 0.075-0.2 s, then dead

    # Each worker shows its clock next to the database's (bounded: a probe at a time).
    def probed() -> set[str]:
        return {str(r[0]) for r in db.execute("SELECT DISTINCT worker FROM chaos_clock")}

    def probe() -> bool:
        if probed() == set(workers):
            return True
        add(db, "chaos.clock", {"after": 0.2})
        return False

    wait_until(probe, 20, "both workers to run a clock probe", every=0.25)
    for worker, local_at, db_at in db.execute("SELECT worker, local_at, db_at FROM chaos_clock"):
        assert abs((local_at - db_at) - skews[worker]) < timedelta(minutes=2), (worker, local_at, db_at)

    # 2.5 leases: heartbeats must hold them. Enqueued now: the probes above may take longer
    # than the jobs run, and their heartbeats are read while they run.
    long = [add(db, "chaos.sync", {"after": 5}) for _ in range(2)]

    # While the long jobs run, their leases run by the database's clock: neither expired at
    # once (-3h) nor hours long (+5h).
    def leases() -> list[tuple[float, float]]:
        return [
            (float(r[0]), float(r[1]))
            for r in db.execute(
                "SELECT extract(epoch FROM locked_until - now()), extract(epoch FROM now() - heartbeat_at)"
                " FROM jobtui.job WHERE id = ANY(%s) AND status = 'running' AND heartbeat_at > started_at",
                (long,),
            )
        ]

    held = wait_until(lambda: len(leases()) == 2 and leases(), 10, "a heartbeat on both long jobs")
    for left, since_heartbeat in held:
        assert 0 < left <= 2.05 and 0 <= since_heartbeat < 1.5, held

    ids = [*long, flaky, poison]
    wait_until(
        lambda: [status(db, j) for j in ids] == ["done", "done", "done", "dead"],
        20,
        "every job finished",
        lambda: "\n".join(p.log() for p in workers.values()),
    )
    ended = db_now(db)
    for job_id in long:
        done = row(db, job_id)
        assert (done["attempts"], done["lease_expirations"]) == (1, 0), done
    assert db.execute("SELECT count(*) FROM jobtui.lease_expiry").fetchone() == (0,)

    # Backoff by the database's clock: the next attempt starts a backoff after the failure,
    # not at once (-3h) and not hours later (+5h).
    def gaps(job_id: int) -> list[float]:
        rows = db.execute("SELECT at FROM chaos_attempt WHERE job_id = %s AND event = 'start' ORDER BY id", (job_id,))
        at = [r[0] for r in rows]
        return [(b - a).total_seconds() for a, b in itertools.pairwise(at)]

    assert len(gaps(flaky)) == 1 and 0.15 <= gaps(flaky)[0] < 3, gaps(flaky)
    assert len(gaps(poison)) == 2 and all(0.07 <= g < 3 for g in gaps(poison)), gaps(poison)
    assert row(db, poison)["attempts"] == 3 and len(effects(db, poison)) == 0
    assert [len(effects(db, j)) for j in [*long, flaky]] == [1, 1, 1]
    # Every time the queue wrote is the database's: none hours away.
    window = (started - timedelta(seconds=1), ended + timedelta(seconds=1))
    for job_id in ids:
        job = row(db, job_id)
        times = [job["run_at"], job["started_at"], job["finished_at"], *[e["at"] for e in job["errors"]]]
        assert all(window[0] <= ts(t) <= window[1] for t in times), job

    # The skewed schedulers fired every slot once, at its time by the database's clock.
    fired = slot_jobs(db, tick)
    slots = [s for s, _ in fired]
    assert len(slots) >= 5 and all(s == run_at for s, run_at in fired), fired
    assert all((b - a) == timedelta(seconds=1) for a, b in itertools.pairwise(slots)), slots
    assert window[0] <= slots[0] and slots[-1] <= window[1] + timedelta(seconds=1), (window, slots)
    assert schedule_row(db, tick)["missed_count"] == 0
    for proc in workers.values():
        assert "lease expired" not in proc.log() and proc.alive(), proc.log()


# -- (c) schedulers killed and restarted at random --------------------------------------------------


def test_schedulers_killed_at_random_fire_each_slot_once_and_count_the_missed(
    db: Conn, chaos_dsn: str, procs: Procs
) -> None:
    rng = random.Random()
    generation = itertools.count(1)
    slots: list[Proc | None] = [None, None, None]
    every: list[Proc] = []

    def spawn(i: int) -> None:
        proc = procs.start(f"s{i}.{next(generation)}", ["scheduler"])
        slots[i] = proc
        every.append(proc)

    def kill(i: int) -> None:
        proc = slots[i]
        assert proc is not None
        proc.kill()
        slots[i] = None

    for i in range(len(slots)):
        spawn(i)
    for proc in every:
        wait_until(
            lambda p=proc: scheduler_started(p.log()) or not p.alive(),
            20,
            "schedulers to start",
            proc.log,
        )
    # A grace of 2.5 s: a slot is missed once every instance was down for longer (and a busy
    # machine's late tick, an instance killed just before its tick, stay within it).
    grace = timedelta(seconds=2.5)
    schedule_id = add_schedule(chaos_dsn, "chaos-tick", grace=grace.total_seconds())
    created = ts(schedule_row(db, schedule_id)["last_slot"])

    start = time.monotonic()
    duration = 20.0
    # Twice, every instance down for longer than the grace: slots must be missed.
    outages = [(5.0, 5.0), (12.0, 5.0)]
    assert all(length > grace.total_seconds() + 2 for _, length in outages)
    outage_walls: dict[float, float] = {}  # outage start offset -> wall time it began
    respawn: dict[int, float] = {}
    next_event = start + rng.uniform(0.3, 1.2)
    kills = 0
    while (now := time.monotonic()) < start + duration:
        elapsed = now - start
        outage = next(((a, b) for a, b in outages if a <= elapsed < a + b), None)
        if outage is not None:
            outage_walls.setdefault(outage[0], time.time())
            for i, running in enumerate(slots):
                if running is not None:
                    kill(i)
                    kills += 1
            respawn = {i: start + outage[0] + outage[1] + rng.uniform(0, 0.5) for i in range(len(slots))}
        else:
            for i, when in list(respawn.items()):
                if now >= when:
                    del respawn[i]
                    spawn(i)
            live = [i for i, p in enumerate(slots) if p is not None]
            if now >= next_event and live:
                # SIGKILL one, possibly the last one up, and bring it back a little later.
                i = rng.choice(live)
                kill(i)
                kills += 1
                respawn[i] = now + rng.uniform(0.2, 1.5)
                next_event = now + rng.uniform(0.3, 1.2)
        hold(0.02, "the loop's tick: its kills and respawns fall due on the clock")
    for i, running in enumerate(slots):
        if running is not None:
            kill(i)
    assert kills >= 8

    # Down windows: when no instance process was alive (from our own spawns and kills).
    spans = sorted((p.started_at, p.ended_at or time.time()) for p in every)
    down: list[tuple[float, float]] = []
    covered = spans[0][1]
    for begin, end in spans[1:]:
        if begin > covered:
            down.append((covered, begin))
        covered = max(covered, end)

    schedule = schedule_row(db, schedule_id)
    last_slot = ts(schedule["last_slot"])
    print(f"{kills} kills, {len(every)} instances, all down for {[round(b - a, 1) for a, b in down]} s")
    fired = slot_jobs(db, schedule_id)
    fired_slots = [s for s, _ in fired]
    # A slot's job was enqueued in the tick whose now() is its created_at: past the grace, the
    # slot was missed and the policy (once) fired it late, the latest of its outage.
    enqueued_at = {
        datetime.fromisoformat(str(key).split(":", 2)[2]): at
        for key, at in db.execute(
            "SELECT idempotency_key, created_at FROM jobtui.job WHERE idempotency_key LIKE %s",
            (f"schedule:{schedule_id}:%",),
        ).fetchall()
    }
    backfilled = sorted(s for s in fired_slots if enqueued_at[s] - s > grace)
    # One job per slot, at the slot's time.
    assert len(set(fired_slots)) == len(fired_slots) and all(s == run_at for s, run_at in fired)
    assert len({run_at for _, run_at in fired}) == len(fired)
    # Every slot from the schedule's creation to the last handled one: fired, or counted missed.
    universe = []
    slot = created.replace(microsecond=0) + timedelta(seconds=1)
    while slot <= last_slot:
        universe.append(slot)
        slot += timedelta(seconds=1)
    assert set(fired_slots) <= set(universe), (fired_slots, universe)
    unfired = set(universe) - set(fired_slots)
    missed = sorted(unfired | set(backfilled))
    assert len(universe) >= duration - 2, (created, last_slot)
    assert schedule["missed_count"] == len(missed), (schedule, missed)
    assert schedule["backfilled_count"] == len(backfilled), (schedule, backfilled)
    assert [ts(s) for s in schedule["missed_slots"]] == missed[-20:]
    # Missed only while every instance was down (an instance killed just before its tick
    # leaves its slot to the next one up: 1.5 s of slack before a window; an instance spawned
    # at a window's end ticks only once its interpreter has started and connected, up to 2 s
    # on a loaded machine, and may be killed again before: 2 s of slack after it).
    print(f"{len(universe)} slots: {len(fired_slots)} fired, {len(missed)} missed ({schedule['missed_count']} counted)")
    for s in missed:
        t = s.timestamp()
        assert any(a - 1.5 <= t <= b + 2.0 for a, b in down), (s, down)
    # And each forced outage did miss slots, which shows the policy ran and was counted.
    for a, length in outages:
        begin = outage_walls[a]
        assert any(begin - 1.5 <= s.timestamp() <= begin + length for s in missed), (a, missed)
