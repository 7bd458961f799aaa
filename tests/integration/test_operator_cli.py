"""The operator commands run as a separate process, as people run them: stats, dead,
requeue, kill-lease, cancel, schedule pause/resume, audit, metrics, worker --metrics-port.

Every run is checked for a clean stderr (never a traceback); user mistakes exit with 2,
print one line `jobtui: error: ...` and change nothing.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobtui import Client
from tests.cli import clean_env, popen_cli, run_cli
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
Conn = psycopg.Connection[Any]


def sigint_as_in_a_terminal() -> None:
    """A child's Ctrl-C at its default, as in a terminal: a test run started in the background
    or under nohup ignores SIGINT, and a child would inherit that and never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def jobtui(dsn: str, *args: str, actor: str = "tester") -> subprocess.CompletedProcess[str]:
    result = run_cli("--actor", actor, *args, env=clean_env(dsn))
    assert "Traceback" not in result.stderr, result.stderr
    return result


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def user_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a user mistake prints; exit status 2."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobtui: error: "), result.stderr
    return lines[0]


def statuses(conn: Conn) -> dict[int, tuple[str, int]]:
    rows = conn.execute("SELECT id, status, attempts FROM jobtui.job").fetchall()
    return {int(r[0]): (str(r[1]), int(r[2])) for r in rows}


def audit_rows(conn: Conn) -> list[tuple[str, str, str | None, list[int], int]]:
    rows = conn.execute("SELECT actor, action, target, job_ids, rows FROM jobtui.audit ORDER BY id").fetchall()
    return [(r[0], r[1], r[2], sorted(r[3]), r[4]) for r in rows]


@dataclass
class Seeded:
    running: int
    ready: int
    k17: int
    k42: int
    timeout: int
    failed: int


def seed(dsn: str, conn: Conn) -> Seeded:
    """email: 1 ready (100 s late), 1 running (w1), 2 dead (KeyError); report: 1 dead, 1 failed."""
    with Client(dsn) as q:
        running = q.enqueue("email")
        assert [j.id for j in q.claim(["email"], worker="w1", limit=1)] == [running]
        ready = q.enqueue("email")
        conn.execute("UPDATE jobtui.job SET run_at = now() - interval '100 seconds' WHERE id = %s", (ready,))
        finished = []
        for job_type, status, attempts, error in (
            ("email", "dead", 3, "KeyError: 'user 17'\nTraceback (most recent call last): ..."),
            ("email", "dead", 25, "KeyError: 'user 42'"),
            ("report", "dead", 5, "TimeoutError: upstream took 30s"),
            ("report", "failed", 1, "Permanent: invalid address 12"),
        ):
            job_id = q.enqueue(job_type)
            conn.execute(
                "UPDATE jobtui.job SET status = %s, attempts = %s, last_error = %s, finished_at = now() WHERE id = %s",
                (status, attempts, error, job_id),
            )
            finished.append(job_id)
    return Seeded(running, ready, *finished)


@pytest.fixture
def seeded(dsn: str, conn: Conn) -> Seeded:
    return seed(dsn, conn)


# -- stats and dead -----------------------------------------------------------------------


def test_stats_text(dsn: str, seeded: Seeded) -> None:
    out = ok(jobtui(dsn, "stats"))
    header = out.splitlines()[0]
    assert header.startswith("oldest ready 1m4")  # 100 s and the few since: 1m40s..1m49s
    for figure in ("ready 1 (1 due)", "running 1", "dead 3", "failed 1", "done/min 0", "missed slots 0"):
        assert figure in header, (figure, header)
    cells = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
        for line in out.splitlines()
        if line.count("│") == 8
    }
    email, report = cells["email"], cells["report"]
    assert email[:3] == ["email", "1", "1"] and email[3].startswith("1m4") and email[4:] == ["1", "2", "0"]
    assert report == ["report", "0", "0", "-", "0", "1", "1"]
    assert "KeyError: 'user <n>'" in out and "Permanent: invalid address <n>" in out


