"""Every CLI command that prints job data, on a real database holding hostile rows (issue 16).

What they print holds no escape, no C1 or bidi control and nothing read as markup, and
shows each field's visible form; `--json` keeps the exact text; errors that echo an input
cut it; the worker's log lines cannot be forged.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings

from jobtui import Client
from jobtui.kernel.explain import first_line
from jobtui.reads.metrics import snapshot
from tests.apps.hostile_app import CRASHES, REFUSED
from tests.cli import Ran, jobtui
from tests.hostile import Texts, assert_safe, seed, texts, visible
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
Conn = psycopg.Connection[Any]


def shown(dsn: str, *args: str) -> str:
    """What a command that succeeds prints, checked safe."""
    ran = jobtui(dsn, *args)
    assert ran.code == 0 and ran.err == "", ran
    assert_safe(ran.out, keep="\n")
    return ran.out


def error_line(ran: Ran) -> str:
    """The one line a user's mistake prints, checked safe."""
    assert ran.code == 2, ran
    assert len(ran.err.splitlines()) == 1 and ran.err.startswith("jobtui: error: "), ran
    assert_safe(ran.err, keep="\n")
    return ran.err.strip()


WIDE = 6000  # COLUMNS: no table cell wraps, so each field is printed in one piece


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=texts())
def test_every_text_output_shows_hostile_rows_escaped_and_literally(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch, t: Texts
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDE))
    conn.execute("TRUNCATE jobtui.job, jobtui.lease_expiry, jobtui.schedule, jobtui.audit RESTART IDENTITY")
    ids = seed(conn, t)
    fingerprints = {g.fingerprint for g in snapshot(conn).dead}

    stats = shown(dsn, "stats")
    for value in (t.type, t.worker, t.schedule, *fingerprints):
        assert visible(value) in stats, value
    dead = shown(dsn, "dead")
    assert shown(dsn, "dead", "--type", t.type) == dead
    for value in (t.type, *fingerprints):
        assert visible(value) in dead
    ready = shown(dsn, "job", str(ids.ready))
    assert f"Job {ids.ready} ({visible(t.type)}): ready" in ready and f"  key           {visible(t.key)}" in ready
    assert f"  worker        {visible(t.worker)}" in shown(dsn, "job", str(ids.running))
    died = shown(dsn, "job", str(ids.dead))
    # The first line of the stored error (seed's "ERROR\nTraceback line two ERROR"), as the job view takes it.
    stored = t.error + "\nTraceback line two " + t.error
    assert f"  last error    {visible(first_line(stored))}" in died
    audit = shown(dsn, "audit")
    assert visible(t.actor) in audit and visible(f"type={t.type} error={t.error}") in audit
    schedules = shown(dsn, "schedule", "list")
    assert visible(t.schedule) in schedules and visible(t.type) in schedules
    assert "would requeue 2 job(s)" in shown(dsn, "requeue", "--type", t.type, "--dry-run")
    assert "killed 1 lease(s)" in shown(dsn, "kill-lease", str(ids.running))
    assert "cancelled 1 job(s)" in shown(dsn, "cancel", str(ids.running))
    # The cancelled job is failed now: three to requeue.
    assert "requeued 3 job(s)" in shown(dsn, "--actor", t.actor, "requeue", "--type", t.type)
    if not t.type.strip():  # a blank name (a lone "\r") is no type to enqueue: one line says so
        assert "bad job type" in error_line(jobtui(dsn, "enqueue", t.type, "--key", t.key + "2"))
        return
    enqueued = shown(dsn, "enqueue", t.type, "--key", t.key + "2")
    assert enqueued.strip().isdigit()


