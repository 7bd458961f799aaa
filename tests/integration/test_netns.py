"""tests/netns.py's topology does what it says: hosts reach the cluster through the router
with addresses of their own, a cut host's packets vanish silently both ways (an open
connection gets no reset, a new one times out) while the other hosts go on, a heal lets
them through again, and nothing is left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.netns import Topology, ip, sweep_stale, why_unavailable

# In a host: connect, say the address the server sees, then at each line read run a statement
# and say how it went and how long it took. The socket gives up after 2 s without an answer.
HOLDER = """
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True, connect_timeout=3, tcp_user_timeout=2000)
print(conn.execute("SELECT host(inet_client_addr())").fetchone()[0], flush=True)
for _ in sys.stdin:
    started = time.monotonic()
    try:
        conn.execute("SELECT 1")
        print(f"ok {time.monotonic() - started:.2f}", flush=True)
    except psycopg.OperationalError as exc:
        print(f"failed {time.monotonic() - started:.2f}", flush=True)
        break
"""

CONNECT = """
import sys, time, psycopg
started = time.monotonic()
try:
    with psycopg.connect(sys.argv[1], connect_timeout=2) as conn:
        print("ok", conn.execute("SELECT host(inet_client_addr())").fetchone()[0])
except psycopg.OperationalError as exc:
    print(f"failed {time.monotonic() - started:.2f}")
"""


def connect_from(net: Topology, host: int) -> str:
    done = net.run(host, [sys.executable, "-c", CONNECT, net.dsn()], timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_cut_host_is_silent_both_ways_and_heals() -> None:
    with Topology.create(hosts=2) as net:
        names = [net.router, *(h.netns for h in net.hosts)]
        assert all(n.startswith(f"jn{os.getpid()}") for n in names)
        # Each host reaches the cluster with an address of its own, through the router.
        for host in net.hosts:
            assert connect_from(net, host.index) == f"ok {host.addr}"

        holder = net.popen(
            0,
            [sys.executable, "-c", HOLDER, net.dsn()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdin is not None and holder.stdout is not None
            assert holder.stdout.readline().strip() == net.hosts[0].addr
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.stdout.readline().startswith("ok ")

            with net.cut_off(0):
                # The open connection hears nothing: no reset, only its own timeout ends it.
                holder.stdin.write("\n")
                holder.stdin.flush()
                outcome, took = holder.stdout.readline().split()
                assert outcome == "failed" and 1.5 <= float(took) < 10, (outcome, took)
                # A new connection times out rather than being refused.
                outcome, took = connect_from(net, 0).split()
                assert outcome == "failed" and float(took) >= 1.5, (outcome, took)
                # The other host goes on.
                assert connect_from(net, 1) == f"ok {net.hosts[1].addr}"
            assert not net.is_cut(0)
            assert connect_from(net, 0) == f"ok {net.hosts[0].addr}"
        finally:
            holder.kill()
            holder.wait(10)
        uplink, subnet = f"{net.prefix}-u0", net.subnet
    # Nothing is left behind.
    listed = ip("netns", "list").stdout
    assert not any(name in listed for name in names)
    assert ip("link", "show", uplink, check=False).returncode != 0
    assert f"{subnet}." not in ip("-4", "route", "show").stdout


def test_leftovers_of_a_killed_run_are_swept() -> None:
    why = why_unavailable()
    if why is not None:
        pytest.skip(f"cannot make network namespaces: {why}")
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = f"jn{gone.pid}z-router"
    assert ip("netns", "add", stale, check=False).returncode == 0
    try:
        assert stale in sweep_stale()
        assert stale not in ip("netns", "list").stdout
    finally:
        ip("netns", "del", stale, check=False)
