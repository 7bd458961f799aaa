"""The `jobtui` command run as a separate process, as people run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from jobtui.kernel import migrate as migrations

DOWN_DSN = "postgresql://postgres@127.0.0.1:1/test?connect_timeout=5"


def jobtui(dsn: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    if dsn is not None:
        env["JOBTUI_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout


def one(dsn: str, query: str, *params: Any) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def test_migrate(empty_dsn: str) -> None:
    version = migrations.code_version()
    out = ok(jobtui(empty_dsn, "migrate"))
    assert out.splitlines() == [f"applied {m.version:04d}_{m.name}" for m in migrations.available()] + [
        f"schema 'jobtui' is at version {version}"
    ]
    assert one(empty_dsn, "SELECT max(version) FROM jobtui.migration") == version
    assert ok(jobtui(empty_dsn, "migrate")).splitlines() == [f"schema 'jobtui' is at version {version}"]


def test_migrate_a_custom_schema(empty_dsn: str) -> None:
    out = ok(jobtui(empty_dsn, "--schema", "jobs_alt", "migrate"))
    assert "schema 'jobs_alt' is at version" in out
    job_id = int(ok(jobtui(empty_dsn, "--schema", "jobs_alt", "enqueue", "t")).strip())
    assert one(empty_dsn, "SELECT type FROM jobs_alt.job WHERE id = %s", job_id) == "t"
    assert one(empty_dsn, "SELECT to_regclass('jobtui.job')") is None


def test_enqueue_and_explain(dsn: str) -> None:
    out = ok(jobtui(dsn, "enqueue", "email.send", "--payload", '{"user_id": 42}', "--max-attempts", "3"))
    job_id = int(out.strip())
    assert out == f"{job_id}\n"
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT type, payload, max_attempts, status, run_at = created_at FROM jobtui.job WHERE id = %s", (job_id,)
        ).fetchone()
    assert row == ("email.send", {"user_id": 42}, 3, "ready", True)

    text = ok(jobtui(dsn, "job", str(job_id)))
    lines = text.splitlines()
    assert lines[0] == f"Job {job_id} (email.send): ready"
    assert lines[1].startswith("Ready: waiting for a worker since ")
    assert "0 of 3 attempts used" in lines[1]
    assert '  "user_id": 42' in lines

    data = json.loads(ok(jobtui(dsn, "job", str(job_id), "--json")))
    assert (data["id"], data["type"], data["status"], data["payload"]) == (
        job_id,
        "email.send",
        "ready",
        {"user_id": 42},
    )


def test_enqueue_with_a_delay(dsn: str) -> None:
    job_id = int(ok(jobtui(dsn, "enqueue", "t", "--delay", "5m")).strip())
    assert one(dsn, "SELECT run_at - created_at FROM jobtui.job WHERE id = %s", job_id) == timedelta(minutes=5)
    assert ok(jobtui(dsn, "job", str(job_id))).splitlines()[1].startswith("Waiting: will run ")


def test_enqueue_with_a_key_twice_prints_the_same_id(dsn: str) -> None:
    first = ok(jobtui(dsn, "enqueue", "t", "--key", "welcome:42", "--payload", '{"n": 1}'))
    second = ok(jobtui(dsn, "enqueue", "t", "--key", "welcome:42", "--payload", '{"n": 2}'))
    assert first == second and first.strip().isdigit()
    assert one(dsn, "SELECT count(*) FROM jobtui.job") == 1
    assert one(dsn, "SELECT payload FROM jobtui.job") == {"n": 1}
    assert "welcome:42" in ok(jobtui(dsn, "job", first.strip()))


@pytest.mark.parametrize(
    ("where", "args", "message"),
    [
        ("migrated", ["enqueue", "t", "--payload", "{nope"], "--payload is not valid JSON"),
        ("migrated", ["enqueue", "t", "--payload", '{"x": NaN}'], "payload is not JSON-serialisable"),
        ("migrated", ["enqueue", "", "--payload", "{}"], "bad job type"),
        ("migrated", ["enqueue", "t", "--delay", "soon"], "bad duration 'soon'"),
        ("migrated", ["enqueue", "t", "--delay=-5"], "must not be negative"),
        ("migrated", ["job", "424242"], "no job with id 424242"),
        ("down", ["enqueue", "t"], "cannot reach PostgreSQL at postgresql://postgres@127.0.0.1:1/test"),
        ("down", ["job", "1"], "cannot reach PostgreSQL"),
        ("down", ["migrate"], "cannot reach PostgreSQL"),
        ("empty", ["enqueue", "t"], "schema 'jobtui' is missing"),
        ("empty", ["job", "1"], "run `jobtui migrate`"),
    ],
)
def test_user_errors(request: pytest.FixtureRequest, where: str, args: list[str], message: str) -> None:
    target = {"migrated": "dsn", "down": "dsn", "empty": "empty_dsn"}[where]
    real: str = request.getfixturevalue(target)
    result = jobtui(DOWN_DSN if where == "down" else real, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("jobtui: error: ")
    assert message in lines[0]
    assert result.stdout == ""
    # Nothing was written.
    if target == "dsn":
        assert one(real, "SELECT count(*) FROM jobtui.job") == 0
    else:
        assert one(real, "SELECT count(*) FROM pg_namespace WHERE nspname = 'jobtui'") == 0


def test_password_is_not_printed() -> None:
    result = jobtui("postgresql://postgres:s3cret@127.0.0.1:1/test?connect_timeout=5", "enqueue", "t")
    assert result.returncode == 2
    assert "s3cret" not in result.stderr and "***" in result.stderr


@pytest.mark.parametrize(
    "command", [[], ["stats"], ["migrate"], ["dead"], ["enqueue", "t"], ["worker", "--app", "jobtui.cli.demo:jobs"]]
)
def test_no_database_given_stops_with_one_line(command: list[str]) -> None:
    result = jobtui(None, *command)
    assert result.returncode == 2
    assert result.stderr == (
        "jobtui: error: no database given: set JOBTUI_DSN or pass --dsn; `jobtui demo` runs on an embedded server\n"
    )
    assert result.stdout == ""


def test_global_options_after_the_subcommand(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrations.migrate(conn, "jobs_after")
    job = ok(jobtui(None, "enqueue", "after.t", "--dsn", dsn, "--schema", "jobs_after", "--actor", "me")).strip()
    assert one(dsn, "SELECT type FROM jobs_after.job WHERE id = %s", int(job)) == "after.t"
    stats = json.loads(ok(jobtui(None, "stats", "--json", "--dsn", dsn, "--schema", "jobs_after")))
    assert stats["totals"]["ready"] == 1
    # Before the subcommand still works, and the subcommand's own --schema keeps its meaning.
    assert (
        json.loads(ok(jobtui(None, "--dsn", dsn, "--schema", "jobs_after", "stats", "--json")))["totals"]["ready"] == 1
    )
    refused = jobtui(dsn, "stats", "--dsn")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--dsn" in refused.stderr
