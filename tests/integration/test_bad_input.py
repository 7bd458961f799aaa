"""Hostile and mistaken input, through the CLI and the Python API.

Each mistake is one clear line (the CLI: exit code 2, one stderr line "jobtui: error: ...", no
traceback; the API: InvalidInput), and nothing is written or lost. Text that looks like SQL is
data: stored verbatim and never executed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobtui import Client, Failure, InvalidInput, JobStatus, NewJob
from jobtui.core import scheduler as schedules
from jobtui.core.registry import Job, Jobs, ScheduleSpec
from jobtui.kernel import migrate as migrations
from jobtui.kernel.cronslots import check_cron
from jobtui.worker import Worker
from tests.cli import Ran, jobtui
from tests.conftest import with_dbname
from tests.waits import until

Conn = psycopg.Connection[Any]

SQL = "'); DROP TABLE jobtui.job; --"
# Hostile text, never run: its pg_sleep would show as a stalled command were it ever executed.
SQL_TOO = 'x" OR 1=1; DELETE FROM jobtui.audit; SELECT pg_sleep(10); --'
REFUSED_DSN = "postgresql://postgres@127.0.0.1:1/test"
APP = "tests.apps.worker_app:jobs"


# -- helpers ------------------------------------------------------------------------------


def jobtui_process(dsn: str, *args: str | bytes) -> Ran:
    """The command as people run it, as a process; bytes arguments reach it undecoded."""
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    env["JOBTUI_DSN"] = dsn
    done = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", *args], env=env, capture_output=True, timeout=60, check=False
    )
    return Ran(done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"))


def user_error(result: Ran, *fragments: str) -> str:
    """The one line a user's mistake prints; asserts everything else about it."""
    assert result.code == 2, result
    assert "Traceback" not in result.err
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("jobtui: error: "), result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert result.out == ""
    return lines[0]


def succeeded(result: Ran) -> str:
    assert result.code == 0, result
    assert "Traceback" not in result.err
    return result.out


