"""The server's end of jobtui's connections gives up on a client cut off by a network that drops
packets silently, as the client's end does: sessions of a cut host end within seconds, not
after the server's TCP keepalive (about two hours), so they hold no connection slot, and a
job whose `once()` transaction the cut left open is claimed again once its lease ends.

A host of tests/netns.py opens the connections and is cut off; the test watches the server
from 127.0.0.1, which the cut does not touch."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from jobtui.clients.client import Client
from jobtui.kernel.db import connect
from jobtui.kernel.link import Connection, Link, attempt_deadline
from jobtui.kernel.migrate import migrate
from jobtui.kernel.server import now_call
from tests.netns import Topology
from tests.proxy import Proxy
from tests.topology import PgBouncer
from tests.waits import until, wait_until

# In a host: jobtui's long-lived connections of each kind (a worker's, on its link; the
# console's; a client's pool) and a job's once() inside an open transaction on a handler's
# connection made with jobtui.connection_options; then it waits, its sessions idle (the
# claim's lease is 600 s: only the server's own bounds end them).
HOST = """
import asyncio, sys, time, psycopg, jobtui
from jobtui.clients.client import Client
from jobtui.core.registry import Job
from jobtui.kernel.link import Connection
from jobtui.kernel.server import now_call
from jobtui.tui.data import DataSource
dsn = sys.argv[1]
async def linked():
    conn = Connection(dsn, "test")
    await conn.run(now_call(), "jobtui")
    return conn
loop = asyncio.new_event_loop()
worker_conn = loop.run_until_complete(linked())
console = DataSource(dsn, "jobtui")
console.fetch()
client = Client(dsn, max_connections=1)
[claimed] = client.claim(["t"], worker="cut-host", lease=600)
handler = psycopg.connect(dsn, **jobtui.connection_options(dsn))
assert Job(claimed, "cut-host", "jobtui").once(handler, "effect-1")
print(claimed.id, flush=True)
time.sleep(600)
"""

Conn = psycopg.Connection[Any]


def sessions_from(admin: Conn, addr: str) -> int:
    row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE host(client_addr) = %s", (addr,)).fetchone()
    return int(row[0]) if row else 0


def test_a_cut_hosts_sessions_end_on_the_server_within_seconds() -> None:
    with Topology.create(hosts=1) as net:
        assert net.cluster is not None
        admin_dsn = net.cluster.dsn("postgres")
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            migrate(conn)
        with Client(admin_dsn, max_connections=1) as queue:
            job_id = queue.enqueue("t")
        host = net.popen(0, [sys.executable, "-c", HOST, net.dsn("postgres")], stdout=subprocess.PIPE, text=True)
        try:
            assert host.stdout is not None
            assert int(host.stdout.readline()) == job_id
            addr = net.hosts[0].addr
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                assert sessions_from(admin, addr) == 4  # the link's, the console's, the pool's, the handler's
                with net.cut_off(0) as cut_at:
                    wait_until(lambda: sessions_from(admin, addr) == 0, 60, "the cut host's sessions to end")
                    gone_after = time.monotonic() - cut_at
                    # The effect's transaction ended with its session: the row is no longer
                    # locked, so the job can be taken back (here by hand, as a reaper would
                    # once the lease ends).
                    locked = "SELECT id FROM jobtui.job WHERE id = %s FOR UPDATE NOWAIT"
                    assert admin.execute(locked, (job_id,)).fetchall() == [(job_id,)]
                    effects = admin.execute("SELECT count(*) FROM jobtui.effect").fetchone()
                    assert effects == (0,)  # never committed: the effect may run again, as once() says
            # Keepalives begin after 2 s idle and give up after 3 probes a second apart; the
            # server notices within about 5 s (the poll adds up to half a second).
            assert gone_after < 15, gone_after
        finally:
            host.kill()
            host.wait()


async def test_a_frozen_server_behind_a_pooler_is_found_within_the_links_bound(dsn: str) -> None:
    """The statement that bounds the server's end runs on each of a link's new connections
    under its own deadline: behind a pooler that answers for a frozen server, a worker's link
    still decides the database unreachable within its bound (a statement that waited `within`,
    then a new connection that gets no answer within its deadline), and `db.connect` runs no
    statement, so its `connect_timeout` bounds it alone."""
    within = 1.0
    with Proxy(dsn) as proxy, PgBouncer.start(mode="session", upstream_port=proxy.port) as bouncer:
        pooled = bouncer.dsn(str(conninfo_to_dict(dsn)["dbname"]))
        link = Link(pooled, within=within)
        conn = Connection(pooled, "test", link=link)
        try:
            await conn.run(now_call(), "jobtui")
            proxy.freeze()
            began = time.monotonic()
            connect(pooled, connect_timeout=3).close()
            assert time.monotonic() - began < 3
            waiting = asyncio.ensure_future(conn.run(now_call(), "jobtui"))
            await until(lambda: not link.up, 30, "the link to decide the database unreachable")
            took = time.monotonic() - began
            # The bound: the statement's `within`, then a new connection's deadline; with slack.
            assert took < within + attempt_deadline(within) + 3, took
            proxy.thaw()
            await asyncio.wait_for(waiting, 30)  # back once the server answers again
        finally:
            proxy.thaw()
            await conn.close()
