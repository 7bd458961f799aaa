"""The probes on the metrics port of real worker and scheduler processes, and of a worker whose
sync handlers run in child processes: /readyz follows the database (false within 3 s of it
going away through a cut or frozen TCP proxy, true within 3 s of its return) and the schema
(false while it lacks a migration of this code, a number below its newest included), and is
false while a worker drains; /healthz stays true throughout, `jobtui health` says the same in
exit codes; --metrics-addr places the listener and --metrics-token-file closes /metrics alone."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from jobtui import Client
from jobtui.kernel import migrate as migrations
from jobtui.service.endpoints import LIVE_PATH, METRICS_PATH, READY_PATH
from jobtui.service.prometheus import serve
from tests.probes import connects, free_port, get
from tests.proxy import Proxy
from tests.waits import wait_until
from tests.workers import ROOT

APP = "tests.apps.metrics_app:jobs"


class Process:
    """`python -m jobtui.cli ARGS` with its output in a file; killed at the end of the test."""

    def __init__(self, args: list[str], dsn: str, log: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log
        self._file = log.open("wb")
        environ = {**os.environ, "JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}
        environ.pop("DATABASE_URL", None)
        command = [sys.executable, "-m", "jobtui.cli", *args]
        self.proc = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=self._file, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, *, signalled: bool = False) -> int:
        """SIGTERM (unless `signalled` already), then its exit code."""
        if self.proc.poll() is None and not signalled:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack to the log
            self.proc.wait(10)
            raise AssertionError(f"still running 30 s after SIGTERM:\n{self.log()[-8000:]}") from None
        finally:
            self._file.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._file.close()


Start = Callable[..., Process]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    started: list[Process] = []

    def run(name: str, dsn: str, *args: str, env: dict[str, str] | None = None) -> Process:
        process = Process(list(args), dsn, tmp_path / f"{name}.log", env)
        started.append(process)
        return process

    try:
        yield run
    finally:
        for process in started:
            process.kill()


@pytest.fixture
def proxy(server_dsn: str) -> Iterator[Proxy]:
    with Proxy(server_dsn) as through:
        yield through


def health(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "health", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def seconds_until(condition: Callable[[], bool], timeout: float, what: str, logs: Callable[[], str]) -> float:
    started = time.monotonic()
    wait_until(condition, timeout, what, logs)
    return time.monotonic() - started


def probes(port: int) -> tuple[int, int]:
    return get(port, READY_PATH)[0], get(port, LIVE_PATH)[0]


COMMANDS = {
    "worker": ["worker", "--app", APP, "--no-scheduler", "--lease", "6s"],
    # The sync handler `noop` starts the pool of handler processes.
    "worker-process": ["worker", "--app", APP, "--no-scheduler", "--lease", "6s", "--executor", "process"],
    "scheduler": ["scheduler"],
}


def ready_and_alive(port: int, process: Process, command: str) -> None:
    wait_until(lambda: probes(port) == (200, 200), 20, "ready and alive", process.log)
    if "process" in COMMANDS[command]:
        assert "sync handlers in process" in process.log(), process.log()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_readiness_follows_the_database_and_liveness_stays(dsn: str, proxy: Proxy, start: Start, command: str) -> None:
    port = free_port()
    process = start(command, proxy.dsn(dsn), *COMMANDS[command], "--metrics-port", str(port))
    ready_and_alive(port, process, command)
    for down, up in ((proxy.cut, proxy.restore), (proxy.freeze, proxy.thaw)):
        down()
        # /readyz answers 503 within 3 s; /healthz answers 200 all along.
        lived: list[int] = []

        def not_ready(lived: list[int] = lived) -> bool:
            lived.append(get(port, LIVE_PATH)[0])
            return get(port, READY_PATH)[0] == 503

        assert seconds_until(not_ready, 3, f"not ready after {down.__name__}", process.log) <= 3.0
        status, text = get(port, READY_PATH)
        assert status == 503 and text.startswith("not ready: the database is not answering"), text
        assert set(lived) == {200}, lived
        outage = health(dsn, "--port", str(port))
        assert (outage.returncode, outage.stdout.split(":")[0]) == (1, "not ready"), outage
        assert health(dsn, "--port", str(port), "--live").returncode == 0
        assert get(port, LIVE_PATH)[0] == 200
        up()
        assert seconds_until(lambda: probes(port) == (200, 200), 3, f"ready after {up.__name__}", process.log) <= 3.0
    ready = health(dsn, "--port", str(port))
    assert ready.returncode == 0 and ready.stdout.startswith("ready: "), ready
    assert process.stop() == 0, process.log()
    gone = health(dsn, "--port", str(port))
    assert gone.returncode == 1 and "nothing answers" in gone.stdout, gone


# A migration numbered below the newest: numbers are handed out ahead, so one may land after
# a higher one was applied (test_migrate.py::test_migration_12_lands_after_13_and_14).
GAP = migrations.available()[-3]
LACKS = (
    f"schema 'jobtui' is at version {migrations.code_version()} but lacks {GAP.version:04d}_{GAP.name},"
    " which this jobtui needs"
)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_readiness_follows_the_schema_and_liveness_stays(dsn: str, start: Start, command: str) -> None:
    port = free_port()
    process = start(command, dsn, *COMMANDS[command], "--metrics-port", str(port))
    ready_and_alive(port, process, command)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for away, back, says in (
            ("ALTER SCHEMA jobtui RENAME TO jobtui_away", "ALTER SCHEMA jobtui_away RENAME TO jobtui",
             f"schema 'jobtui' is missing, this jobtui needs version {migrations.code_version()}"),
            (f"DELETE FROM jobtui.migration WHERE version = {GAP.version}",
             f"INSERT INTO jobtui.migration (version, name) VALUES ({GAP.version}, '{GAP.name}')", LACKS),
        ):  # fmt: skip
            conn.execute(away)
            lived: list[int] = []

            def not_ready(lived: list[int] = lived) -> bool:
                lived.append(get(port, LIVE_PATH)[0])
                return get(port, READY_PATH)[0] == 503

            assert seconds_until(not_ready, 3, f"not ready after {away}", process.log) <= 3.0
            status, text = get(port, READY_PATH)
            assert (status, text.strip()) == (503, f"not ready: {says}: run `jobtui migrate`"), text
            assert set(lived) == {200}, lived
            asked = health(dsn, "--port", str(port))
            assert (asked.returncode, asked.stdout.strip()) == (1, text.strip()), asked
            conn.execute(back)
            assert seconds_until(lambda: probes(port) == (200, 200), 3, f"ready after {back}", process.log) <= 3.0
    assert process.stop() == 0, process.log()


def test_readiness_is_false_while_a_worker_drains(dsn: str, start: Start) -> None:
    """After SIGTERM, while a long job finishes: /readyz 503 `draining`, /healthz 200."""
    port = free_port()
    worker = start("worker", dsn, *COMMANDS["worker"], "--shutdown-timeout", "30s", "--metrics-port", str(port))
    wait_until(lambda: probes(port) == (200, 200), 20, "ready and alive", worker.log)
    with Client(dsn) as q:
        job = q.enqueue("metrics.sleep", {"seconds": 10})

        def status() -> str:
            found = q.get(job)
            assert found is not None
            return found.status.value

        wait_until(lambda: status() == "running", 10, "the job running", worker.log)
        worker.proc.send_signal(signal.SIGTERM)
        assert seconds_until(lambda: get(port, READY_PATH)[0] == 503, 3, "not ready after SIGTERM", worker.log) <= 3.0
        draining = "not ready: draining (stopping after the jobs in flight)"
        assert get(port, READY_PATH) == (503, draining + "\n")
        assert get(port, LIVE_PATH) == (200, "alive\n")
        asked = health(dsn, "--port", str(port))
        assert (asked.returncode, asked.stdout.strip()) == (1, draining), asked
        assert health(dsn, "--port", str(port), "--live").returncode == 0
        # All of that while the job was still in flight, in a worker still running.
        assert status() == "running" and worker.proc.poll() is None, worker.log()
        assert get(port, READY_PATH)[0] == 503 and get(port, LIVE_PATH)[0] == 200
        assert worker.stop(signalled=True) == 0, worker.log()
        assert status() == "done"


def test_metrics_addr_and_token(dsn: str, start: Start, tmp_path: Path) -> None:
    token = "s3cr3t-token-0123456789abcdef"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    port = free_port()
    args = ["--metrics-port", str(port), "--metrics-addr", "127.0.0.1", "--metrics-token-file", str(token_file)]
    worker = start("worker", dsn, *COMMANDS["worker"], *args)
    wait_until(lambda: get(port, READY_PATH)[0] == 200, 20, "ready", worker.log)
    assert f"serving Prometheus metrics on http://127.0.0.1:{port}/metrics (bearer token required)" in worker.log()
    # Loopback only: another loopback address, and IPv6's, are refused.
    assert connects("127.0.0.1", port)
    assert not connects("127.0.0.2", port)
    assert not connects("::1", port)
    # /metrics wants the token; the probes do not.
    status, text = get(port, METRICS_PATH)
    assert status == 401 and "bearer token" in text
    assert get(port, METRICS_PATH, token="wrong-token-0123456789")[0] == 401
    status, text = get(port, METRICS_PATH, token=token)
    assert status == 200 and "jobtui_up 1.0" in text.splitlines()
    assert get(port, LIVE_PATH) == (200, "alive\n")
    assert get(port, READY_PATH)[0] == 200
    assert get(port, "/other")[0] == 404
    assert worker.stop() == 0


def test_every_address_is_the_default(dsn: str) -> None:
    port = free_port()
    server = serve(dsn, port)
    try:
        # IPv6 too where the host has it (it may not: then every IPv4 address).
        dual = server.server_address[0] == "::"
        assert server.where == f"http://*:{port} (every address{', IPv6 and IPv4' if dual else ''})"
        for host in ("127.0.0.1", "127.0.0.2", *(["::1"] if dual else [])):
            assert connects(host, port), host
            assert get(port, METRICS_PATH, host=host)[0] == 200
        assert get(port, READY_PATH)[0] == 404  # `jobtui metrics` serves no probes
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--metrics-addr", "127.0.0.1"], "--metrics-addr need --metrics-port"),
        (["--metrics-port", "PORT", "--metrics-token-file", "/nonexistent/token"], "cannot read the metrics token"),
        (["--metrics-port", "PORT", "--metrics-token-file", "EMPTY"], "must hold one token"),
        (["--metrics-port", "PORT", "--metrics-addr", "no.such.host.invalid"], "cannot serve metrics on"),
    ],
)
def test_bad_metrics_options_are_one_line(dsn: str, tmp_path: Path, args: list[str], says: str) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    args = [str(free_port()) if a == "PORT" else str(empty) if a == "EMPTY" else a for a in args]
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    result = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, *COMMANDS["worker"], *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_health_of_the_database(dsn: str, empty_dsn: str) -> None:
    ready = health(dsn)
    assert ready.returncode == 0 and ready.stdout.startswith("ready: ") and "at version" in ready.stdout, ready
    missing = health(empty_dsn)
    assert missing.returncode == 1 and "schema 'jobtui' is missing" in missing.stdout, missing
    away = health("postgresql://postgres@127.0.0.1:1/nowhere", "--timeout", "1")
    assert away.returncode == 1 and away.stdout.startswith("not ready: cannot reach PostgreSQL"), away
    # A server that takes no writes (a standby, or read-only by default) cannot run workers.
    with psycopg.connect(dsn, autocommit=True) as conn:
        database = sql.Identifier(str(conninfo_to_dict(dsn)["dbname"]))
        conn.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(database))
    read_only = health(dsn)
    assert read_only.returncode == 1 and "the server is read-only" in read_only.stdout, read_only


def test_a_schema_lacking_a_migration_below_its_newest_is_not_ready(dsn: str) -> None:
    """`jobtui health` and the worker agree: every migration of this code, not the newest alone."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM jobtui.migration WHERE version = %s", (GAP.version,))
    asked = health(dsn)
    assert (asked.returncode, asked.stdout.strip()) == (1, f"not ready: {LACKS}: run `jobtui migrate`"), asked
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    for command in (COMMANDS["worker"], COMMANDS["scheduler"]):
        refused = subprocess.run(
            [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, *command, "--wait-for-db", "0"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert refused.returncode == 2, refused
        assert refused.stderr.strip().splitlines() == [
            f"jobtui: error: {LACKS}: run `jobtui migrate` of this release first, as the schema's owner"
            " (`jobtui migrate --dry-run` prints its SQL)"
        ], refused.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_systemd_hears_ready_watchdog_and_stopping(dsn: str, start: Start, command: str) -> None:
    """Type=notify: READY=1 once started, WATCHDOG=1 every half WatchdogSec, STOPPING=1 on SIGTERM."""
    folder = Path(tempfile.mkdtemp(prefix="jt-notify-"))  # a socket path must stay short
    path = folder / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(20)
        process = start(command, dsn, *COMMANDS[command], env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"})
        heard: list[str] = []

        def hear(field: str) -> None:
            while not any(m.startswith(field) for m in heard):
                heard.extend(sock.recv(4096).decode().splitlines())

        hear("READY=1")
        assert any(m.startswith("STATUS=") and "started" in m for m in heard), heard
        assert f"MAINPID={process.proc.pid}" in heard
        pings = len([m for m in heard if m == "WATCHDOG=1"])
        started = time.monotonic()
        while len([m for m in heard if m == "WATCHDOG=1"]) < pings + 3:
            heard.extend(sock.recv(4096).decode().splitlines())
        assert time.monotonic() - started < 3  # three pings 0.2 s apart, give or take the load
        process.proc.send_signal(signal.SIGTERM)
        hear("STOPPING=1")
        assert process.stop(signalled=True) == 0, process.log()
    shutil.rmtree(folder, ignore_errors=True)


def test_probes_behind_pgbouncer_in_transaction_mode(dsn: str, start: Start) -> None:
    """The readiness probe is one statement in its own transaction, like everything else
    behind a transaction pooler (tests/topology.py skips without PgBouncer, saying why)."""
    from tests.topology import PgBouncer

    params = conninfo_to_dict(dsn)
    upstream = (str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432))))
    with PgBouncer.start(upstream_host=upstream[0], upstream_port=upstream[1], pool_size=2) as bouncer:
        pooled = bouncer.dsn(str(params["dbname"]))
        ports = {command: free_port() for command in COMMANDS}
        pooler = {"JOBTUI_POOLER": "transaction"}
        processes = [
            start(command, pooled, *COMMANDS[command], "--metrics-port", str(port), env=pooler)
            for command, port in ports.items()
        ]
        for process, port in zip(processes, ports.values(), strict=True):
            wait_until(lambda port=port: probes(port) == (200, 200), 20, "ready behind PgBouncer", process.log)
            status, text = get(port, METRICS_PATH)
            assert status == 200 and "jobtui_up 1.0" in text.splitlines()
        for process in processes:
            assert process.stop() == 0, process.log()
            assert "prepared statement" not in process.log() and "ERROR" not in process.log(), process.log()
