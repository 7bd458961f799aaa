"""Benchmark of `jobtui serve` under load: N browser sessions at once on a large backlog.

    .venv/bin/python bench/web_console.py [--dsn DSN] [--sessions 20] [--seconds 60]
                                          [--backlog 1000000] [--keep] [--reuse]

A benchmark, not a test. It creates its own database (jobtui_bench_web) on the server of
--dsn, fills it with --backlog ready jobs (10 % delayed, over 6 types), 1,000 dead ones and
20 running ones, VACUUM ANALYZEs it and writes the archiver's minute row. Then it starts a
real `jobtui serve` on 127.0.0.1, signs --sessions clients in (each its own session, as a
viewer), and opens one console each over the WebSocket protocol of textual-serve's browser
client (the same messages a browser tab sends: a resize, pings, keys). For --seconds:

- every 0.5 s the benchmark adds one dead job and notes when it committed; each client reads
  its screen's header ("dead N", the frames' text with the escape sequences taken out) and
  notes when it first shows each new count. The difference is the refresh as a person sees
  it: from a change in the database to the screens of every session (the console reads once
  a second, so about 0.5 s on average is the floor);
- every second it samples the server's process and its console processes (CPU time, RSS
  and PSS from /proc) and the database's connections of the consoles (pg_stat_activity,
  application_name `jobtui serve USER`) and those backends' CPU time.

It prints the server's CPU (the web process, and the consoles together and each), memory,
connections, frames and bytes per session per second, and the refresh's p50 and p95 for each
session. The database server must run on this machine for its backends' CPU to be read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.core.history import record_minute
from jobtui.kernel.migrate import migrate
from jobtui.web.users import VIEWER, UsersFile

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
BENCH_DB = "jobtui_bench_web"
VIEWER_ROLE = "jobtui_bench_web_viewer"
ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "bench-password-1"
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
ESCAPES = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]P^_].*?(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")
DEAD = re.compile(rb"dead (\d[\d,]*)")

FILL = [
    """
INSERT INTO jobtui.job (type, status, run_at, attempts)
SELECT 'type_' || (i % 6), 'ready',
       CASE WHEN i % 10 = 0 THEN now() + (i * interval '3600 seconds') / {backlog}
            ELSE now() - (i * interval '3600 seconds') / {backlog} END, 0
FROM generate_series(1, {backlog}) AS i
""",
    """
INSERT INTO jobtui.job (type, status, run_at, attempts, max_attempts, locked_by, last_error, created_at, finished_at)
SELECT 'type_' || (i % 5), 'dead', now() - interval '1 day', 25, 25, 'worker-' || (i % 16),
       format('KeyError: ''user %s''', i % 12), now() - interval '1 day', now() - (i * interval '60 seconds')
FROM generate_series(1, 1000) AS i
""",
    """
INSERT INTO jobtui.job (type, status, run_at, attempts, locked_by, locked_until, lease_token, heartbeat_at, started_at)
SELECT 'type_' || (i % 6), 'running', now() - interval '1 minute', 1, 'worker-' || (i % 4),
       now() + interval '1 day', 1, now(), now() - interval '30 seconds'
FROM generate_series(1, 20) AS i
""",
]


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def prepare(admin_dsn: str, backlog: int, reuse: bool) -> str:
    dsn = with_dbname(admin_dsn, BENCH_DB)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (BENCH_DB,)).fetchone()
        if reuse and exists:
            print(f"reusing {BENCH_DB}")
            return dsn
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    start = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        for text in FILL:
            conn.execute(sql.SQL(text).format(backlog=sql.Literal(backlog)))
        conn.execute("VACUUM ANALYZE jobtui.job")
        record_minute(conn, "jobtui")  # what the archiver does once a minute
    print(f"filled {backlog:,} ready jobs in {time.perf_counter() - start:.0f}s")
    return dsn


# -- what the processes use, from /proc ------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    return 0.0


def memory_kib(pid: int) -> tuple[int, int]:
    """RSS and PSS (the process's share of pages it shares with others), in KiB."""
    rss = pss = 0
    with contextlib.suppress(OSError):
        for text in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if text.startswith("Rss:"):
                rss = int(text.split()[1])
            elif text.startswith("Pss:"):
                pss = int(text.split()[1])
    return rss, pss


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


@dataclass
class Samples:
    consoles: list[int] = field(default_factory=list)
    server_rss: list[int] = field(default_factory=list)
    consoles_rss: list[int] = field(default_factory=list)
    consoles_pss: list[int] = field(default_factory=list)
    connections: list[int] = field(default_factory=list)


# -- the clients -----------------------------------------------------------------------------


@dataclass
class Client:
    number: int
    frames: int = 0
    bytes: int = 0
    seen: dict[int, float] = field(default_factory=dict)  # dead count -> when first on screen
    closed: bool = False


async def run_client(url: str, user: str, client: Client, opened: asyncio.Event, stop: asyncio.Event) -> None:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        form = {"name": user, "password": PASSWORD}
        async with http.post(f"{url}/login", data=form, headers={"Origin": url}, allow_redirects=False) as answer:
            assert answer.status == 303, f"sign-in of {user}: {answer.status}"
        ws_url = url.replace("http", "ws", 1) + "/ws?width=160&height=40"
        async with http.ws_connect(ws_url, headers={"Origin": url}) as socket:
            await socket.send_str(json.dumps(["resize", {"width": 160, "height": 40}]))
            opened.set()
            pinger = asyncio.create_task(_ping(socket, stop))
            try:
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.5):
                            message = await socket.receive()
                        if message.type != aiohttp.WSMsgType.BINARY:
                            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                                client.closed = True
                                return
                            continue
                        now = time.perf_counter()
                        client.frames += 1
                        client.bytes += len(message.data)
                        for match in DEAD.finditer(ESCAPES.sub(b"", message.data)):
                            client.seen.setdefault(int(match.group(1).replace(b",", b"")), now)
            finally:
                pinger.cancel()


