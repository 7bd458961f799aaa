"""`jobtui why` on incidents staged with real worker processes on real PostgreSQL: each names
the staged cause first, with its evidence, and fixing it clears it within one refresh. Several
causes are staged in one database where they stay apart (each in a queue or type of its own),
so the default run stays short.

Workers run with a 2 s lease (a refresh of the fleet's row every 2/3 s, lost after 2 s) and a
0.2 s poll.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui import Client, NewJob
from jobtui.cli.main import main
from jobtui.core import queues
from jobtui.core.history import record_flow
from tests.integration.conftest import Spawn
from tests.integration.test_upgrades import previous  # noqa: F401 (the previous release, unpacked)
from tests.integration.test_worker import enqueue, runs, statuses
from tests.proxy import Proxy
from tests.tui.test_terminal import ROOT, Terminal
from tests.waits import wait_until
from tests.workers import close_gate, open_gate

Conn = psycopg.Connection[Any]
Capsys = pytest.CaptureFixture[str]
POLL = ("--poll", "0.2s")


def why(capsys: Capsys, dsn: str, *args: str) -> tuple[int, dict[str, Any]]:
    """`jobtui why --json`, in this process: its exit code and its JSON."""
    code = main(["--dsn", dsn, "why", "--json", *args])
    out, err = capsys.readouterr()
    assert not err, err
    return code, json.loads(out)


def subject(d: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    return next((s for s in d["subjects"] if (s["kind"], s["name"]) == (kind, name)), None)


def causes(d: dict[str, Any], kind: str, name: str) -> list[str]:
    found = subject(d, kind, name)
    return [] if found is None else [c["cause"] for c in found["causes"]]


def first(d: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    found = subject(d, kind, name)
    assert found is not None and found["causes"], f"{kind} {name} has no cause: {json.dumps(d, indent=1)}"
    return found["causes"][0]  # type: ignore[no-any-return]


def until_why(
    capsys: Capsys, dsn: str, holds: Callable[[dict[str, Any]], bool], timeout: float, what: str, *args: str
) -> dict[str, Any]:
    """`jobtui why --json` again (a console's refresh, about a second apart) until `holds`."""
    seen: list[dict[str, Any]] = []

    def check() -> bool:
        seen[:] = [why(capsys, dsn, *args)[1]]
        return holds(seen[0])

    wait_until(check, timeout, what, lambda: json.dumps(seen[-1] if seen else {}, indent=1), every=0.2)
    return seen[0]


def test_no_worker_for_a_queue_no_handler_for_a_type_and_none_among_a_queues_workers(
    db: Conn, spawn: Spawn, app_dsn: str, capsys: Capsys
) -> None:
    spawn("A", "--queues", "default=2", *POLL)  # the wrong --queues for `reports`
    spawn("C", "--queues", "mixed=2", "--types", "nap", *POLL)  # serves `mixed`, runs only nap
    for _ in range(3):
        enqueue(db, "nap", {"sleep": 0}, queue="reports")
    ghost = enqueue(db, "ghost.type", {})  # no app handles it
    enqueue(db, "quick", {}, queue="mixed")  # A handles quick, but does not serve `mixed`
    code, d = why(capsys, app_dsn)
    assert code == 1 and d["waiting"]
    served = first(d, "queue", "reports")
    assert served["cause"] == "no_live_worker" and served["about"] == {"kind": "queue", "name": "reports"}
    assert any("3 due" in e for e in served["evidence"]) and any("A serves default" in e for e in served["evidence"])
    assert first(d, "type", "nap")["cause"] == "no_live_worker"  # its jobs wait in `reports`
    unhandled = first(d, "type", "ghost.type")
    assert (unhandled["cause"], unhandled["about"]["name"]) == ("no_handler", "ghost.type")
    lacking = first(d, "queue", "mixed")
    assert lacking["cause"] == "no_handler" and lacking["figures"] == {"type": "quick"}
    assert "C serve mixed; their apps lack quick" in lacking["evidence"]
    assert any(e.startswith("A handle quick") for e in lacking["evidence"])
    # Each fixed: a worker for `reports` (it registers as it starts), the ghost's job
    # cancelled, a worker for `mixed` that handles every type. The next read says so.
    spawn("B", "--queues", "reports=2", *POLL)
    assert main(["--dsn", app_dsn, "cancel", str(ghost)]) == 0
    spawn("D", "--queues", "mixed=1", *POLL)
    capsys.readouterr()
    code, d = why(capsys, app_dsn)
    assert "no_live_worker" not in causes(d, "queue", "reports") + causes(d, "type", "nap")
    assert subject(d, "type", "ghost.type") is None
    assert "no_handler" not in causes(d, "queue", "mixed")
    until_why(capsys, app_dsn, lambda d: not d["subjects"], 15, "every job done")
    assert why(capsys, app_dsn)[0] == 0
    # A queue that is known, with nothing waiting: said in a line, exit 0.
    assert main(["--dsn", app_dsn, "why", "--queue", "reports"]) == 0
    assert capsys.readouterr().out == "queue reports: nothing waits\n"


def test_a_paused_type_in_a_saturated_queue_are_both_named(
    db: Conn, spawn: Spawn, app_dsn: str, capsys: Capsys
) -> None:
    # The last hour: jobs of `nap` took 0.1 s (history, as the archiver's minutes would hold).
    db.execute(
        "INSERT INTO jobtui.job (type, status, run_at, attempts, started_at, finished_at, created_at)"
        " SELECT 'nap', 'done', now() - interval '30 minutes', 1, now() - interval '30 minutes',"
        " now() - interval '30 minutes' + interval '100 milliseconds', now() - interval '30 minutes'"
        " FROM generate_series(1, 20)"
    )
    moment = db.execute("SELECT now()").fetchone()
    assert moment is not None
    record_flow(db, until=moment[0] - timedelta(minutes=2))  # the span the enqueues below are counted after
    w = spawn("S", "--concurrency", "2", *POLL)  # two slots
    gate = close_gate(db)
    slow = [enqueue(db, "effect", {"key": f"slow-{i}", "hold_after": gate}) for i in range(2)]
    with psycopg.connect(app_dsn) as conn:
        queues.pause(conn, "type", "quick", actor="ops@test")
    for _ in range(3):
        enqueue(db, "quick", {})
    for i in range(6):
        enqueue(db, "nap", {"sleep": 0.5}, key=f"nap-{i}")
    wait_until(lambda: all(runs(db, j) for j in slow), 10, "both slots busy", w.log)
    moment = db.execute("SELECT now()").fetchone()
    assert moment is not None
    record_flow(db, until=moment[0])  # the arrivals of the last two minutes
    code, d = why(capsys, app_dsn)
    assert code == 1
    paused = first(d, "type", "quick")
    assert paused["cause"] == "paused" and paused["figures"]["paused_by"] == "ops@test"
    assert paused["figures"]["audit_id"] is not None  # the pause's own audit row
    named = causes(d, "queue", "default")
    assert named[:2] == ["paused", "saturated"], named  # both, the pause first
    full = next(c for c in first_subject_causes(d, "queue", "default") if c["cause"] == "saturated")
    assert "all 2 slots serving queue default are busy: S 2/2" in full["evidence"]
    assert full["figures"]["enqueued_per_minute"] > 0 and full["figures"]["slots"] == 2
    assert full["figures"]["run_seconds_hour"] == pytest.approx(0.1, abs=0.05)
    assert first(d, "type", "nap")["cause"] == "saturated"  # nap's jobs wait in the full queue
    # Fixed: the type resumed, the gate opened; the pause is gone from the next read.
    with psycopg.connect(app_dsn) as conn:
        queues.resume(conn, "type", "quick", actor="ops@test")
    assert "paused" not in causes(why(capsys, app_dsn)[1], "queue", "default")
    open_gate(db, gate)
    until_why(
        capsys,
        app_dsn,
        lambda d: not d["subjects"],
        20,
        "the backlog drained",
    )
    assert statuses(db, slow) == dict.fromkeys(slow, "done")


def first_subject_causes(d: dict[str, Any], kind: str, name: str) -> list[dict[str, Any]]:
    found = subject(d, kind, name)
    return [] if found is None else list(found["causes"])


def test_a_limit_and_a_rate_that_hold_with_the_values_that_drain(
    db: Conn, spawn: Spawn, app_dsn: str, capsys: Capsys
) -> None:
    with psycopg.connect(app_dsn) as conn:
        queues.set_limit(conn, "slow", 1, actor="ops@test")
        queues.set_rate(conn, "type", "quick", 1.0, actor="ops@test")
    spawn("L", "--queues", "slow=4,default=4", *POLL)
    for _ in range(8):
        enqueue(db, "nap", {"sleep": 1.0}, queue="slow")
    for _ in range(40):
        enqueue(db, "quick", {})
    # Once a job of `slow` is done, its run time says what limit drains the rest.
    limited = until_why(
        capsys,
        app_dsn,
        lambda d: (
            causes(d, "queue", "slow")[:1] == ["concurrency_limit"]
            and "suggested_limit" in first(d, "queue", "slow")["figures"]
        ),
        20,
        "the limit named, with one that drains the queue",
    )
    cause = first(limited, "queue", "slow")
    assert cause["figures"]["limit"] == 1 and cause["figures"]["running"] == 1
    assert "1 running of a limit of 1 across every worker" in cause["evidence"]
    assert cause["figures"]["suggested_limit"] >= 2 and cause["command"].startswith("jobtui queue limit slow ")
    rated = first(limited, "type", "quick")
    assert rated["cause"] == "rate_limit" and rated["figures"]["rate_per_second"] == 1.0
    assert rated["figures"]["suggested_rate_per_second"] > 1.0 and rated["command"].startswith("jobtui type rate quick")
    # Fixed: the limit raised, the rate lifted; neither is named at the next read.
    with psycopg.connect(app_dsn) as conn:
        queues.set_limit(conn, "slow", 10, actor="ops@test")
        queues.set_rate(conn, "type", "quick", None, actor="ops@test")
    d = why(capsys, app_dsn)[1]
    assert "concurrency_limit" not in causes(d, "queue", "slow") and "rate_limit" not in causes(d, "type", "quick")
    until_why(capsys, app_dsn, lambda d: not d["subjects"], 20, "the backlog drained")


def test_a_frozen_worker_reads_as_lost_then_clears_when_it_wakes(
    db: Conn, spawn: Spawn, app_dsn: str, capsys: Capsys
) -> None:
    w = spawn("F", "--queues", "frozen=2", *POLL)
    w.signal(signal.SIGSTOP)
    try:
        for _ in range(3):
            enqueue(db, "nap", {"sleep": 0}, queue="frozen")
        d = until_why(
            capsys, app_dsn, lambda d: causes(d, "queue", "frozen")[:1] == ["workers_lost"], 15, "F named lost"
        )
        lost = first(d, "queue", "frozen")
        assert lost["figures"]["workers"] == ["F"]
        assert any(e.startswith("F on ") and "its row not refreshed for" in e for e in lost["evidence"])
    finally:
        w.signal(signal.SIGCONT)
    # Awake, it refreshes its row and claims: within a refresh nothing holds the queue.
    until_why(capsys, app_dsn, lambda d: "workers_lost" not in causes(d, "queue", "frozen"), 5, "F back")
    until_why(capsys, app_dsn, lambda d: not d["subjects"], 15, "the jobs done")


def test_a_handler_that_kills_its_worker_is_a_crash_loop(db: Conn, spawn: Spawn, app_dsn: str, capsys: Capsys) -> None:
    spawn("R", "--queues", "default=1", *POLL, lease="1s")  # serves something else; its reaper returns the leases
    first_victim = spawn("C1", "--queues", "poison=1", *POLL, lease="1s")
    poison = enqueue(db, "crash", {}, queue="poison")
    assert first_victim.wait_exit(15) == 3
    second_victim = spawn("C2", "--queues", "poison=1", *POLL, lease="1s")  # as a supervisor would restart one
    assert second_victim.wait_exit(20) == 3
    d = until_why(capsys, app_dsn, lambda d: causes(d, "type", "crash")[:1] == ["crash_loop"], 20, "a crash loop named")
    loop = first(d, "type", "crash")
    assert loop["figures"]["expiries"] >= 2 and set(loop["figures"]["workers"]) == {"C1", "C2"}
    assert first(d, "queue", "poison")["cause"] == "crash_loop"  # before the lost workers it explains
    assert "workers_lost" in causes(d, "queue", "poison")
    # Fixed: the poison job cancelled; nothing of the type waits, and nothing is said of it.
    assert main(["--dsn", app_dsn, "cancel", str(poison)]) == 0
    capsys.readouterr()
    assert subject(why(capsys, app_dsn)[1], "type", "crash") is None


def test_workers_killed_together_are_lost_not_a_crash_loop(
    db: Conn, spawn: Spawn, app_dsn: str, capsys: Capsys
) -> None:
    spawn("R", "--queues", "other=1", *POLL, lease="1s")  # serves something else; its reaper returns the leases
    victims = [spawn(name, *POLL, lease="1s") for name in ("K1", "K2")]
    jobs = [enqueue(db, "nap", {"sleep": 60}) for _ in range(2)]
    wait_until(lambda: set(statuses(db, jobs).values()) == {"running"}, 15, "both naps running")
    for victim in victims:  # one host lost: both at once, each dying once
        victim.signal(signal.SIGKILL)
    expired = "SELECT count(*) FROM jobtui.lease_expiry WHERE job_type = 'nap'"
    wait_until(lambda: db.execute(expired).fetchone() == (2,), 15, "both leases reaped")
    d = until_why(capsys, app_dsn, lambda d: "workers_lost" in causes(d, "queue", "default"), 15, "the lost workers")
    assert "crash_loop" not in causes(d, "type", "nap") + causes(d, "queue", "default")


def test_a_session_holding_a_rates_bucket_is_a_lock_not_the_rate(
    db: Conn, spawn: Spawn, app_dsn: str, capsys: Capsys
) -> None:
    with psycopg.connect(app_dsn) as conn:
        queues.set_rate(conn, "type", "quick", 100.0, actor="ops@test")
    spawn("B", *POLL)
    with psycopg.connect(app_dsn) as holder:
        # A session left open on the bucket's row: every claim of the type waits behind it.
        holder.execute("SELECT * FROM jobtui.rate_bucket FOR UPDATE")
        for _ in range(300):
            enqueue(db, "quick", {})
        d = until_why(capsys, app_dsn, lambda d: causes(d, "type", "quick")[:1] == ["database"], 30, "the lock named")
        cause = first(d, "type", "quick")
        assert "rate_limit" in cause["figures"]["lock_waits"], cause
        assert cause["figures"]["longest_lock_wait_seconds"] >= 5, cause


def test_a_live_worker_whose_claims_wait_on_a_lock(db: Conn, spawn: Spawn, app_dsn: str, capsys: Capsys) -> None:
    w = spawn("W", *POLL)
    # Due in 2 s: by then the claims cannot take them.
    jobs = [enqueue(db, "nap", {"sleep": 0}, delay=2.0) for _ in range(3)]
    # A session holds the job table in SHARE mode: reads go on, the claims (an UPDATE) wait.
    with psycopg.connect(app_dsn) as holder:
        holder.execute("LOCK TABLE jobtui.job IN SHARE MODE")
        d = until_why(
            capsys, app_dsn, lambda d: d["general"] and causes(d, "queue", "default")[:1] == ["database"], 15,
            "the lock named",
        )  # fmt: skip
        waits = d["general"][0]
        assert waits["cause"] == "database" and waits["figures"]["lock_waits"].get("relation", 0) >= 1
        assert waits["figures"]["claims_waiting"] >= 1
        # Its row stays fresh while its claims wait: past ten polls (and 5 s), it is named.
        d = until_why(
            capsys, app_dsn, lambda d: "worker_not_claiming" in causes(d, "queue", "default"), 30,
            "W named as not claiming",
        )  # fmt: skip
        stuck = next(c for c in subject(d, "queue", "default")["causes"] if c["cause"] == "worker_not_claiming")  # type: ignore[index]
        assert stuck["figures"]["worker"] == "W" and stuck["figures"]["claim_gap_seconds"] > 5
        holder.rollback()
    # The lock gone, its claims are answered, and its next refresh says so.
    until_why(
        capsys,
        app_dsn,
        lambda d: not d["general"] and "worker_not_claiming" not in str(d),
        5,
        "the claims answered again",
    )
    assert w.proc.poll() is None
    wait_until(lambda: statuses(db, jobs) == dict.fromkeys(jobs, "done"), 10, "the jobs done", w.log)


def test_delayed_and_retrying_jobs_are_not_a_backlog(db: Conn, spawn: Spawn, app_dsn: str, capsys: Capsys) -> None:
    w = spawn("T", *POLL)
    enqueue(db, "nap", {}, delay=300.0)
    failing = enqueue(db, "fails_slowly", {})
    wait_until(lambda: db.execute("SELECT attempts FROM jobtui.job WHERE id = %s", (failing,)).fetchone() == (1,)
               and statuses(db, [failing]) == {failing: "ready"}, 10, "the first attempt failed", w.log)  # fmt: skip
    code, d = why(capsys, app_dsn)
    assert code == 0 and not d["waiting"]
    later = first(d, "queue", "default")
    assert later["cause"] == "not_due" and later["level"] == "info"
    delayed = next(e for e in later["evidence"] if "delayed" in e)
    assert delayed.startswith("1 job delayed (run_at in the future): the first due in 4m5")
    assert any(e.startswith("1 job retrying after a failed attempt: the first due in") for e in later["evidence"])


def test_bad_input_and_a_database_that_does_not_answer(app_dsn: str, capsys: Capsys) -> None:
    for args, said in [
        (["--queue", "nope"], "jobtui: error: no queue 'nope' is known"),
        (["--type", "nope"], "jobtui: error: no type 'nope' is known"),
        (["--timeout", "0s"], "jobtui: error: --timeout must be more than 0"),
    ]:
        assert main(["--dsn", app_dsn, "why", *args]) == 2
        out, err = capsys.readouterr()
        assert not out and err.startswith(said) and err.count("\n") == 1, err
    with Proxy(app_dsn) as proxy:
        proxy.freeze()
        started = time.monotonic()
        code = main(["--dsn", proxy.dsn(app_dsn), "why", "--json", "--timeout", "1s"])
        out, _ = capsys.readouterr()
        assert code == 3 and time.monotonic() - started < 10
        d = json.loads(out)
        assert d["general"][0]["cause"] == "database_not_answering" and d["waiting"]


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    """A tmux server of this test's own (tests/tui/test_terminal.py)."""
    term = Terminal(f"jobtui-why-{os.getpid()}")
    yield term
    subprocess.run(["tmux", "-L", term.name, "kill-server"], capture_output=True, timeout=10, check=False)


NO_TMUX = "tmux is not installed: apt-get install -y tmux runs this test"


@pytest.mark.skipif(shutil.which("tmux") is None, reason=NO_TMUX)
def test_the_header_names_the_cause_in_a_terminal_during_an_incident(
    db: Conn, spawn: Spawn, app_dsn: str, terminal: Terminal
) -> None:
    spawn("A", "--queues", "default=2", *POLL)  # serves the wrong queue
    for _ in range(5):
        enqueue(db, "nap", {"sleep": 0}, queue="reports")
    command = f"unset COLUMNS LINES; exec {sys.executable} -m jobtui.cli --actor tester --warn-age 2s"
    terminal.tmux(
        "-f", "/dev/null", "new-session", "-d", "-s", "console", "-x", "160", "-y", "40", "-c", str(ROOT),
        "-e", f"JOBTUI_DSN={app_dsn}", "sh", "-c", command,
    )  # fmt: skip
    # Past the warning age, the first cause beside the oldest age, in the header's first lines.
    screen = terminal.wait(lambda s: "why no live worker serves queue reports (0)" in s, "the cause in the header")
    header = "\n".join(screen.splitlines()[:4])
    assert "oldest ready" in header and "why no live worker serves queue reports" in header, screen
    terminal.keys("0")
    terminal.wait(lambda s: "queue reports" in s and "fix:" in s and "start a worker that serves" in s, "the Why pane")
    # Fixed: a worker for the queue; its jobs are done and the header says nothing more.
    spawn("B", "--queues", "reports=2", *POLL)
    terminal.wait(lambda s: "why no live worker" not in s and "nothing waits" in s, "the cause gone")
    terminal.keys("q")


def test_a_worker_of_the_previous_release_is_said_unseen_not_missing(
    dsn: str,
    db: Conn,
    previous: tuple[Path, dict[str, str]],  # noqa: F811 (the fixture, imported above)
    tmp_path: Path,
    capsys: Capsys,
) -> None:
    """During a rolling upgrade the previous release's worker serves `default` without a row
    in the fleet: its queue is not called unserved, nor its type unhandled; the diagnosis
    names the worker as what it cannot see."""
    folder, env = previous
    db.execute("CREATE TABLE ran (job_id bigint, attempt int, worker text, what text)")
    with Client(dsn) as q:
        slow = q.enqueue("old.slow", {"sleep": 30})
        waiting = q.enqueue_many([NewJob("old.sync", {"n": n}) for n in range(3)])
    log = tmp_path / "old.log"
    argv = [sys.executable, "-m", "jobtui.cli", "worker", "--app", "old_app:jobs", "--id", "old-0.2.0",
            "--poll", "200ms", "--concurrency", "1"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=folder, env={**os.environ, "JOBTUI_DSN": dsn, **env}, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        running = "SELECT locked_by FROM jobtui.job WHERE id = %s AND status = 'running'"
        wait_until(lambda: db.execute(running, (slow,)).fetchone() == ("old-0.2.0",), 30, "its lease", log.read_text)
        assert statuses(db, waiting) == dict.fromkeys(waiting, "ready")  # its one slot is busy
        code, d = why(capsys, dsn)
        assert not causes(d, "queue", "default") and not causes(d, "type", "old.sync"), d
        default = subject(d, "queue", "default")
        assert default is not None and default["summary"].startswith("nothing seen holds it")
        assert default["note"].startswith("old-0.2.0 (no row in the fleet: an earlier release) hold its jobs")
        assert any("old-0.2.0" in said and "does not register" in said for said in d["cannot_see"])
        assert code == 0
    finally:
        proc.kill()
        proc.wait(10)


def test_names_from_the_database_are_printed_escaped(db: Conn, app_dsn: str, capsys: Capsys) -> None:
    # Rows another client wrote: a queue, a type and an actor with terminal escapes and markup.
    db.execute(
        "INSERT INTO jobtui.job (type, queue, status, run_at)"
        " VALUES (E'evil\\x1b]0;pwned\\x07', E'q\\x1b[2J', 'ready', now() - interval '1 minute')"
    )
    db.execute(
        "INSERT INTO jobtui.queue_control (kind, name, paused_at, paused_by, changed_by)"
        " VALUES ('queue', E'q\\x1b[2J', now(), E'ops\\x1b[31m[red]', 'x')"
    )
    assert main(["--dsn", app_dsn, "why"]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "queue q\\x1b[2J is paused (by ops\\x1b[31m[red])" in out
    code, d = why(capsys, app_dsn)  # exact in the JSON
    assert code == 1 and first(d, "queue", "q\x1b[2J")["figures"]["paused_by"] == "ops\x1b[31m[red]"
