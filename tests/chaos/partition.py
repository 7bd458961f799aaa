"""A worker cut off from PostgreSQL by a silent network partition, and what it does after the
heal: the run behind tests/chaos/test_partitions.py and bench/partition.py.

Worker A runs in a host namespace of tests/netns.py and reaches the cluster across the
router; worker B runs beside the database. A serves the queues `default` (with B) and `own`
(alone). Once A holds HELD running jobs of `default` (lease LEASE), the router drops every
packet to and from A for `seconds`; B's reaper takes A's jobs back once their leases expired
and B runs them. Then the router lets A's packets through and JOBS jobs are enqueued in `own`,
which only A serves.

What is measured and checked (Result): when A completed its first job of `own` after the
heal; that no job ran twice because of the heal (each job of `own` started once: a handler
logs every start, so a job handed back unstarted leaves no trace); that nothing is lost (every
job done); that each effect is done once (job.once(), counted rows) under the lease current
then; and that no stale write lands (the rows of A's old jobs, done by B, stay as B wrote them
after A is back).

    result = run_partition(20.0, "thread", log_dir=tmp_path)
    assert result.back_after < 3 and not result.problems
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from jobtui.core.jobs import enqueue, enqueue_call
from jobtui.kernel import migrate
from tests.apps.chaos_app import APP_TABLES
from tests.chaos.harness import Proc, Procs, child_env, worker_args
from tests.chaos.outages import cut_off_for
from tests.netns import Topology
from tests.topology import PgBouncer
from tests.waits import wait_until
from tests.workers import nothing_in_flight

LEASE = 3.0
HELD = 4
JOBS = 5
OWN = "own"
Conn = psycopg.Connection[Any]


@dataclass
class Result:
    """What one partition did; `problems` lists what broke a promise, in words."""

    seconds: float
    executor: str
    reclaimed_after: float = 0.0  # B re-claimed A's jobs, seconds after the cut
    back_after: float = 0.0  # A completed its first job of `own`, seconds after the heal
    all_done_after: float = 0.0  # every job of `own` done, seconds after the heal
    started_twice: dict[int, int] = field(default_factory=dict)  # job of `own`: its starts
    handed_back: int = 0  # A's log lines of claims handed back unstarted
    problems: list[str] = field(default_factory=list)
    log: str = ""  # A's log

    def line(self) -> str:
        twice = sum(1 for n in self.started_twice.values() if n > 1)
        return (
            f"partition {self.seconds:g}s, {self.executor}: B re-claimed after {self.reclaimed_after:.1f}s; "
            f"A back {self.back_after:.1f}s after the heal (all {JOBS} done after {self.all_done_after:.1f}s); "
            f"{twice} of {JOBS} started twice; {self.handed_back} handed back unstarted; "
            f"{'ok' if not self.problems else 'PROBLEMS: ' + '; '.join(self.problems)}"
        )


def _db(net: Topology) -> str:
    assert net.cluster is not None
    dsn = net.cluster.dsn("postgres")
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.migrate(conn)
        conn.execute(APP_TABLES)
    return dsn


def _starts(db: Conn, job_id: int) -> list[str]:
    rows = db.execute(
        "SELECT worker FROM chaos_attempt WHERE job_id = %s AND event = 'start' ORDER BY id", (job_id,)
    ).fetchall()
    return [str(r[0]) for r in rows]


def _row(db: Conn, job_id: int) -> dict[str, Any]:
    found = db.execute("SELECT to_jsonb(j) FROM jobtui.job j WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return dict(found[0])


def _db_seconds(db: Conn) -> float:
    found = db.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert found is not None
    return float(found[0])


@dataclass
class World:
    net: Topology
    dsn: str  # the database, from the test
    procs: Procs
    remote: dict[str, str]  # the environment of a worker in the host: where it connects


@contextlib.contextmanager
def _world(log_dir: Path, pooler: bool) -> Iterator[World]:
    with Topology.create(hosts=1) as net:
        dsn = _db(net)
        procs = Procs(log_dir, child_env(dsn))
        remote = {"JOBTUI_DSN": net.dsn("postgres")}
        with contextlib.ExitStack() as stack:
            if pooler:
                assert net.cluster is not None
                bouncer = stack.enter_context(
                    PgBouncer.start(
                        upstream_port=net.cluster.port,
                        pool_size=20,
                        listen_addr=f"127.0.0.1,{net.db_addr}",
                        settings=BOUNCER_SETTINGS,
                    )
                )
                remote = {"JOBTUI_DSN": f"postgresql://postgres@{net.db_addr}:{bouncer.port}/postgres"}
                remote["JOBTUI_POOLER"] = "transaction"
            try:
                yield World(net, dsn, procs, remote)
            finally:
                procs.close()


# PgBouncer ends a client gone silent as jobtui's connections do (docs/scaling.md): a client
# cut off inside a transaction would hold its server connection, and the rows it locked,
# until TCP gave up.
BOUNCER_SETTINGS = (
    "tcp_keepalive = 1",
    "tcp_keepidle = 2",
    "tcp_keepintvl = 1",
    "tcp_keepcnt = 3",
    "tcp_user_timeout = 5000",
)


def _worker(world: World, name: str, executor: str, queues: str, remote: bool) -> Proc:
    args = worker_args(
        name,
        lease=LEASE,
        concurrency=HELD,
        extra=["--no-scheduler", "--poll", "0.5s", "--queues", queues, "--executor", executor, "-v"],
    )
    if remote:
        return world.procs.start(name, args, env=world.remote, prefix=world.net.exec_prefix(0))
    return world.procs.start(name, args)


def run_partition(seconds: float, executor: str, *, log_dir: Path, pooler: bool = False) -> Result:
    """One partition of `seconds` of a worker whose sync handlers run in `executor` (behind
    PgBouncer in transaction mode with `pooler`, PgBouncer beside the database)."""
    result = Result(seconds, executor + (" behind pgbouncer" if pooler else ""))
    with _world(log_dir, pooler) as world, psycopg.connect(world.dsn, autocommit=True) as db:
        net = world.net
        a = _worker(world, "A", executor, f"default={HELD},{OWN}={JOBS}", remote=True)
        wait_until(lambda: "worker A started" in a.log() or not a.alive(), 30, "worker A to start", a.log)
        assert a.alive(), a.log()
        # A's attempts sleep before their effect, B's do it at once.
        held = [enqueue(db, enqueue_call("chaos.sync", {"before": [LEASE + 1, 0]})) for _ in range(HELD)]
        wait_until(lambda: all(_starts(db, j) == ["A"] for j in held), 30, "A to start its jobs", a.log)

        with cut_off_for(net, 0, seconds) as cut:
            b = _worker(world, "B", executor, f"default={HELD}", remote=False)
            wait_until(lambda: all(_starts(db, j)[1:] == ["B"] for j in held), 60, "B to re-claim A's jobs", b.log)
            result.reclaimed_after = time.monotonic() - cut
            wait_until(lambda: all(_row(db, j)["status"] == "done" for j in held), 60, "B to finish A's jobs", b.log)
            done_by_b = {j: _row(db, j) for j in held}
        healed = _db_seconds(db)
        own = [enqueue(db, enqueue_call("chaos.sync", {}, queue=OWN)) for _ in range(JOBS)]

        def finished() -> list[float]:
            rows = db.execute(
                "SELECT extract(epoch FROM finished_at)::float8 FROM jobtui.job WHERE id = ANY(%s) AND status = 'done'",
                (own,),
            ).fetchall()
            return [float(r[0]) for r in rows]

        try:
            wait_until(lambda: len(finished()) == JOBS, 120, f"A to finish the {JOBS} jobs of its own queue", a.log)
        except AssertionError as exc:
            result.problems.append(str(exc).splitlines()[0])
        done_at = sorted(finished())
        result.back_after = done_at[0] - healed if done_at else float("inf")
        result.all_done_after = done_at[-1] - healed if len(done_at) == JOBS else float("inf")
        # What A still had in flight from before the partition has ended and tried to write.
        wait_until(nothing_in_flight(db, "A"), 30, "A's row in the fleet: nothing in flight", a.log)
        result.log = a.log()
        result.handed_back = result.log.count("handed back to ready unstarted")
        _check(db, held, own, done_by_b, result)
    return result


def _check(db: Conn, held: list[int], own: list[int], done_by_b: dict[int, dict[str, Any]], result: Result) -> None:
    for job_id in own:
        starts = _starts(db, job_id)
        if len(starts) != 1:
            result.started_twice[job_id] = len(starts)
            result.problems.append(f"job {job_id} of {OWN} started {len(starts)} times ({', '.join(starts)})")
        row = _row(db, job_id)
        if row["status"] != "done":
            result.problems.append(f"job {job_id} of {OWN} is {row['status']}, not done")
    for job_id in held:
        if _row(db, job_id) != done_by_b[job_id]:
            result.problems.append(f"job {job_id}'s row changed after B had finished it (a stale write)")
    effects = db.execute(
        "SELECT job_id, count(*), count(*) FILTER (WHERE seen_token <> token) FROM chaos_effect GROUP BY job_id"
    ).fetchall()
    by_job = {int(r[0]): (int(r[1]), int(r[2])) for r in effects}
    for job_id in [*held, *own]:
        count, stale = by_job.get(job_id, (0, 0))
        if count != 1:
            result.problems.append(f"job {job_id}'s effect was done {count} times")
        if stale:
            result.problems.append(f"job {job_id}'s effect was done under a lease no longer current")