async def _ping(socket: aiohttp.ClientWebSocketResponse, stop: asyncio.Event) -> None:
    while not stop.is_set():  # as the browser's client does, now and then
        await socket.send_str(json.dumps(["ping", str(time.time_ns())]))
        await asyncio.sleep(5)


async def add_dead(dsn: str, stop: asyncio.Event, committed: dict[int, float]) -> None:
    """One dead job every 0.5 s; the dead count after each, and when it committed."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            await conn.execute(
                "INSERT INTO jobtui.job (type, status, attempts, max_attempts, last_error, finished_at)"
                " VALUES ('bench.mark', 'dead', 1, 1, 'BenchMark: marker', now())"
            )
            cur = await conn.execute("SELECT count(*) FROM jobtui.job WHERE status = 'dead'")
            row = await cur.fetchone()
            assert row is not None
            committed[int(row[0])] = time.perf_counter()
            await asyncio.sleep(0.5)


async def sample(
    server: int, dsn: str, stop: asyncio.Event, samples: Samples, backends: dict[int, list[float]]
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            kids = children(server)
            samples.consoles.append(len(kids))
            samples.server_rss.append(memory_kib(server)[0])
            mem = [memory_kib(k) for k in kids]
            samples.consoles_rss.append(sum(m[0] for m in mem))
            samples.consoles_pss.append(sum(m[1] for m in mem))
            cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'jobtui serve %'")
            pids = [int(r[0]) for r in await cur.fetchall()]
            samples.connections.append(len(pids))
            if len(pids) > len(kids):
                print(f"  {len(pids)} connections for {len(kids)} consoles", file=sys.stderr)
            for pid in pids:  # the first and the last reading of each backend
                backends.setdefault(pid, [cpu_seconds(pid), 0.0])[1] = cpu_seconds(pid)
            await asyncio.sleep(1.0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(url: str, server: int, dsn: str, sessions: int, seconds: float) -> dict[str, Any]:
    clients = [Client(i) for i in range(sessions)]
    stop = asyncio.Event()
    opened = [asyncio.Event() for _ in clients]
    tasks = [asyncio.create_task(run_client(url, f"viewer{c.number}", c, opened[c.number], stop)) for c in clients]
    for event in opened:
        await asyncio.wait_for(event.wait(), 120)
    await asyncio.sleep(5)  # every console up and drawing
    samples, committed = Samples(), dict[int, float]()
    backends: dict[int, list[float]] = {}
    before = {pid: cpu_seconds(pid) for pid in children(server)}
    server_before, wall = cpu_seconds(server), time.perf_counter()
    for c in clients:
        c.frames = c.bytes = 0
    writer = asyncio.create_task(add_dead(dsn, stop, committed))
    sampler = asyncio.create_task(sample(server, dsn, stop, samples, backends))
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - wall
    consoles_cpu = sum(cpu_seconds(pid) - before.get(pid, 0.0) for pid in children(server))
    server_cpu = cpu_seconds(server) - server_before
    stop.set()
    await asyncio.gather(writer, sampler, *tasks, return_exceptions=True)
    refresh: list[tuple[float, float]] = []
    counted = {n: t for n, t in committed.items() if t < wall + elapsed - 3}  # the last ones may be unseen
    for c in clients:
        # A count is on the screen once the screen shows it or a later one: two changes within
        # one read of the console show as one.
        shown = sorted(c.seen.items())
        waits = []
        for n, t in counted.items():
            when = min((at for m, at in shown if m >= n and at >= t), default=None)
            if when is not None:
                waits.append((when - t) * 1000)
        if len(waits) < len(counted):
            print(f"  session {c.number}: {len(counted) - len(waits)} of {len(counted)} changes never on its screen")
        if waits:
            refresh.append((percentile(waits, 0.5), percentile(waits, 0.95)))
    return {
        "elapsed": elapsed,
        "server_cpu": server_cpu / elapsed,
        "consoles_cpu": consoles_cpu / elapsed,
        "samples": samples,
        "backend_cpu": sum(last - first for first, last in backends.values()),
        "clients": clients,
        "refresh": refresh,
        "marks": len(committed),
        "closed": sum(c.closed for c in clients),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_BENCH_DSN", DEFAULT_DSN))
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--keep", action="store_true", help=f"keep the {BENCH_DB} database afterwards")
    parser.add_argument("--reuse", action="store_true", help="measure the database an earlier --keep left")
    args = parser.parse_args(argv)
    print(f"python {platform.python_version()}, psycopg {psycopg.__version__}, {os.cpu_count()} CPUs")
    dsn = prepare(args.dsn, args.backlog, args.reuse)
    workdir = Path(tempfile.mkdtemp(prefix="jobtui-bench-web-"))
    users = UsersFile(workdir / "users")
    for i in range(args.sessions):
        users.add(f"viewer{i}", PASSWORD, role=VIEWER)
    # The viewers' consoles connect as a read-only role (docs/grants.sql), as serve requires.
    grants = ["-v", "schema=jobtui", "-v", f"role={VIEWER_ROLE}", "-v", "read_only=1", "-v", "create_role=1"]
    subprocess.run(["psql", "-X", "-q", dsn, *grants, "-f", str(ROOT / "docs" / "grants.sql")], check=True)
    env = {**os.environ, "JOBTUI_DSN": dsn, "JOBTUI_VIEWER_DSN": make_conninfo(dsn, user=VIEWER_ROLE)}
    command = [sys.executable, "-m", "jobtui.cli", "serve", "--users", str(users.path), "--port", "0"]
    command += ["--max-sessions", str(args.sessions)]
    log = (workdir / "serve.log").open("w+")
    server = subprocess.Popen(command, cwd=ROOT, env=env, stderr=log, stdout=subprocess.DEVNULL)
    try:
        url = ""
        deadline = time.monotonic() + 30
        while not url:
            log.seek(0)
            found = re.search(r"listening on (\S+)", log.read())
            url = found.group(1).rstrip("/") if found else ""
            if server.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise SystemExit(f"jobtui serve did not start:\n{log.read()}")
            time.sleep(0.1)
        result = asyncio.run(measure(url, server.pid, dsn, args.sessions, args.seconds))
    finally:
        server.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(30)
        if server.poll() is None:
            server.kill()
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB)))
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(VIEWER_ROLE)))
            print(f"dropped {BENCH_DB} and role {VIEWER_ROLE}")
    report(args, result)
    return 0


def report(args: argparse.Namespace, r: dict[str, Any]) -> None:
    s: Samples = r["samples"]
    n = args.sessions
    clients: list[Client] = r["clients"]
    mib = 1024.0
    print(f"{n} sessions for {r['elapsed']:.0f}s on {args.backlog:,} ready jobs; {r['marks']} changes written")
    print(f"  consoles running: {min(s.consoles)}-{max(s.consoles)}; sockets closed early: {r['closed']}")
    print(f"  server CPU: web process {r['server_cpu'] * 100:.1f} % of a core, consoles {r['consoles_cpu'] * 100:.0f} %"
          f" ({r['consoles_cpu'] * 100 / n:.1f} % each)")  # fmt: skip
    print(f"  server memory: web process RSS {max(s.server_rss) / mib:.0f} MiB; consoles RSS"
          f" {max(s.consoles_rss) / mib:.0f} MiB, PSS {max(s.consoles_pss) / mib:.0f} MiB"
          f" ({max(s.consoles_pss) / mib / n:.0f} MiB each)")  # fmt: skip
    print(f"  database connections of the consoles: {min(s.connections)}-{max(s.connections)}"
          f" ({max(s.connections) / n:.1f} per session); their backends' CPU"
          f" {r['backend_cpu'] * 100 / r['elapsed']:.0f} % of a core")  # fmt: skip
    frames = statistics.mean(c.frames for c in clients) / r["elapsed"]
    kib = statistics.mean(c.bytes for c in clients) / r["elapsed"] / 1024
    print(f"  per session: {frames:.1f} frames/s, {kib:.1f} KiB/s")
    if r["refresh"]:
        p50s = [p50 for p50, _ in r["refresh"]]
        p95s = [p95 for _, p95 in r["refresh"]]
        print(f"  refresh (change in the database to each session's screen), over {len(p95s)} sessions:"
              f" p50 median {statistics.median(p50s):.0f} ms; p95 median {statistics.median(p95s):.0f} ms,"
              f" worst session {max(p95s):.0f} ms")  # fmt: skip
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the end: {load}")


if __name__ == "__main__":
    sys.exit(main())
