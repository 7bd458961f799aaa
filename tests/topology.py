"""The production topology's real components for tests and benchmarks: PgBouncer in
transaction mode in front of a server, and a streaming standby of a `LocalCluster` made with
pg_basebackup. Each runs on a free port of 127.0.0.1, as the `postgres` user when the tests
run as root (neither PgBouncer nor PostgreSQL runs as root), and is stopped at the end
whatever happened.

    with PgBouncer.start(upstream_port=5432, pool_size=4) as bouncer:
        dsn = bouncer.dsn("test")
    with LocalCluster.create(settings=PRIMARY_SETTINGS) as primary, Standby.of(primary) as standby:
        standby.promote()

`python -m tests.topology` starts PgBouncer in front of 127.0.0.1:5432 and a primary with its
standby, prints their DSNs, and stops them all on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from .cluster import LocalCluster, _bin_dir, _free_port
from .proxy import Proxy
from .waits import wait_until

PGBOUNCER = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)

# A primary that a standby can stream from; synchronous replication is switched on by the
# test (synchronous_standby_names) once the standby is connected.
PRIMARY_SETTINGS = ("wal_level = replica", "max_wal_senders = 5", "hot_standby = on", "wal_keep_size = 256MB")


def _server_user() -> tuple[str | None, pwd.struct_passwd | None]:
    """The OS user to run servers as: `postgres` when running as root, else ourselves."""
    if os.geteuid() != 0:
        return None, None
    try:
        return "postgres", pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root and there is no postgres user to run the servers as")


def _own_dir(prefix: str) -> Path:
    _, owner = _server_user()
    base = Path(tempfile.mkdtemp(prefix=prefix))
    if owner is not None:
        os.chown(base, owner.pw_uid, owner.pw_gid)
    return base


def _as_server_user(command: list[str]) -> list[str]:
    user, _ = _server_user()
    return ["runuser", "-u", user, "--", *command] if user else command


def _accepts(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2, prepare_threshold=None):
            return True
    except psycopg.OperationalError:
        return False


def _wait_accepting(dsn: str, timeout: float, what: str, log: Path) -> None:
    def logged() -> str:
        return log.read_text(errors="replace") if log.exists() else ""

    wait_until(lambda: _accepts(dsn), timeout, f"{what} to accept connections", logged)


class PgBouncer:
    """A PgBouncer process with pool_mode = transaction in front of one PostgreSQL server,
    every database name passed through (a `*` entry).

    PgBouncer reaches the server over TCP. A server that listens only on a Unix socket (the
    embedded one of the tests, whose socket is in a directory of its own user) gets a TCP
    proxy in front of it, run by this process: PgBouncer may run as another user (`postgres`
    when the tests run as root), who cannot open that socket."""

    def __init__(self, base: Path, port: int, proc: subprocess.Popen[bytes], proxy: Proxy | None = None) -> None:
        self.base = base
        self.port = port
        self.proc = proc
        self.proxy = proxy

    @classmethod
    def start(
        cls,
        *,
        upstream_host: str = "127.0.0.1",
        upstream_port: int = 5432,
        pool_size: int = 4,
        mode: str = "transaction",
        listen_addr: str = "127.0.0.1",
        settings: Sequence[str] = (),
        users: Sequence[str] = ("postgres",),
    ) -> PgBouncer:
        """Start PgBouncer, listening on `listen_addr` (addresses separated by commas; `dsn`
        names the first), letting in `users` (trust: no password), with `settings` added to
        its [pgbouncer] section; skips the test when the pgbouncer package is not installed."""
        if PGBOUNCER is None:
            pytest.skip("pgbouncer is not installed: apt-get install -y pgbouncer (.ci/run does it)")
        proxy = None
        if upstream_host.startswith("/"):
            proxy = Proxy(f"host={upstream_host} port={upstream_port}")
            upstream_host, upstream_port = "127.0.0.1", proxy.port
        base = _own_dir("jobtui-pgbouncer-")
        port = _free_port()
        (base / "users.txt").write_text("".join(f'"{user}" ""\n' for user in users))
        (base / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={upstream_host} port={upstream_port}",
                    "[pgbouncer]",
                    f"listen_addr = {listen_addr}",
                    f"listen_port = {port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {base / 'users.txt'}",
                    f"pool_mode = {mode}",
                    f"default_pool_size = {pool_size}",
                    "min_pool_size = 0",
                    "reserve_pool_size = 0",
                    "max_client_conn = 500",
                    "server_login_retry = 1",
                    f"logfile = {base / 'pgbouncer.log'}",
                    f"pidfile = {base / 'pgbouncer.pid'}",
                    "admin_users = postgres",
                    *settings,
                    "",
                ]
            )
        )
        _, owner = _server_user()
        if owner is not None:
            for name in ("users.txt", "pgbouncer.ini"):
                os.chown(base / name, owner.pw_uid, owner.pw_gid)
        proc = subprocess.Popen(
            _as_server_user([PGBOUNCER, str(base / "pgbouncer.ini")]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        bouncer = cls(base, port, proc, proxy)
        try:
            _wait_accepting(bouncer.dsn("postgres"), 15, "pgbouncer", bouncer.log_path)
        except BaseException:
            bouncer.close()
            raise
        return bouncer

    @property
    def log_path(self) -> Path:
        return self.base / "pgbouncer.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def dsn(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def close(self) -> None:
        if self.proc.poll() is None:
            # runuser forwards the signal; the whole session group goes in case it does not.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proxy is not None:
            self.proxy.close()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Standby(LocalCluster):
    """A hot standby streaming from a `LocalCluster`, made with pg_basebackup -R."""

    @classmethod
    def of(cls, primary: LocalCluster, *, name: str = "standby1", settings: Sequence[str] = ()) -> Standby:
        bin_dir = _bin_dir()
        assert bin_dir is not None  # the primary was made with it
        user, _ = _server_user()
        base = _own_dir("jobtui-standby-")
        standby = cls(bin_dir, base / "pgdata", _free_port(), user)
        standby._pg(
            "pg_basebackup",
            "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(standby.data), "-R", "-X", "stream", "--no-sync", "-c", "fast",
            timeout=120,
        )  # fmt: skip
        conf = [
            f"port = {standby.port}",
            f"unix_socket_directories = '{base}'",
            "hot_standby = on",
            # The primary's name for this standby, as synchronous_standby_names says it.
            f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres application_name={name}'",
            *settings,
        ]
        with (standby.data / "postgresql.auto.conf").open("a") as f:
            f.write("\n".join(conf) + "\n")
        try:
            standby.start()
            standby.wait_accepting()
        except BaseException:
            standby.close()
            raise
        return standby

    def __enter__(self) -> Standby:
        return self

    def promote(self) -> None:
        """Make this standby a primary (pg_ctl promote waits until it is)."""
        self._pg("pg_ctl", "-D", str(self.data), "-w", "promote")

    def wait_replayed(self, primary: LocalCluster, timeout: float = 30) -> None:
        """Until this standby has replayed everything the primary has logged so far."""
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            # A commit that waits for its flush (the test clusters run synchronous_commit =
            # off) writes out every record before it, which the standby then receives. Only a
            # transaction that wrote something waits: one that merely took an id does not.
            conn.execute("SET synchronous_commit = on")
            conn.execute("CREATE TABLE IF NOT EXISTS public.replay_probe (at timestamptz)")
            conn.execute("INSERT INTO public.replay_probe VALUES (now())")
            row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        target = row[0]
        with psycopg.connect(self.dsn(), autocommit=True) as conn:

            def replayed() -> bool:
                done = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()
                return bool(done and done[0])

            wait_until(replayed, timeout, f"the standby to replay up to {target}")


def make_sync(primary: LocalCluster, standby_name: str = "standby1") -> None:
    """Switch the primary to synchronous replication to `standby_name` and wait until the
    standby is its synchronous one: every commit from then on waits for the standby."""
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{standby_name}'")
        conn.execute("SELECT pg_reload_conf()")

        def synchronous() -> bool:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s", (standby_name,)
            ).fetchone()
            return bool(row and row[0] == "sync")

        wait_until(synchronous, 30, f"{standby_name} to become the synchronous standby")


def main() -> None:
    """Start the topology for trying it by hand; stop it all on Ctrl-C."""
    with contextlib.ExitStack() as stack:
        bouncer = stack.enter_context(PgBouncer.start())
        primary = stack.enter_context(LocalCluster.create(settings=PRIMARY_SETTINGS))
        standby = stack.enter_context(Standby.of(primary))
        print(f"pgbouncer (transaction, pool 4) -> 127.0.0.1:5432: {bouncer.dsn('DBNAME')}")
        print(f"primary: {primary.dsn()}")
        print(f"standby: {standby.dsn()}")
        print(
            "failover DSN: "
            f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres dbname=postgres"
            " target_session_attrs=read-write"
        )
        print("Ctrl-C stops them all")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
