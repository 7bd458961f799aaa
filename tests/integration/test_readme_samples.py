"""The code of the README's first job and of docs/getting-started.md, run as written: the
handler module, migrate, a worker, the enqueues, effects done once in sync and async
handlers, and a Worker inside a program of the reader's own."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobtui
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
# The example database of the pages, replaced by the test's own.
EXAMPLE_DSN = "postgresql://app_owner@localhost:5432/app"


def block(page: Path, language: str, marker: str) -> str:
    """The one ```language block of `page` that holds `marker`."""
    blocks: list[str] = re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"{len(found)} {language} blocks of {page.name} hold {marker!r}"
    return found[0]


def jobtui_cli(line: str, env: dict[str, str], cwd: Path) -> str:
    """A `jobtui ...` line of a page, run with this environment's jobtui; its output."""
    args = shlex.split(line.split("#", 1)[0])
    assert args[0] == "jobtui", line
    result = subprocess.run([sys.executable, "-m", "jobtui.cli", *args[1:]], env=env, cwd=cwd,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def statuses(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT status, count(*) FROM jobtui.job WHERE type <> 'jobtui.archive' GROUP BY 1")
        return {status: n for status, n in rows}


def environment(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return {**env, "JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1"}


def stop(proc: subprocess.Popen[Any]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


def test_the_readmes_first_job_runs_as_written(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = environment(dsn)
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "jobs.py").write_text(block(README, "python", "# myapp/jobs.py"))
    setup = block(README, "sh", "jobtui migrate").splitlines()
    assert setup[1].startswith("export JOBTUI_DSN=")  # the environment above
    assert "at version" in jobtui_cli(setup[2], env, tmp_path)  # the template migrated it already

    start, enqueue = block(README, "sh", "jobtui worker").splitlines()
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        args = shlex.split(start)[1:]
        worker = subprocess.Popen([sys.executable, "-m", "jobtui.cli", *args], cwd=tmp_path, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)  # fmt: skip
        try:
            job_id = int(jobtui_cli(enqueue, env, tmp_path))
            monkeypatch.setenv("JOBTUI_DSN", dsn)
            exec(block(README, "python", "jobtui.Client()"), {})
            wait_until(lambda: statuses(dsn) == {"done": 2}, 30, "both jobs done", log.read_text)
        finally:
            assert stop(worker) == 0, log.read_text()
    assert log.read_text().count("welcome mail to user 42") == 2
    assert f"Job {job_id} (email.send): done" in jobtui_cli(f"jobtui job {job_id}", env, tmp_path)


def test_effects_once_and_a_worker_of_your_own_run_as_written(dsn: str, tmp_path: Path) -> None:
    """Three jobs of each of the sync and the async handler, one effect key each: two effects."""
    env = environment(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE outbox (user_id int, kind text)")
    handlers = block(GETTING_STARTED, "python", "def record_welcome(")
    handlers += "\n" + block(GETTING_STARTED, "python", "def record_welcome_async(")
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "jobs.py").write_text(handlers)
    (tmp_path / "run.py").write_text(block(GETTING_STARTED, "python", "# run.py"))
    client = jobtui.Client(dsn)
    for job_type in ("welcome.record", "welcome.record_async"):
        for _ in range(3):
            client.enqueue(job_type, {"user_id": 7})
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        program = subprocess.Popen([sys.executable, "run.py"], cwd=tmp_path, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_until(lambda: statuses(dsn) == {"done": 6}, 30, "six jobs done", log.read_text)
        finally:
            assert stop(program) == 0, log.read_text()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (2,)


def test_the_enqueue_examples_run_as_written(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE users (id int PRIMARY KEY)")
    code = block(GETTING_STARTED, "python", "client.enqueue_many(")
    assert EXAMPLE_DSN in code
    exec(code.replace(EXAMPLE_DSN, dsn), {})
    assert statuses(dsn) == {"ready": 10_003}