@pytest.mark.parametrize("error", ["[/]", "[bold red]red[/]", "[link=http://evil.example]click[/link]", "[/red"])
def test_stats_and_dead_print_markup_in_data_as_written_in_a_colour_terminal(dsn: str, conn: Conn, error: str) -> None:
    seed(conn, Texts(f"t{error}", "w[/]", error, "k", f"s{error}", "a"))
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL", "NO_COLOR")}
    env |= {"JOBTUI_DSN": dsn, "FORCE_COLOR": "1", "COLUMNS": "400"}  # Rich writes colours and links
    for args in (["stats"], ["dead"], ["audit"], ["schedule", "list"]):
        ran = subprocess.run(
            [sys.executable, "-m", "jobtui.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert ran.returncode == 0 and ran.stderr == "", (args, ran.stderr)
        plain = re.sub(r"\x1b\[[0-9;]*m", "", ran.stdout)  # jobtui's own styles: bold, dim
        assert error in plain, (args, plain)
        assert "\x1b]" not in ran.stdout  # no hyperlink, no title
        assert not re.search(r"\x1b\[[0-9;]*3[1-7][;m]", ran.stdout)  # no colour from data
        assert_safe(plain, keep="\n")


def test_json_output_keeps_the_exact_text(dsn: str, conn: Conn) -> None:
    t = Texts("t\x1b]0;x\x07", "w\u202e", "[/]\x9b2J\nline", "k\n", "s[/]", "a\x1b[2J")
    ids = seed(conn, t)
    stats = json.loads(jobtui(dsn, "stats", "--json").out)
    assert t.type in {row["type"] for row in stats["by_type"]}
    dead = json.loads(jobtui(dsn, "dead", "--json").out)
    assert {g["type"] for g in dead} == {t.type}
    job = json.loads(jobtui(dsn, "job", str(ids.dead), "--json").out)
    assert (job["type"], job["locked_by"], job["last_error"]) == (
        t.type,
        t.worker,
        f"{t.error}\nTraceback line two {t.error}",
    )
    assert json.loads(jobtui(dsn, "audit", "--json").out)[0]["actor"] == t.actor
    assert json.loads(jobtui(dsn, "schedule", "list", "--json").out)[0]["name"] == t.schedule


LONG = "x" * 100_000


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["enqueue", LONG], f"bad job type '{'x' * 60}'... (100,000 characters): give a non-empty name"),
        (["enqueue", "t", "--key", LONG], f"bad idempotency key '{'x' * 60}'... (100,000 characters)"),
        (["enqueue", "t", "--delay", LONG], f"bad duration '{'x' * 60}'... (100,000 characters)"),
        (["requeue", LONG], f"'{'x' * 60}'... (100,000 characters) is not a job id"),
        (["dead", "--error", "(" + LONG], "... (100,001 characters): give at most 2,000 characters"),
        (["dead", "--error", "(" + "x" * 1999], "(2,000 characters): invalid regular expression: parentheses"),
        (["schedule", "pause", LONG], "characters cut] ..."),  # the scheduler's message, cut at the CLI
        (["schedule", "add", LONG, "--cron", "* * * * *", "--type", "t"], "(100,000 characters): give 1 to 200"),
        (["enqueue", "t\x1b]0;x\x07" + LONG], "bad job type 't\\x1b]0;x\\x07xxx"),
    ],
)
def test_errors_that_echo_an_input_cut_it_to_a_readable_length(dsn: str, args: list[str], fragment: str) -> None:
    line = error_line(jobtui(dsn, *args))
    assert fragment in line, line
    assert len(line) < 600


def test_worker_log_lines_are_escaped_and_cannot_be_forged(dsn: str, tmp_path: Path) -> None:
    with Client(dsn) as queue:
        refused, crashed = queue.enqueue(REFUSED), queue.enqueue(CRASHES)
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    env |= {"JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "worker.log"
    with log.open("w") as log_file:
        worker = subprocess.Popen(
            [sys.executable, "-m", "jobtui.cli", "worker", "--app", "tests.apps.hostile_app:jobs", "--no-scheduler"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log_file, text=True,
        )  # fmt: skip
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:

            def finished() -> bool:
                assert worker.poll() is None, log.read_text()
                row = conn.execute(
                    "SELECT count(*) FROM jobtui.job WHERE id = ANY(%s) AND status IN ('failed', 'dead')",
                    [[refused, crashed]],
                ).fetchone()
                return row == (2,)

            wait_until(finished, 60, "both jobs failed", log.read_text)
        # The dead job's callback runs after its outcome is written: its line comes later.
        dead_line = f"job {crashed} ({visible(CRASHES)}) is dead"
        wait_until(lambda: dead_line in log.read_text(), 30, "the dead job's line", log.read_text)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    err = log.read_text()
    assert worker.returncode == 0, err
    assert_safe(err, keep="\n")
    lines = err.splitlines()
    log_line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) jobtui\.")
    for entry in lines:  # a log line, or a line of an indented traceback
        assert log_line.match(entry) or entry.startswith("  "), entry
    assert not any(entry.startswith("2025-01-01") for entry in lines)  # the forged line is not a line
    assert "  2025-01-01 00:00:00,000 ERROR jobtui.worker: forged line" in lines  # but in the traceback
    assert any(f"({visible(REFUSED)}) failed permanently" in e and "no \\x9b2J[bold red]way[/]" in e for e in lines)
    assert any(f"job {crashed} ({visible(CRASHES)}) is dead" in e for e in lines), err
    assert "  ValueError: callback for crash\\x1b[2J\\x1b[H\\u202e" in lines, err  # escaped, on its lines