def counts(conn: Conn) -> tuple[int, int, int]:
    """Rows in the tables a mistake could write to: jobs, schedules, audit."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobtui.job), (SELECT count(*) FROM jobtui.schedule),"
        " (SELECT count(*) FROM jobtui.audit)"
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def tables(conn: Conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'jobtui' ORDER BY 1")]


@pytest.fixture(scope="module")
def quiet_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """One migrated database for the mistakes that must write nothing: each of those tests
    checks that it is still empty."""
    name = f"jobtui_bad_input_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db))
        )
    yield with_dbname(server_dsn, name)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def quiet(quiet_dsn: str) -> Iterator[Conn]:
    """A connection to the shared database, which is empty before and after the test."""
    with psycopg.connect(quiet_dsn, autocommit=True) as conn:
        assert counts(conn) == (0, 0, 0)
        yield conn
        assert counts(conn) == (0, 0, 0), "a mistake wrote something"


@pytest.fixture
def q(dsn: str) -> Iterator[Client]:
    with Client(dsn) as queue:
        yield queue


# -- payloads -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("{nope", "--payload is not valid JSON"),
        ("", "--payload is not valid JSON"),
        ('{"a": 1,}', "--payload is not valid JSON"),
        ("{'a': 1}", "--payload is not valid JSON"),
        ('{"a": NaN}', "payload is not JSON-serialisable"),
        ('{"a": 1e999}', "payload is not JSON-serialisable"),
        ("[" * 100_000, "--payload nests too deeply"),
        ('{"a": "nul \\u0000 inside"}', "payload holds a NUL character"),
        ('{"a": "\\ud800"}', "payload holds text that is not valid UTF-8"),
    ],
)
def test_bad_payloads_on_the_command_line(quiet_dsn: str, quiet: Conn, payload: str, message: str) -> None:
    user_error(jobtui(quiet_dsn, "enqueue", "t", "--payload", payload), message)


def test_a_payload_over_one_megabyte(dsn: str, conn: Conn, q: Client) -> None:
    big = "x" * 1_000_001
    with pytest.raises(InvalidInput, match="over the 1000000 limit"):
        q.enqueue("t", big)
    with pytest.raises(InvalidInput, match="over the 1000000 limit"):
        q.enqueue_many([NewJob("t", {"i": i}) for i in range(1000)] + [NewJob("t", {"blob": big})])
    # The same through the CLI (in process: one exec argument holds at most 128 KiB).
    line = user_error(jobtui(dsn, "enqueue", "t", "--payload", f'{{"blob": "{big}"}}'))
    assert re.fullmatch(r"jobtui: error: payload is \d+ bytes, over the 1000000 limit; .*", line)
    assert counts(conn) == (0, 0, 0)
    # Just under the limit is fine, and comes back whole.
    fits = "é" * 499_990  # two bytes each
    job_id = q.enqueue("t", fits)
    assert q.get(job_id).payload == fits  # type: ignore[union-attr]


def test_payloads_python_cannot_encode(q: Client, conn: Conn) -> None:
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    for payload, message in [
        (deep, "nests too deeply"),
        ({"when": datetime.now()}, "not JSON-serialisable"),
        ({1, 2}, "not JSON-serialisable"),
        (b"bytes", "not JSON-serialisable"),
        ({"x": float("inf")}, "not JSON-serialisable"),
        ({"x": "\udcff"}, "not valid UTF-8"),
        ({"\ud800": 1}, "not valid UTF-8"),
        ({"x": "a\x00b"}, "NUL"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            q.enqueue("t", payload)
    assert counts(conn) == (0, 0, 0)


# -- text that is not UTF-8, or holds NUL ---------------------------------------------------


def test_bytes_that_are_not_utf8_on_the_command_line(quiet_dsn: str, quiet: Conn) -> None:
    user_error(jobtui_process(quiet_dsn, b"enqueue", b"type-\xff"), "argument 'type-\\udcff' is not valid UTF-8 text")
    # Python decodes such argv bytes with os.fsdecode (surrogateescape), as below.
    for args in [
        [b"enqueue", b"t", b"--key", b"key-\xfe\xff"],
        [b"enqueue", b"t", b"--payload", b'{"a": "\xff"}'],
        [b"--actor", b"\xc3\x28", b"cancel", b"1"],
        [b"schedule", b"add", b"sched-\xff", b"--cron", b"* * * * *", b"--type", b"t"],
        [b"requeue", b"--error", b"\xff"],
        [b"requeue", b"--type", b"\x80"],
        [b"job", b"\xff"],
    ]:
        user_error(jobtui(quiet_dsn, *map(os.fsdecode, args)), "is not valid UTF-8 text")


def test_nul_characters_on_the_command_line(quiet_dsn: str, quiet: Conn) -> None:
    # No exec can pass one (arguments are C strings); main() can be called with one.
    with pytest.raises(ValueError, match="embedded null byte"):
        jobtui_process(quiet_dsn, "enqueue", "a\x00b")
    for args, message in [
        (["enqueue", "a\x00b"], "bad job type: it holds a NUL character"),
        (["enqueue", "t", "--key", "k\x00"], "bad idempotency key"),
        (["--actor", "op\x00", "requeue", "--all"], "bad actor: it holds a NUL character"),
        (["requeue", "--error", "x\x00"], "bad --error pattern: it holds a NUL character"),
        (["schedule", "add", "s\x00", "--cron", "* * * * *", "--type", "t"], "bad schedule name"),
        (["schedule", "pause", "s\x00"], "bad schedule name"),
    ]:
        user_error(jobtui(quiet_dsn, *args), message)


def test_text_that_is_not_utf8_or_holds_nul_in_the_api(q: Client, conn: Conn) -> None:
    lone = "\udcff"  # how Python decodes the byte 0xff of a file name or an argv
    bad_calls: list[Callable[[], object]] = [
        lambda: q.enqueue(f"type-{lone}"),
        lambda: q.enqueue("t", key=f"key-{lone}"),
        lambda: q.enqueue("t\x00"),
        lambda: q.enqueue("t", key="k\x00"),
        lambda: q.enqueue_many([NewJob("t"), NewJob(lone)]),
        lambda: q.enqueue_many([NewJob("t")] * 999 + [NewJob(f"t{lone}")]),  # the COPY path
        lambda: q.claim([lone], worker="w"),
        lambda: q.claim(["t"], worker=f"w{lone}"),
        lambda: q.claim(["t"], worker="w\x00"),
        lambda: q.requeue([1], actor=lone),
        lambda: q.kill_lease([1], actor="a\x00b"),
        lambda: q.cancel([1], actor=lone),
        lambda: q.requeue_matching(job_type=lone, actor="op"),
        lambda: q.requeue_matching(error="a\x00", actor="op"),
        lambda: q.count_requeueable(error=lone),
    ]
    for call in bad_calls:
        with pytest.raises(InvalidInput, match=r"NUL|not valid UTF-8"):
            call()
    assert counts(conn) == (0, 0, 0)


def test_error_texts_are_always_written(q: Client) -> None:
    """A handler's error text holding NUL or undecodable bytes cannot stop its outcome."""
    a, b = q.enqueue("t", max_attempts=3), q.enqueue("t", max_attempts=3)
    ja, jb = q.claim(["t"], worker="w", limit=2)
    [outcome] = q.fail([Failure(ja.lease, "cannot open \udcff.txt\x00!", 0)])
    assert outcome.status == JobStatus.READY
    assert q.fail_permanently([jb.lease], ["bad \ud800 data"]) == {b}
    assert q.get(a).last_error == "cannot open \\udcff.txt!"  # type: ignore[union-attr]
    assert q.get(b).last_error == "bad \\ud800 data"  # type: ignore[union-attr]