def test_stats_text_shows_throughput_and_schedules(dsn: str, conn: Conn, seeded: Seeded) -> None:
    with Client(dsn) as q:
        done = q.enqueue("email")
    conn.execute(
        "UPDATE jobtui.job SET status = 'done', attempts = 2, finished_at = now() - interval '5 seconds' WHERE id = %s",
        (done,),
    )
    ok(jobtui(dsn, "schedule", "add", "nightly", "--cron", "0 3 * * *", "--type", "report"))
    ok(jobtui(dsn, "schedule", "add", "hourly", "--cron", "0 * * * *", "--type", "email"))
    ok(jobtui(dsn, "schedule", "pause", "hourly"))
    conn.execute("UPDATE jobtui.schedule SET missed_count = 3 WHERE name = 'nightly'")
    out = ok(jobtui(dsn, "stats"))
    assert "missed slots 3" in out.splitlines()[0]
    assert "attempts used by jobs done in the last hour: 2: 1" in out
    schedules = {
        cells[0]: cells
        for cells in ([c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.count("│") == 9)
        if cells[0] in ("nightly", "hourly")
    }
    # missed, backfilled, skipped, state
    assert schedules["nightly"][1:3] == ["report", "0 3 * * *"]
    assert schedules["nightly"][4:] == ["3", "0", "0", "active"]
    assert schedules["hourly"][3:] == ["-", "0", "0", "0", "paused"]
    # The attempts of the last hour's finished jobs, by type (the seeded dead ones too).
    attempts = {
        cells[0]: cells[1:]
        for cells in ([c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.count("│") == 4)
        if cells and cells[0] in ("email", "report")
    }
    assert attempts == {"email": ["2: 1", "3: 1, 25: 1"], "report": ["-", "1: 1, 5: 1"]}


def test_stats_json(dsn: str, seeded: Seeded) -> None:
    data = json.loads(ok(jobtui(dsn, "stats", "--json")))
    totals = data["totals"]
    assert (totals["ready"], totals["ready_due"], totals["running"], totals["dead"], totals["failed"]) == (
        1,
        1,
        1,
        3,
        1,
    )
    assert 100 <= totals["oldest_ready_age"] < 110
    types = {t["type"]: t for t in data["by_type"]}
    assert {k: (t["ready"], t["running"], t["dead"], t["failed"]) for k, t in types.items()} == {
        "email": (1, 1, 2, 0),
        "report": (0, 0, 1, 1),
    }
    assert types["report"]["oldest_ready_age"] is None
    assert [(g["type"], g["worker"], g["jobs"], g["expired"]) for g in data["running"]] == [("email", "w1", 1, 0)]
    groups = {(g["status"], g["type"], g["fingerprint"]): (g["jobs"], g["latest_job_id"]) for g in data["dead"]}
    assert groups == {
        ("dead", "email", "KeyError: 'user <n>'"): (2, seeded.k42),
        ("dead", "report", "TimeoutError: upstream took <n>s"): (1, seeded.timeout),
        ("failed", "report", "Permanent: invalid address <n>"): (1, seeded.failed),
    }


def test_stats_watch_until_interrupted(dsn: str, seeded: Seeded) -> None:
    proc = popen_cli("stats", "--json", "--watch", "0.2", env=clean_env(dsn), preexec_fn=sigint_as_in_a_terminal)
    documents = threading.Semaphore(0)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line == "}\n":
                documents.release()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert documents.acquire(timeout=20) and documents.acquire(timeout=20), "".join(lines)
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    reader.join(5)
    assert proc.returncode == 130
    assert "Traceback" not in stderr
    first = json.loads("".join(lines[: lines.index("}\n") + 1]))
    assert first["totals"]["dead"] == 3


def test_dead_grouped_and_filtered(dsn: str, seeded: Seeded) -> None:
    out = ok(jobtui(dsn, "dead"))
    for fingerprint in ("KeyError: 'user <n>'", "TimeoutError: upstream took <n>s", "Permanent: invalid address <n>"):
        assert fingerprint in out
    groups = json.loads(ok(jobtui(dsn, "dead", "--json")))
    assert sorted((g["status"], g["type"], g["jobs"]) for g in groups) == [
        ("dead", "email", 2),
        ("dead", "report", 1),
        ("failed", "report", 1),
    ]
    report = json.loads(ok(jobtui(dsn, "dead", "--type", "report", "--json")))
    assert sorted(g["fingerprint"] for g in report) == [
        "Permanent: invalid address <n>",
        "TimeoutError: upstream took <n>s",
    ]
    keyerror = json.loads(ok(jobtui(dsn, "dead", "--error", "keyerror", "--json")))
    assert [(g["fingerprint"], g["jobs"], g["latest_attempts"]) for g in keyerror] == [("KeyError: 'user <n>'", 2, 25)]
    text = ok(jobtui(dsn, "dead", "--type", "email"))
    assert "KeyError: 'user <n>'" in text and "TimeoutError" not in text
    assert ok(jobtui(dsn, "dead", "--type", "email", "--error", "Timeout")).strip() == "no dead or failed jobs match"


# -- changes, each audited ----------------------------------------------------------------


def test_requeue_by_ids(dsn: str, conn: Conn, seeded: Seeded) -> None:
    before = statuses(conn)
    # A job that is not dead or failed among them: nothing at all changes, as for an unknown id.
    line = user_error(jobtui(dsn, "requeue", str(seeded.k17), str(seeded.ready), actor="alice"))
    assert line == (
        f"jobtui: error: job {seeded.ready} is ready, not dead or failed: nothing was changed;"
        " give only dead or failed jobs"
    )
    assert statuses(conn) == before and audit_rows(conn) == []
    out = ok(jobtui(dsn, "requeue", str(seeded.k17), actor="alice"))
    assert out.splitlines() == ["requeued 1 job(s)"]
    after = statuses(conn)
    assert after[seeded.k17] == ("ready", 0)
    assert {k: v for k, v in after.items() if k != seeded.k17} == {k: v for k, v in before.items() if k != seeded.k17}
    assert audit_rows(conn) == [("alice", "requeue", f"jobs {seeded.k17}", [seeded.k17], 1)]
    row = conn.execute(
        "SELECT errors -> -1 ->> 'kind', errors -> -1 ->> 'worker' FROM jobtui.job WHERE id = %s", (seeded.k17,)
    ).fetchone()
    assert row == ("requeued", "alice")


def test_requeue_matching_dry_run_then_for_real(dsn: str, conn: Conn, seeded: Seeded) -> None:
    before = statuses(conn)
    out = ok(jobtui(dsn, "requeue", "--type", "email", "--error", r"user \d+", "--dry-run", actor="bob"))
    assert out.strip() == f"would requeue 2 job(s): {seeded.k17}, {seeded.k42} (dry run, nothing changed)"
    assert statuses(conn) == before
    assert audit_rows(conn) == [("bob", "requeue-dry-run", r"type=email error=user \d+", [], 2)]
    # PostgreSQL's own syntax (\m: start of a word) is accepted: PostgreSQL does the matching.
    assert ok(jobtui(dsn, "requeue", "--error", r"\mtimeouterror", "--dry-run")).strip().startswith("would requeue 1 ")
    assert ok(jobtui(dsn, "requeue", "--all", "--dry-run")).strip().startswith("would requeue 4 ")
    out = ok(jobtui(dsn, "requeue", "--type", "email", "--error", r"user \d+", actor="bob"))
    assert out.strip() == "requeued 2 job(s)"
    after = statuses(conn)
    assert (after[seeded.k17], after[seeded.k42]) == (("ready", 0), ("ready", 0))
    assert {k: v for k, v in after.items() if k not in (seeded.k17, seeded.k42)} == {
        k: v for k, v in before.items() if k not in (seeded.k17, seeded.k42)
    }
    assert audit_rows(conn)[-1] == ("bob", "requeue", r"type=email error=user \d+", sorted([seeded.k17, seeded.k42]), 2)
    # Nothing left to match: a real run with no rows is audited too, with 0 rows.
    assert (
        ok(jobtui(dsn, "requeue", "--type", "email", "--error", "KeyError", actor="bob")).strip() == "requeued 0 job(s)"
    )
    assert audit_rows(conn)[-1] == ("bob", "requeue", "type=email error=KeyError", [], 0)


def test_kill_lease(dsn: str, conn: Conn, seeded: Seeded) -> None:
    out = ok(jobtui(dsn, "kill-lease", str(seeded.running), actor="carol"))
    assert out.strip() == "killed 1 lease(s): 1 ready again"
    row = conn.execute(
        "SELECT status, locked_until, last_error FROM jobtui.job WHERE id = %s", (seeded.running,)
    ).fetchone()
    assert row == ("ready", None, "lease killed by carol during attempt 1 of 25")
    assert audit_rows(conn) == [("carol", "kill-lease", f"jobs {seeded.running}", [seeded.running], 1)]
    # Now it is ready: nothing to kill, said in one line (exit 2, as for requeue and cancel).
    line = user_error(jobtui(dsn, "kill-lease", str(seeded.running), actor="carol"))
    assert line == f"jobtui: error: job {seeded.running} is ready, not running: nothing to kill"
    assert len(audit_rows(conn)) == 1


def test_commands_on_jobs_in_another_state_change_nothing(dsn: str, conn: Conn, seeded: Seeded) -> None:
    before = statuses(conn)
    cases = [
        (["requeue", str(seeded.ready)], f"job {seeded.ready} is ready, not dead or failed: nothing to requeue"),
        (["cancel", str(seeded.k17)], f"job {seeded.k17} is dead, not ready or running: nothing to cancel"),
        (
            ["kill-lease", str(seeded.ready), str(seeded.k42)],
            f"jobs {seeded.ready} (ready) and {seeded.k42} (dead) are not running: nothing to kill",
        ),
        (
            ["cancel", str(seeded.ready), str(seeded.failed)],
            f"job {seeded.failed} is failed, not ready or running: nothing was changed; give only ready or running"
            " jobs",
        ),
    ]
    for args, message in cases:
        assert user_error(jobtui(dsn, *args)) == f"jobtui: error: {message}", args
        assert statuses(conn) == before, args
    assert audit_rows(conn) == []


def test_cancel(dsn: str, conn: Conn, seeded: Seeded) -> None:
    out = ok(jobtui(dsn, "cancel", str(seeded.ready), str(seeded.running), actor="dave"))
    assert out.strip() == "cancelled 2 job(s)"
    rows = conn.execute(
        "SELECT id, status, last_error, finished_at IS NOT NULL FROM jobtui.job WHERE id = ANY(%s) ORDER BY id",
        ([seeded.ready, seeded.running],),
    ).fetchall()
    assert sorted(rows) == sorted(
        [(seeded.ready, "failed", "cancelled by dave", True), (seeded.running, "failed", "cancelled by dave", True)]
    )
    ids = sorted([seeded.ready, seeded.running])
    assert audit_rows(conn) == [("dave", "cancel", f"jobs {seeded.ready},{seeded.running}", ids, 2)]


def test_schedule_pause_resume_and_the_audit_listing(dsn: str, conn: Conn) -> None:
    ok(jobtui(dsn, "schedule", "add", "nightly", "--cron", "0 3 * * *", "--type", "report", actor="erin"))
    assert ok(jobtui(dsn, "schedule", "pause", "nightly", actor="erin")).strip() == "schedule 'nightly' paused"
    paused = conn.execute("SELECT paused FROM jobtui.schedule WHERE name = 'nightly'").fetchone()
    assert paused == (True,)
    assert (
        ok(jobtui(dsn, "schedule", "pause", "nightly", actor="erin")).strip() == "schedule 'nightly' was already paused"
    )
    assert ok(jobtui(dsn, "schedule", "resume", "nightly", actor="frank")).strip() == "schedule 'nightly' resumed"
    assert audit_rows(conn) == [
        ("erin", "schedule-add", "schedule nightly", [], 1),
        ("erin", "schedule-pause", "schedule nightly", [], 1),
        ("erin", "schedule-pause", "schedule nightly", [], 0),
        ("frank", "schedule-resume", "schedule nightly", [], 1),
    ]
    entries = json.loads(ok(jobtui(dsn, "audit", "--json")))
    assert [(e["actor"], e["action"], e["rows"]) for e in entries] == [
        ("frank", "schedule-resume", 1),
        ("erin", "schedule-pause", 0),
        ("erin", "schedule-pause", 1),
        ("erin", "schedule-add", 1),
    ]
    assert [e["id"] for e in entries] == sorted((e["id"] for e in entries), reverse=True)
    assert len(json.loads(ok(jobtui(dsn, "audit", "--limit", "1", "--json")))) == 1
    text = ok(jobtui(dsn, "audit"))
    assert "frank" in text and "schedule-resume" in text and "schedule nightly" in text


def test_audit_json_after_queue_actions(dsn: str, conn: Conn, seeded: Seeded) -> None:
    ok(jobtui(dsn, "requeue", str(seeded.timeout), actor="gina"))
    ok(jobtui(dsn, "cancel", str(seeded.ready), actor="hank"))
    entries = json.loads(ok(jobtui(dsn, "audit", "--json")))
    assert [(e["actor"], e["action"], e["target"], e["job_ids"], e["rows"]) for e in entries] == [
        ("hank", "cancel", f"jobs {seeded.ready}", [seeded.ready], 1),
        ("gina", "requeue", f"jobs {seeded.timeout}", [seeded.timeout], 1),
    ]


# -- mistakes -----------------------------------------------------------------------------


MISTAKES = [
    (["requeue", "999999"], "no job with id 999999; nothing was changed"),
    (["requeue", "<k17>", "999998", "999999"], "no job with id 999998, 999999; nothing was changed"),
    (["kill-lease", "<running>", "999999"], "no job with id 999999; nothing was changed"),
    (["cancel", "999999", "<ready>"], "no job with id 999999; nothing was changed"),
    (["requeue", "--error", "("], "bad --error pattern '('"),
    # Python accepts it, PostgreSQL (which matches) does not: still a user error, not exit 1.
    (["requeue", "--type", "email", "--error", "(?P<n>x)", "--dry-run"], "bad --error pattern '(?P<n>x)'"),
    (["requeue", "--error", "a{2,1}"], "bad --error pattern 'a{2,1}'"),
    (["dead", "--error", "[unclosed"], "bad --error pattern '[unclosed'"),
    (["requeue"], "say which jobs: ids, --type T, --error PATTERN, or --all"),
    (["requeue", "--dry-run"], "say which jobs: ids, --type T, --error PATTERN, or --all"),
    (["requeue", "<k17>", "--type", "email"], "give job ids, or --type/--error/--all, not both"),
    (["schedule", "pause", "nope"], "no schedule named 'nope'"),
]


def test_mistakes_change_nothing(dsn: str, conn: Conn, seeded: Seeded) -> None:
    """One database for all the cases: each must leave every job and the audit as they were."""
    before = statuses(conn)
    ids = {"<k17>": seeded.k17, "<running>": seeded.running, "<ready>": seeded.ready}
    for args, message in MISTAKES:
        line = user_error(jobtui(dsn, *(str(ids.get(a, a)) for a in args)))
        assert message in line, (args, line)
        assert statuses(conn) == before, args
        assert audit_rows(conn) == [], args


def test_a_job_id_that_is_not_a_number(dsn: str, seeded: Seeded) -> None:
    result = jobtui(dsn, "requeue", "abc")
    assert result.returncode == 2
    assert "'abc' is not a job id (a whole number)" in result.stderr


# -- metrics ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape_until_up(
    port: int, proc: subprocess.Popen[str], timeout: float = 20
) -> dict[tuple[str, tuple[Any, ...]], float]:
    def metrics() -> str:
        assert proc.poll() is None, proc.communicate()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            return ""  # not listening yet

    text = wait_until(metrics, timeout, f"the metrics endpoint on port {port}")
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return samples


def scraped_then_stopped(
    port: int, proc: subprocess.Popen[str], stop: signal.Signals, timeout: float
) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], str]:
    """What `proc` serves on `port` once it is up; then `proc` stopped by `stop`, which it must
    take as a clean end. Its standard output, too."""
    try:
        samples = scrape_until_up(port, proc)
    finally:
        proc.send_signal(stop)
        stdout, stderr = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    return samples, stdout


