"""A PostgreSQL cluster of a test's own, on a free port of 127.0.0.1, that the test may stop,
restart or kill without touching the server every other test uses.

It is made with the machine's initdb and pg_ctl (the postgresql package's binaries), run as
the `postgres` user when the tests run as root (initdb refuses root), in a temporary
directory, and stopped and removed at the end whatever happened.

    with LocalCluster.create() as cluster:
        dsn = cluster.dsn("postgres")
        cluster.restart()
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from tests.waits import wait_until


def _bin_dir() -> Path | None:
    """The newest installed PostgreSQL's bin directory (Debian's layout), or one on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalCluster:
    def __init__(self, bin_dir: Path, data: Path, port: int, user: str | None) -> None:
        self.bin_dir = bin_dir
        self.data = data
        self.port = port
        self._user = user  # run the server as this OS user (root may not)

    @classmethod
    def create(cls, *, settings: Sequence[str] = (), hba: Sequence[str] = ()) -> LocalCluster:
        """initdb and start a new cluster in a temporary directory, with `settings` added to
        its postgresql.conf and `hba` lines to its pg_hba.conf; skips the test when that cannot
        be done here."""
        bin_dir = _bin_dir()
        if bin_dir is None:
            pytest.skip("no initdb here: install the postgresql package for tests with a cluster of their own")
        user = None
        base = Path(tempfile.mkdtemp(prefix="jobtui-cluster-"))
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(base)
                pytest.skip("running as root and there is no postgres user for initdb")
            user = "postgres"
            # A directory of its own (pytest's are root's alone), for the server's user.
            os.chown(base, owner.pw_uid, owner.pw_gid)
        data = base / "pgdata"
        cluster = cls(bin_dir, data, _free_port(), user)
        cluster._pg("initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        conf = [
            "listen_addresses = '127.0.0.1'",
            f"port = {cluster.port}",
            f"unix_socket_directories = '{base}'",
            "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = off",
            "max_connections = 100",
            *settings,
        ]
        with (data / "postgresql.conf").open("a") as f:
            f.write("\n".join(conf) + "\n")
        if hba:
            with (data / "pg_hba.conf").open("a") as f:
                f.write("\n".join(hba) + "\n")
        cluster.start()
        return cluster

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _pg(self, tool: str, *args: str, timeout: float = 60) -> None:
        command = [str(self.bin_dir / tool), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.data.parent / "server.log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        # Stop, then start with the log file: a server that pg_ctl restart starts would keep
        # this process's pipes open.
        self.stop()
        self.start()

    def accepting(self) -> bool:
        """Whether the server accepts a connection now."""
        try:
            with psycopg.connect(self.dsn(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def wait_accepting(self, timeout: float = 30) -> float:
        """Until the server accepts connections; the monotonic time it first did."""
        wait_until(self.accepting, timeout, f"the cluster on port {self.port} to accept connections")
        return time.monotonic()

    def start_accepting(self) -> float:
        """Start the server; the monotonic time it first accepted a connection, which a poll
        from this thread sees while pg_ctl still waits to report it."""
        starting = threading.Thread(target=self.start)
        starting.start()
        try:
            return self.wait_accepting()
        finally:
            starting.join()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=30)
        shutil.rmtree(self.data.parent, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