def test_a_handler_error_that_is_not_utf8_does_not_stall_the_worker(dsn: str, q: Client) -> None:
    """Found by these tests: the outcome writer died on such a text, leaving every job of the
    worker running until its lease expired, and stopping the worker."""
    jobs = Jobs()

    @jobs.handler("undecodable", max_attempts=1)
    def undecodable(job: Job) -> None:
        raise FileNotFoundError("no such file: " + os.fsdecode(b"report-\xff.csv"))

    @jobs.handler("fine")
    def fine(job: Job) -> None:
        pass

    bad, good = q.enqueue("undecodable"), q.enqueue("fine")

    async def run() -> None:
        worker = Worker(jobs, dsn, concurrency=2, poll_interval=0.1, scheduler=False, retention=None)
        task = asyncio.create_task(worker.run())
        await until(lambda: worker.counts["dead"] and worker.counts["done"], 30, "a dead job and a done one")
        worker.stop()
        await asyncio.wait_for(task, 15)

    asyncio.run(run())
    dead = q.get(bad)
    assert dead is not None and dead.status == JobStatus.DEAD
    assert dead.last_error is not None and "report-\\udcff.csv" in dead.last_error
    assert q.get(good).status == JobStatus.DONE  # type: ignore[union-attr]


# -- text that looks like SQL ----------------------------------------------------------------


def test_sql_in_every_field_is_stored_verbatim(dsn: str, conn: Conn, q: Client) -> None:
    before = tables(conn)
    payload = {SQL: SQL_TOO, "list": [SQL, {"nested": SQL_TOO}]}
    job_id = q.enqueue(SQL, payload, key=SQL_TOO)
    assert q.enqueue(SQL, {}, key=SQL_TOO) == job_id  # the key is matched as a value
    [job] = q.claim([SQL], worker=SQL_TOO)
    assert (job.type, job.payload) == (SQL, payload)
    [outcome] = q.fail([Failure(job.lease, SQL, 0)])
    assert outcome.worker == SQL_TOO
    other = q.enqueue("t")
    [claimed] = q.claim(["t"], worker="w")
    assert q.fail_permanently([claimed.lease], [SQL_TOO]) == {other}
    assert q.count_requeueable(job_type=SQL) == 0  # ready again, after its failure
    assert q.requeue([other], actor=SQL) == [other]
    assert q.cancel([job_id], actor=SQL_TOO) == [job_id]
    assert q.requeue_matching(job_type=SQL, error=".*", actor=SQL) == [job_id]
    with psycopg.connect(dsn, autocommit=True) as own:
        schedules.upsert(own, ScheduleSpec(SQL, "* * * * *", SQL_TOO, payload={SQL: 1}), source="cli")
        assert schedules.pause(own, SQL, actor=SQL_TOO)

    row = q.get(job_id)
    assert row is not None
    assert (row.type, row.payload, row.idempotency_key, row.locked_by) == (SQL, payload, SQL_TOO, SQL_TOO)
    assert [e.error for e in row.errors] == [SQL, f"cancelled by {SQL_TOO}", f"requeued from failed by {SQL}"]
    assert q.get(other).errors[0].error == SQL_TOO  # type: ignore[union-attr]
    schedule = conn.execute("SELECT name, job_type, payload, paused FROM jobtui.schedule").fetchone()
    assert schedule == (SQL, SQL_TOO, {SQL: 1}, True)
    actors = [r[0] for r in conn.execute("SELECT actor FROM jobtui.audit ORDER BY id")]
    assert actors == [SQL, SQL_TOO, SQL, SQL_TOO]
    assert tables(conn) == before and "job" in before and "audit" in before