def test_metrics_command_serves_until_stopped(dsn: str, seeded: Seeded) -> None:
    port = free_port()
    args = ("metrics", "--port", str(port), "--addr", "127.0.0.1")
    proc = popen_cli(*args, env=clean_env(dsn), preexec_fn=sigint_as_in_a_terminal)
    samples, stdout = scraped_then_stopped(port, proc, signal.SIGINT, 20)
    assert stdout.startswith(f"serving Prometheus metrics on http://127.0.0.1:{port}/metrics")
    assert samples["jobtui_up", ()] == 1
    assert samples["jobtui_jobs", (("status", "dead"), ("type", "email"))] == 2
    assert samples["jobtui_jobs", (("status", "failed"), ("type", "report"))] == 1
    assert samples["jobtui_jobs", (("status", "running"), ("type", "email"))] == 1
    assert 100 <= samples["jobtui_oldest_ready_age_seconds", (("type", "email"),)] < 130


def test_metrics_on_a_port_in_use(dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = user_error(jobtui(dsn, "metrics", "--port", str(port), "--addr", "127.0.0.1"))
    assert line.startswith(f"jobtui: error: cannot serve metrics on 127.0.0.1:{port} (Address already in use)")


def test_worker_serves_metrics(dsn: str, conn: Conn, seeded: Seeded) -> None:
    port = free_port()
    app = "tests.apps.metrics_app:jobs"
    args = ("worker", "--app", app, "--metrics-port", str(port), "--no-scheduler", "--id", "metrics-worker")
    samples, _ = scraped_then_stopped(port, popen_cli(*args, env=clean_env(dsn)), signal.SIGTERM, 30)
    assert samples["jobtui_up", ()] == 1
    assert samples["jobtui_jobs", (("status", "dead"), ("type", "email"))] == 2
