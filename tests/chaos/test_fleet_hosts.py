"""The fleet across hosts: three workers, each in a network namespace of its own with a host
name of its own (tests/netns.py: veth pairs through a router namespace to a PostgreSQL on an
address of the test's own), show under three hosts. One host is cut off silently (blackhole
routes in the router): its worker reads as lost within its bound, by the database's clock,
and its job returns through another worker's reaper and runs there; healed, the worker is
back in the fleet, live, under its host.

Workers run with a 3 s lease: they refresh every second and read as lost after 3 s.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from jobtui.kernel import migrate
from jobtui.reads.fleet import read_fleet
from tests.netns import Topology
from tests.waits import wait_until
from tests.workers import APP_TABLES, ROOT, close_gate, open_gate

APP = "tests.apps.worker_app:jobs"
DB = "fleet_hosts"


def start_worker(net: Topology, host: int, log: Path) -> subprocess.Popen[Any]:
    """A worker in host `host`'s namespace, under a host name of its own (a UTS namespace):
    `netns-h<host>`."""
    command = (
        f"hostname netns-h{host} && cd {ROOT} && exec {sys.executable} -m jobtui.cli worker --app {APP}"
        f" --id w{host} --lease 3s --poll 0.2s --concurrency 1"
    )
    with log.open("wb") as out:
        return net.popen(
            host,
            ["unshare", "--uts", "sh", "-c", command],
            env={"JOBTUI_DSN": net.dsn(DB), "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_three_hosts_one_cut_off_shows_lost_its_job_returns_and_it_comes_back(tmp_path: Path) -> None:
    with Topology.create(hosts=3) as net:
        assert net.cluster is not None
        with psycopg.connect(net.cluster.dsn("postgres"), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DB}")
        db = psycopg.connect(net.cluster.dsn(DB), autocommit=True)
        try:
            migrate.migrate(db)
            db.execute(APP_TABLES)
            logs = [tmp_path / f"w{i}.log" for i in range(3)]
            text = lambda: "\n".join(f"--- {p.name}\n{p.read_text()}" for p in logs)  # noqa: E731
            for i in range(3):
                start_worker(net, i, logs[i])

            wait_until(lambda: len(read_fleet(db).live) == 3, 60, "three workers registered", text)
            hosts = {p.name: p.host for p in read_fleet(db).processes}
            assert hosts == {"w0": "netns-h0", "w1": "netns-h1", "w2": "netns-h2"}

            # Each worker holds a job at a gate, the test's advisory lock.
            gate = close_gate(db)
            ids = [
                int(row[0])
                for row in db.execute(
                    "INSERT INTO jobtui.job (type, payload) SELECT 'effect', jsonb_build_object("
                    "'key', 'k-' || i, 'hold_after', %s::bigint) FROM generate_series(1, 3) AS i RETURNING id",
                    (gate,),
                ).fetchall()
            ]
            holders = "SELECT id, locked_by FROM jobtui.job WHERE status = 'running'"
            wait_until(lambda: len(db.execute(holders).fetchall()) == 3, 30, "a job held on each host", text)
            # At the gate, past its effect: a cut inside job.once()'s transaction would leave its
            # row locked on the server until the server gives the connection up, and the reapers
            # pass a locked row over (SKIP LOCKED) for as long.
            effects = "SELECT count(DISTINCT job_id) FROM run_log WHERE event = 'effect'"
            wait_until(lambda: db.execute(effects).fetchone() == (3,), 30, "each job past its effect", text)
            cut_job = next(job for job, worker in db.execute(holders).fetchall() if worker == "w0")

            with net.cut_off(0):
                cut_at = time.monotonic()
                lost = wait_until(
                    lambda: next((p for p in read_fleet(db).processes if p.name == "w0" and p.lost), None),
                    20,
                    "w0 lost",
                    text,
                )
                # Lost within its bound (3 s without a refresh, by the database's clock), give or
                # take the refresh it had just written and this poll's own pace.
                assert lost.host == "netns-h0" and 3.0 <= lost.seen_ago < 6.0
                assert time.monotonic() - cut_at < 8.0
                assert {p.name for p in read_fleet(db).live} == {"w1", "w2"}
                # Its job comes back through another worker's reaper, once its lease expired.
                reaped = "SELECT worker FROM jobtui.lease_expiry WHERE job_id = %s"
                wait_until(lambda: db.execute(reaped, (cut_job,)).fetchone() == ("w0",), 30, "the job reaped", text)
                open_gate(db, gate)
                done = "SELECT status, locked_by, attempts FROM jobtui.job WHERE id = %s"
                wait_until(lambda: (db.execute(done, (cut_job,)).fetchone() or ("",))[0] == "done", 30, "rerun", text)
                _, worker, attempts = db.execute(done, (cut_job,)).fetchone() or ("", "", 0)
                assert worker in ("w1", "w2") and attempts == 2
            # Healed: the same worker, under its host, live again.
            back = wait_until(
                lambda: next((p for p in read_fleet(db).processes if p.name == "w0" and p.live), None),
                30,
                "w0 back",
                text,
            )
            assert back.host == "netns-h0" and back.id == lost.id
            finished = "SELECT count(*) FROM jobtui.job WHERE id = ANY(%s) AND status = 'done'"
            wait_until(lambda: db.execute(finished, (ids,)).fetchone() == (3,), 30, "every job done", text)
        finally:
            db.close()