def test_sql_on_the_command_line_is_stored_verbatim(dsn: str, conn: Conn) -> None:
    before = tables(conn)
    payload = f'{{"q": "{SQL}"}}'
    job_id = int(succeeded(jobtui_process(dsn, "enqueue", SQL, "--payload", payload, "--key", SQL_TOO)))
    assert int(succeeded(jobtui(dsn, "enqueue", SQL, "--key", SQL_TOO))) == job_id
    row = conn.execute("SELECT type, payload, idempotency_key FROM jobtui.job WHERE id = %s", (job_id,)).fetchone()
    assert row == (SQL, {"q": SQL}, SQL_TOO)
    assert f"Job {job_id} ({SQL}): ready" in succeeded(jobtui(dsn, "job", str(job_id)))
    succeeded(jobtui(dsn, "--actor", SQL, "cancel", str(job_id)))
    assert "requeued 1 job(s)" in succeeded(jobtui(dsn, "--actor", SQL_TOO, "requeue", "--type", SQL))
    succeeded(jobtui(dsn, "--actor", SQL, "schedule", "add", SQL, "--cron", "0 * * * *", "--type", SQL_TOO))
    # A pattern is a regular expression: this one is not valid (an unmatched parenthesis).
    user_error(jobtui(dsn, "requeue", "--error", SQL), "bad --error pattern", "regular expression")
    user_error(jobtui(dsn, "dead", "--error", SQL), "bad --error pattern")
    assert conn.execute("SELECT name, job_type FROM jobtui.schedule").fetchall() == [(SQL, SQL_TOO)]
    assert [r[0] for r in conn.execute("SELECT actor FROM jobtui.audit ORDER BY id")] == [SQL, SQL_TOO, SQL]
    assert conn.execute("SELECT status FROM jobtui.job").fetchall() == [("ready",)]
    assert tables(conn) == before


# -- cron ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("0 0 31 2 *", "it never fires"),
        ("0 0 30 2 *", "it never fires"),
        ("0 0 31 4,6,9,11 *", "it never fires"),
        ("0 0 0 31 2 *", "it never fires"),  # with seconds
        ("61 * * * *", "out of range"),
        ("* * *", "it has 3 fields"),
        ("* * * * * * *", "it has 7 fields"),
        ("*/0 * * * *", "step '0'"),
        ("@hourly", "it has 1 fields"),
        ("every minute please", "bad cron expression"),
        ("", "it has 0 fields"),
    ],
)
def test_cron_expressions_that_are_wrong_or_never_fire(quiet_dsn: str, quiet: Conn, cron: str, message: str) -> None:
    started = time.monotonic()
    with pytest.raises(InvalidInput, match=message):
        check_cron(cron)
    with pytest.raises(InvalidInput, match=message):
        Jobs().schedule("s", cron=cron, type="t")
    assert time.monotonic() - started < 2  # croniter gives up quickly; nothing loops
    user_error(jobtui(quiet_dsn, "schedule", "add", "s", "--cron", cron, "--type", "t"), "bad cron expression", message)


def test_rare_but_real_cron_dates_are_accepted() -> None:
    for cron in ("0 0 29 2 *", "0 0 L 2 *", "0 0 31 2 1", "0 0 13 * 5"):  # 29 Feb; last of Feb; OR weekday
        assert check_cron(cron) == cron


# -- job types no worker handles ----------------------------------------------------------------


