"""`jobtui worker --log-format json` (and JOBTUI_LOG_FORMAT): one JSON object per line with
the job's fields, its data exact; text lines escape the same data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg

from tests.waits import wait_until
from tests.workers import APP_TABLES, WorkerProcess

APP = "tests.apps.worker_app:jobs"
HOSTILE = "\x1b]0;owned\x07 \u202eFORGED\t2026 ERROR"


def _worker(dsn: str, tmp_path: Path, name: str, *args: str, env_format: str | None = None) -> WorkerProcess:
    env = {**os.environ, "JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    env.pop("JOBTUI_LOG_FORMAT", None)
    if env_format:
        env["JOBTUI_LOG_FORMAT"] = env_format
    return WorkerProcess(name, ["--lease", "2s", "--no-scheduler", *args], env, tmp_path / f"{name}.log", app=APP)


def _failed_job(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(APP_TABLES)
        row = conn.execute(
            "INSERT INTO jobtui.job (type, payload, queue) VALUES ('permanent', %s, 'mail') RETURNING id",
            (json.dumps({"why": HOSTILE}),),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_json_log_lines_carry_the_job_and_its_exact_data(dsn: str, tmp_path: Path) -> None:
    job_id = _failed_job(dsn)
    worker = _worker(dsn, tmp_path, "J", "--log-format", "json")
    try:
        worker.wait_log("failed permanently", 15)
    finally:
        worker.kill()
    lines = worker.log().splitlines()
    entries = [json.loads(text) for text in lines]  # every line is one JSON object
    failed = next(e for e in entries if "failed permanently" in e["message"])
    assert failed["level"] == "WARNING" and failed["logger"] == "jobtui.worker"
    assert (failed["job_id"], failed["type"], failed["attempt"]) == (job_id, "permanent", 1)
    assert (failed["worker"], failed["queue"], failed["schema"]) == ("J", "mail", "jobtui")
    assert HOSTILE in failed["message"]  # exact, once decoded
    assert not any("\x1b" in text for text in lines)  # escaped on the wire
    assert any(e["message"].startswith("worker J started") for e in entries)


def test_text_stays_the_default_and_escapes_job_data(dsn: str, tmp_path: Path) -> None:
    _failed_job(dsn)
    worker = _worker(dsn, tmp_path, "T")
    try:
        worker.wait_log("failed permanently", 15)
    finally:
        worker.kill()
    text = worker.log()
    line = next(x for x in text.splitlines() if "failed permanently" in x)
    assert "\\x1b]0;owned\\x07 \\u202eFORGED\\t2026" in line
    assert "\x1b" not in text and "\t" not in text and "\u202e" not in text


def test_the_environment_chooses_json_and_a_bad_value_is_one_line(dsn: str, tmp_path: Path) -> None:
    _failed_job(dsn)
    worker = _worker(dsn, tmp_path, "E", env_format="json")
    try:
        wait_until(lambda: "started" in worker.log(), 15, "the worker to start", worker.log)
    finally:
        worker.kill()
    assert json.loads(worker.log().splitlines()[0])["level"] == "INFO"
    bad = _worker(dsn, tmp_path, "B", env_format="yaml")
    assert bad.wait_exit(15) == 2
    assert bad.log().strip() == "jobtui: error: unknown log format 'yaml' (from JOBTUI_LOG_FORMAT): use text or json"