def test_an_unknown_job_type_can_be_enqueued_but_not_worked(dsn: str, conn: Conn) -> None:
    job_id = int(succeeded(jobtui(dsn, "enqueue", "no.such.handler")))
    user_error(
        jobtui_process(dsn, "worker", "--app", APP, "--types", "no.such.handler"),
        "no handler for job type(s) no.such.handler",
        "registered: ",
    )
    user_error(jobtui(dsn, "worker", "--app", APP, "--types", " , "), "names no job type")
    row = conn.execute("SELECT status, attempts FROM jobtui.job WHERE id = %s", (job_id,)).fetchone()
    assert row == ("ready", 0)


# -- numbers: delays, attempts, durations, ids ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "t", "--delay=-5"], "must not be negative"),
        (["enqueue", "t", "--delay=-5s"], "bad duration"),
        (["enqueue", "t", "--delay", "1e400"], "bad duration"),
        (["enqueue", "t", "--delay", "nan"], "bad duration"),
        (["enqueue", "t", "--delay", "3651d"], "at most 10 years"),
        (["enqueue", "t", "--delay", "5 minutes"], "bad duration"),
        (["enqueue", "t", "--delay", "1y"], "bad duration"),
        (["enqueue", "t", "--delay", ""], "bad duration"),
        (["enqueue", "t", "--max-attempts", "0"], "must be at least 1"),
        (["enqueue", "t", "--max-attempts=-3"], "must be at least 1"),
        (["enqueue", "t", "--max-attempts", "1001"], "bad max attempts 1001"),
        (["enqueue", "t", "--max-attempts", "99999999999999999999"], "bad max attempts"),
        (["enqueue", "t", "--max-attempts", "2.5"], "not a whole number"),
        (["schedule", "add", "s", "--cron", "* * * * *", "--type", "t", "--max-attempts", "5000"], "bad max attempts"),
        (["schedule", "add", "s", "--cron", "* * * * *", "--type", "t", "--offset", "2h"], "offset must be"),
        (["worker", "--app", APP, "--lease", "0"], "lease must be at least 1 second"),
        (["worker", "--app", APP, "--lease", "5x"], "bad duration '5x'"),
        (["worker", "--app", APP, "--poll", "0"], "poll interval must be at least"),
        (["worker", "--app", APP, "--shutdown-timeout=-1s"], "bad duration"),
        (["worker", "--app", APP, "--concurrency", "0"], "must be at least 1"),
        (["worker", "--app", APP, "--loop", "trio"], "must be one of auto, asyncio, uvloop, got 'trio'"),
        (["--warn-age", "soon"], "bad duration 'soon'"),
        (["stats", "--watch", "-1"], "must be between 0.1 and 86400 seconds"),
        (["stats", "--watch", "nan"], "must be between"),
        (["metrics", "--port", "70000"], "not a port number"),
        (["audit", "--limit", "0"], "must be at least 1"),
    ],
)
def test_bad_numbers_on_the_command_line(quiet_dsn: str, quiet: Conn, args: list[str], message: str) -> None:
    user_error(jobtui(quiet_dsn, *args), message)


def test_bad_numbers_in_the_api(q: Client, conn: Conn) -> None:
    job_id = q.enqueue("t", max_attempts=2)
    [job] = q.claim(["t"], worker="w")
    before = conn.execute("SELECT to_jsonb(j) FROM jobtui.job j").fetchall()
    bad_calls: list[Callable[[], object]] = [
        lambda: q.enqueue("t", delay=-1),
        lambda: q.enqueue("t", delay=float("nan")),
        lambda: q.enqueue("t", delay=float("inf")),
        lambda: q.enqueue("t", delay=1e308),
        lambda: q.enqueue("t", delay="5"),  # type: ignore[arg-type]
        lambda: q.enqueue("t", max_attempts=0),
        lambda: q.enqueue("t", max_attempts=-1),
        lambda: q.enqueue("t", max_attempts=10**9),
        lambda: q.enqueue("t", max_attempts="3"),  # type: ignore[arg-type]
        lambda: q.enqueue("t", run_at="tomorrow"),
        lambda: q.enqueue("t", run_at=datetime(2030, 1, 1)),  # naive: in which zone?
        lambda: q.enqueue_many([NewJob("t"), NewJob("t", delay=-1)]),
        lambda: q.claim(["t"], worker="w", limit=0),
        lambda: q.claim(["t"], worker="w", lease=-5),
        lambda: q.claim(["t"], worker="w", lease=float("nan")),
        lambda: q.heartbeat([job.lease], lease=float("inf")),
        lambda: q.fail([Failure(job.lease, "x", -1)]),
        lambda: q.fail([Failure(job.lease, "x", float("nan"))]),
        lambda: q.release([job.lease], [-1]),
        lambda: q.reap(limit=0),
    ]
    for call in bad_calls:
        with pytest.raises(InvalidInput):
            call()
    assert conn.execute("SELECT to_jsonb(j) FROM jobtui.job j").fetchall() == before
    assert q.get(job_id).status == JobStatus.RUNNING  # type: ignore[union-attr]


@pytest.mark.parametrize("verb", ["job", "requeue", "kill-lease", "cancel"])
def test_unknown_job_ids(dsn: str, conn: Conn, verb: str) -> None:
    job_id = int(succeeded(jobtui(dsn, "enqueue", "t")))
    before = counts(conn)
    user_error(jobtui(dsn, verb, "424242"), "no job with id 424242")
    if verb != "job":
        # One unknown id among known ones: nothing at all is changed.
        user_error(jobtui(dsn, verb, str(job_id), "424242"), "no job with id 424242", "nothing was changed")
    for bad in ("0", "-3", "abc", "99999999999999999999"):
        user_error(jobtui(dsn, verb, bad), "is not a job id")
    assert counts(conn) == before
    assert conn.execute("SELECT status FROM jobtui.job").fetchall() == [("ready",)]


def test_unknown_job_ids_in_the_api(q: Client, conn: Conn) -> None:
    assert q.get(424242) is None
    assert q.requeue([424242], actor="op") == []
    assert q.kill_lease([424242], actor="op") == []
    assert q.cancel([424242], actor="op") == []
    assert counts(conn) == (0, 0, 3)  # the attempts are audited, with no rows changed
    assert [r[0] for r in conn.execute("SELECT rows FROM jobtui.audit")] == [0, 0, 0]


# -- the schema and the database ------------------------------------------------------------


def test_a_schema_migrated_by_a_newer_jobtui(dsn: str, conn: Conn) -> None:
    conn.execute("INSERT INTO jobtui.migration (version, name) VALUES (99, 'from_the_future')")
    before = tables(conn)
    user_error(jobtui(dsn, "migrate"), "at version 99 but this jobtui knows only", "upgrade jobtui")
    assert conn.execute("SELECT max(version) FROM jobtui.migration").fetchone() == (99,)
    assert tables(conn) == before
    # Everything else keeps working: migrations only add, so an older jobtui can run against
    # a newer schema during a rolling deploy.
    job_id = int(succeeded(jobtui(dsn, "enqueue", "t")))
    assert "ready 1" in succeeded(jobtui(dsn, "stats"))
    assert f"Job {job_id} (t): ready" in succeeded(jobtui(dsn, "job", str(job_id)))
    assert migrations.check(conn) == 99


class SilentServer:
    """Accepts TCP connections and never says a word: a server that does not answer."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(client)

    def close(self) -> None:
        self.sock.close()
        for client in self.accepted:
            client.close()


def test_a_database_that_refuses_connections() -> None:
    message = "cannot reach PostgreSQL at postgresql://postgres@127.0.0.1:1/test"
    user_error(jobtui_process(REFUSED_DSN, "enqueue", "t"), message)
    for args in (["stats"], ["migrate"], ["job", "1"], ["requeue", "--all"], ["schedule", "list"]):
        user_error(jobtui(REFUSED_DSN, *args), message)


def test_a_database_that_does_not_answer() -> None:
    server = SilentServer()
    try:
        dsn = f"postgresql://postgres@127.0.0.1:{server.port}/test?connect_timeout=2"
        started = time.monotonic()
        user_error(jobtui_process(dsn, "stats"), "cannot reach PostgreSQL", "timeout expired")
        # The DSN's own connect_timeout applies (not a built-in 10 s).
        assert time.monotonic() - started < 8
    finally:
        server.close()


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("nonsense", "bad DSN 'nonsense'"),
        ("postgresql://[::1", "bad DSN"),
        ("postgresql://u@h/db?no_such_option=1", "bad DSN"),
        ("host=127.0.0.1 port=1 password=s3cret", "password=***"),
        ("postgresql://postgres:s3cret@127.0.0.1:1/test", "postgres:***@"),
    ],
)
def test_bad_dsns(dsn: str, shown: str) -> None:
    line = user_error(jobtui(dsn, "stats"), shown)
    assert "s3cret" not in line
    refused = pytest.raises(InvalidInput, match="bad DSN") if "bad DSN" in shown else contextlib.nullcontext()
    with refused:
        Client(dsn).close()


# -- schedules by name --------------------------------------------------------------------


def test_schedule_names_that_cannot_exist(dsn: str, conn: Conn) -> None:
    with psycopg.connect(dsn, autocommit=True) as own:
        for name in ("\udcff", "a\x00b"):
            with pytest.raises(InvalidInput, match="bad schedule name"):
                schedules.upsert(own, ScheduleSpec(name, "* * * * *", "t"), source="cli")
            for action in (schedules.pause, schedules.resume, schedules.run_now, schedules.remove):
                with pytest.raises(InvalidInput, match="bad schedule name"):
                    action(own, name, actor="op")
        with pytest.raises(InvalidInput, match="bad max attempts"):
            schedules.upsert(own, ScheduleSpec("s", "* * * * *", "t", max_attempts=0), source="cli")
    assert counts(conn) == (0, 0, 0)
    user_error(jobtui(dsn, "schedule", "pause", "nope"), "no schedule named 'nope'")
    user_error(jobtui(dsn, "schedule", "add", "s", "--cron", "* * * * *", "--type", "t", "--timezone", "Mars/Base"))
    user_error(jobtui(dsn, "schedule"), "the following arguments are required")


# -- rows a hand edit left malformed ------------------------------------------------------


def test_a_hand_edited_history_still_shows(dsn: str, conn: Conn) -> None:
    """Entries of a job's `errors` that no worker writes (a string, an object where a name goes,
    an attempt that is no number, escapes) are shown as text: `jobtui job` and its `--json`
    neither fail nor pass the escapes on."""
    with Client(dsn) as q:
        job_id = q.enqueue("t")
    history = ["\x1b]0;title\x07plain", {"worker": {"a": "\x1b[2J"}, "attempt": "two", "at": 5, "error": "e"}]
    conn.execute("UPDATE jobtui.job SET errors = %s::jsonb WHERE id = %s", (json.dumps(history), job_id))
    out = succeeded(jobtui_process(dsn, "job", str(job_id)))
    assert "plain" in out and '{"a": "' in out
    assert "\x1b" not in out and "\x07" not in out
    shown = json.loads(succeeded(jobtui_process(dsn, "job", str(job_id), "--json")))
    assert [e["error"] for e in shown["errors"]] == ["\x1b]0;title\x07plain", "e"]
    assert shown["errors"][1]["worker"] == '{"a": "\\u001b[2J"}' and shown["errors"][1]["attempt"] == 0


def test_json_output_has_no_nan(dsn: str, conn: Conn) -> None:
    """A float column holding NaN or infinity (a check that `NaN >= 0` passes) prints as null:
    `--json` stays JSON that strict parsers read."""
    with psycopg.connect(dsn, autocommit=True) as own:
        schedules.upsert(own, ScheduleSpec("nightly", "0 3 * * *", "t"), source="cli")
    conn.execute("UPDATE jobtui.schedule SET offset_seconds = 'NaN' WHERE name = 'nightly'")

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in --json output")

    rows = json.loads(succeeded(jobtui_process(dsn, "schedule", "list", "--json")), parse_constant=refuse)
    assert [(r["name"], r["offset_seconds"]) for r in rows] == [("nightly", None)]


def test_a_worker_id_longer_than_the_fleet_keeps_is_refused(quiet_dsn: str, quiet: Conn) -> None:
    # Cut to 200 characters in the fleet, whole in its leases, it would hold jobs no row names.
    user_error(jobtui_process(quiet_dsn, "worker", "--app", APP, "--id", "w" * 201), "a worker id is at most 200")
    with pytest.raises(InvalidInput, match="a worker id is at most 200 characters"):
        Worker(Jobs(), quiet_dsn, worker_id="w" * 201)
    Worker(Jobs(), quiet_dsn, worker_id="w" * 200)  # the longest the fleet keeps whole
    assert Worker(Jobs(), quiet_dsn, worker_id="").worker_id.endswith(f":{os.getpid()}")  # `--id "$UNSET"`
