"""Rolling upgrades (docs/operations.md, "Upgrading"): the previous release's worker drains jobs
on a schema this code migrated; `jobtui migrate --check` and `--dry-run` change nothing and say
what would change; a worker facing an older schema says in one line what to run.

The previous release is the wheel recorded in tests/releases/ (see its README), unpacked and
run with this environment's dependencies, on whatever migrations this code ships.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobtui.clients.client import Client
from jobtui.kernel import migrate as migrations
from jobtui.kernel.domain import NewJob
from tests.waits import wait_until
from tests.workers import APP_TABLES, ROOT

Conn = psycopg.Connection[Any]
PREVIOUS = ROOT / "tests" / "releases" / "v0.2.0" / "jobtui-0.1.0-py3-none-any.whl"
PREVIOUS_VERSION = 10  # the schema version release 0.2.0 ships

OLD_APP = """
import os
import re

import psycopg

import jobtui

jobs = jobtui.Jobs()


def record(job, what):
    with psycopg.connect(os.environ["JOBTUI_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO ran (job_id, attempt, worker, what) VALUES (%s, %s, %s, %s)",
                     (job.id, job.attempt, job.worker_id, what))


@jobs.handler("old.sync")
def sync(job):
    record(job, "sync")


@jobs.handler("old.async")
async def asynchronous(job):
    record(job, "async")


@jobs.handler("old.flaky", backoff=jobtui.BackoffPolicy(base=0.1, cap=0.2))
def flaky(job):
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")
    record(job, "flaky")


@jobs.handler("old.permanent")
def permanent(job):
    raise jobtui.Permanent("refused for good")


@jobs.handler("old.slow")
def slow(job):
    import time

    time.sleep(float(job.payload["sleep"]))  # the job's work, held by the old release through the upgrade
    record(job, "slow")


@jobs.handler("old.once")
def once(job):
    with psycopg.connect(os.environ["JOBTUI_DSN"]) as conn:
        if job.once(conn, f"effect-{job.id}"):
            conn.execute("INSERT INTO ran (job_id, attempt, worker, what) VALUES (%s, %s, %s, 'once')",
                         (job.id, job.attempt, job.worker_id))
"""


def jobtui(
    dsn: str, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, *args],
        cwd=cwd, env={**environ, **(env or {})}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def previous(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The previous release unpacked with the old app beside it, and the environment that
    imports that release rather than this code (run from that folder, not the repository)."""
    folder = tmp_path / "release"
    with zipfile.ZipFile(PREVIOUS) as wheel:
        wheel.extractall(folder)
    (folder / "old_app.py").write_text(OLD_APP)
    env = {"PYTHONPATH": str(folder), "PYTHONUNBUFFERED": "1"}
    return folder, env


def test_the_recorded_release_is_the_previous_one(previous: tuple[Path, dict[str, str]]) -> None:
    folder, env = previous
    shipped = sorted(p.name for p in (folder / "jobtui" / "migrations").glob("*.sql"))
    assert len(shipped) == PREVIOUS_VERSION
    assert [m.path.name for m in migrations.available()[:PREVIOUS_VERSION]] == shipped
    where = subprocess.run(
        [sys.executable, "-c", "import jobtui; print(jobtui.__file__)"],
        cwd=folder, env={**os.environ, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.strip() == str(folder / "jobtui" / "__init__.py")


def test_the_previous_release_drains_jobs_on_this_schema(
    dsn: str, conn: Conn, previous: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:  # fmt: skip
    folder, env = previous
    conn.execute("CREATE TABLE ran (job_id bigint, attempt int, worker text, what text)")
    assert migrations.applied_version(conn) == migrations.code_version() >= PREVIOUS_VERSION
    # This release's producers enqueue, and so does the old release's command line.
    with Client(dsn) as q:
        ids = q.enqueue_many([NewJob("old.sync", {"n": n}) for n in range(40)])
        ids += q.enqueue_many([NewJob("old.async", {"n": n}, queue="mail") for n in range(20)])
        flaky = q.enqueue("old.flaky", key="flaky-1")
        permanent = q.enqueue("old.permanent")
        once = q.enqueue("old.once")
    old_enqueue = jobtui(dsn, "enqueue", "old.sync", "--payload", '{"from": "0.2.0"}', env=env, cwd=folder)
    assert old_enqueue.returncode == 0, old_enqueue
    ids.append(int(old_enqueue.stdout.strip()))
    log = (tmp_path / "old-worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobtui.cli", "worker", "--app", "old_app:jobs", "--id", "old-0.2.0", "--poll", "200ms"],
        cwd=folder, env={**os.environ, "JOBTUI_DSN": dsn, **env}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    logs = (tmp_path / "old-worker.log").read_text
    try:

        def finished() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM jobtui.job WHERE status IN ('ready', 'running') AND type LIKE 'old.%%'"
            ).fetchone()
            return row == (0,)

        wait_until(finished, 30, "the previous release's worker to drain the queue", logs)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, logs()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        log.close()
    assert "Traceback" not in logs()
    done = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE locked_by = 'old-0.2.0') FROM jobtui.job"
        " WHERE id = ANY(%s) AND status = 'done'",
        (ids,),
    ).fetchone()
    assert done == (len(ids), len(ids))
    ran = conn.execute("SELECT what, count(*), count(DISTINCT job_id) FROM ran GROUP BY what ORDER BY what").fetchall()
    assert ran == [("async", 20, 20), ("flaky", 1, 1), ("once", 1, 1), ("sync", 41, 41)]
    rows = conn.execute("SELECT id, status, attempts FROM jobtui.job WHERE id = ANY(%s) ORDER BY id",
                        ([flaky, permanent, once],)).fetchall()  # fmt: skip
    assert rows == [(flaky, "done", 2), (permanent, "failed", 1), (once, "done", 1)]
    assert conn.execute("SELECT count(*) FROM jobtui.effect WHERE job_id = %s", (once,)).fetchone() == (1,)
    # This release's code reads what the old one wrote.
    with Client(dsn) as q:
        job = q.get(permanent)
    assert job is not None and job.last_error is not None and "refused for good" in job.last_error
    # The old release never migrates a newer schema backwards.
    old_migrate = jobtui(dsn, "migrate", env=env, cwd=folder)
    if migrations.code_version() > PREVIOUS_VERSION:
        assert old_migrate.returncode == 2 and "upgrade jobtui instead of migrating" in old_migrate.stderr
    else:
        assert old_migrate.returncode == 0, old_migrate
    assert migrations.applied_version(conn) == migrations.code_version()


OLD_SWEEP = """
import sys, psycopg
from jobtui.maintenance import Retention, sweep
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    print(sweep(conn, Retention()).archived)
"""


def test_a_key_archived_by_the_previous_release_returns_its_job(
    dsn: str, conn: Conn, previous: tuple[Path, dict[str, str]]
) -> None:
    """Its archiver knows nothing of job_key: the trigger keeps the key as its delete moves the
    job out, also for a job the previous release enqueued (no job_key row)."""
    folder, env = previous
    with Client(dsn) as q:
        mine = q.enqueue("t", key="by-this-release")
    old = jobtui(dsn, "enqueue", "t", "--key", "by-the-previous-release", env=env, cwd=folder)
    assert old.returncode == 0, old
    theirs = int(old.stdout)
    conn.execute(
        "UPDATE jobtui.job SET status = 'done', finished_at = now() - interval '2 days' WHERE id = ANY(%s)",
        ([mine, theirs],),
    )
    swept = subprocess.run(
        [sys.executable, "-c", OLD_SWEEP, dsn], cwd=folder, env={**os.environ, **env}, capture_output=True, text=True
    )
    assert swept.returncode == 0 and swept.stdout.strip() == "2", swept
    with Client(dsn) as q:
        assert q.enqueue("t", key="by-this-release") == mine
        assert q.enqueue("t", key="by-the-previous-release") == theirs
    assert conn.execute("SELECT count(*) FROM jobtui.job").fetchone() == (0,)


OLD_SCHEDULES = """
import sys, psycopg
from jobtui.maintenance import Retention, with_builtins
from jobtui.registry import Jobs
from jobtui.scheduler import sync
jobs = with_builtins(Jobs(), sys.argv[1], "jobtui", Retention())
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    sync(conn, list(jobs.schedules.values()), "jobtui")
"""


def test_a_worker_of_the_previous_release_starting_keeps_the_key_window(
    dsn: str, conn: Conn, previous: tuple[Path, dict[str, str]]
) -> None:
    """Each worker writes the archiver's schedule as it starts; one of the previous release
    knows no key window, and its payload must not put this release's (--key-retention 30d)
    back to the default: keys between 7 and 30 days old would be forgotten."""
    from jobtui.core.maintenance import ARCHIVE_TYPE, Retention, with_builtins
    from jobtui.core.registry import Jobs
    from jobtui.core.scheduler import sync

    month = 30 * 86400.0
    sync(conn, list(with_builtins(Jobs(), dsn, "jobtui", Retention(key=month, done=3600.0)).schedules.values()))
    folder, env = previous
    old = subprocess.run(
        [sys.executable, "-c", OLD_SCHEDULES, dsn],
        cwd=folder, env={**os.environ, **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert old.returncode == 0, old
    [payload] = conn.execute("SELECT payload FROM jobtui.schedule WHERE name = %s", (ARCHIVE_TYPE,)).fetchone() or [{}]
    assert payload["done"] == 86400.0  # the previous release's own settings are written ...
    assert Retention.from_payload(payload).key == month  # ... and the window it cannot say stays


def test_a_worker_of_the_previous_release_shows_by_its_leases_beside_this_ones_registered_workers(
    dsn: str, conn: Conn, previous: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """A mixed fleet during a rolling upgrade: the previous release does not register, and
    `jobtui workers` lists it by the leases it holds; both keep draining their jobs."""
    folder, env = previous
    conn.execute("CREATE TABLE ran (job_id bigint, attempt int, worker text, what text)")
    conn.execute(APP_TABLES)
    with Client(dsn) as q:
        slow = q.enqueue("old.slow", {"sleep": 30})
    logs = []
    procs = []
    for name, app, where, extra in (
        ("old-0.2.0", "old_app:jobs", folder, env),
        ("new", "tests.apps.worker_app:jobs", ROOT, {}),
    ):
        log = tmp_path / f"{name}.log"
        logs.append(log)
        argv = [sys.executable, "-m", "jobtui.cli", "worker", "--app", app, "--id", name, "--poll", "200ms"]
        environ = {**os.environ, "JOBTUI_DSN": dsn, **extra}
        with log.open("wb") as out:
            procs.append(subprocess.Popen(argv, cwd=where, env=environ, stdout=out, stderr=subprocess.STDOUT))
    text = lambda: "\n".join(p.read_text() for p in logs)  # noqa: E731
    try:
        running = "SELECT locked_by FROM jobtui.job WHERE id = %s AND status = 'running'"
        wait_until(lambda: conn.execute(running, (slow,)).fetchone() == ("old-0.2.0",), 30, "the old one's lease", text)
        wait_until(lambda: conn.execute("SELECT count(*) FROM jobtui.fleet").fetchone() == (1,), 30, "new", text)
        listed = jobtui(dsn, "workers", "--json")
        assert listed.returncode == 0, listed
        got = json.loads(listed.stdout)
        assert [p["name"] for p in got["processes"]] == ["new"]
        [holder] = got["lease_holders_without_a_live_row"]
        assert (holder["name"], holder["jobs"], holder["lost"]) == ("old-0.2.0", 1, False)
        shown = jobtui(dsn, "workers").stdout
        assert "old-0.2.0 (not registered): 1 job(s) held" in shown
        # Both drain what they handle.
        with Client(dsn) as q:
            old_ids = q.enqueue_many([NewJob("old.sync", {"n": n}) for n in range(5)])
            new_ids = q.enqueue_many([NewJob("nap", {"sleep": 0}) for _ in range(5)])
        done = "SELECT count(*) FROM jobtui.job WHERE id = ANY(%s) AND status = 'done'"
        wait_until(lambda: conn.execute(done, (old_ids + new_ids,)).fetchone() == (10,), 30, "both drained", text)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def apply_only(conn: Conn, count: int, schema: str = "jobtui") -> None:
    """The schema as `jobtui migrate` of an older code leaves it: the first `count` migrations
    only (numbers may skip one, so that is not version `count`)."""
    for statement in migrations._bootstrap(schema):
        conn.execute(statement)
    for m in migrations.available()[:count]:
        conn.execute(m.text(schema).encode())
        conn.execute(migrations._recorded(schema, m))


def test_a_worker_facing_an_older_schema_says_what_to_run(empty_dsn: str) -> None:
    newest = migrations.code_version()
    # All but the newest migration (a number may be skipped, so not `newest - 1` of them).
    older = migrations.available()[-2].version
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        apply_only(conn, len(migrations.available()) - 1)
    for command in (["worker", "--app", "tests.apps.metrics_app:jobs"], ["scheduler"]):
        result = jobtui(empty_dsn, *command, "--wait-for-db", "0")
        assert result.returncode == 2, result
        lines = result.stderr.strip().splitlines()
        assert lines[-1] == (
            f"jobtui: error: schema 'jobtui' is at version {older}, this jobtui needs version {newest}: run"
            " `jobtui migrate` of this release first, as the schema's owner (`jobtui migrate --dry-run` prints its SQL)"
        ), result.stderr
        assert "Traceback" not in result.stderr
    check = jobtui(empty_dsn, "migrate", "--check")
    assert check.returncode == 1, check
    assert check.stdout.strip() == (
        f"schema 'jobtui' is at version {older}; this jobtui applies {migrations.available()[-1].path.stem}:"
        " run `jobtui migrate`"
    )


def test_migrate_check_and_dry_run_change_nothing(empty_dsn: str, dsn: str) -> None:
    check = jobtui(empty_dsn, "migrate", "--check")
    assert check.returncode == 1 and check.stdout.startswith("schema 'jobtui' is missing; this jobtui applies 0001_"), (
        check
    )
    dry = jobtui(empty_dsn, "migrate", "--dry-run")
    assert dry.returncode == 0, dry
    assert dry.stdout.count('INSERT INTO "jobtui".migration') == len(migrations.available())
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'jobtui'").fetchone() == (0,)
    assert jobtui(empty_dsn, "migrate", "--check", "--dry-run").returncode == 2
    psql = shutil.which("psql")
    if psql is None:
        return
    subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", empty_dsn], input=dry.stdout, text=True, check=True,
                   capture_output=True)  # fmt: skip
    after = jobtui(empty_dsn, "migrate", "--check")
    assert after.returncode == 0, after
    assert after.stdout.strip() == f"schema 'jobtui' is at version {migrations.code_version()}: no migration pending"
    # The script made the schema `jobtui migrate` makes.
    columns = (
        "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns"
        " WHERE table_schema = 'jobtui' ORDER BY 1, 2"
    )
    with psycopg.connect(empty_dsn) as scripted, psycopg.connect(dsn) as migrated:
        assert scripted.execute(columns).fetchall() == migrated.execute(columns).fetchall()
        # A schema newer than this code: nothing to apply, and --check says so.
        scripted.execute("INSERT INTO jobtui.migration (version, name) VALUES (999, 'future')")
        scripted.commit()
    newer = jobtui(empty_dsn, "migrate", "--check")
    assert newer.returncode == 0 and "newer than this jobtui's" in newer.stdout, newer


# What would break the previous release's code on the new schema: a column of a table it knew
# dropped, renamed, retyped or made NOT NULL (or a new one NOT NULL without a default), and a
# table of its dropped or renamed without one of the same name made in its place. A contract
# step (removing what a release before the previous one needed) names its migration here,
# with the release whose CHANGELOG says so.
BREAKING_COLUMN = re.compile(
    r"\bDROP\s+COLUMN\b|\bRENAME\s+COLUMN\b|\bALTER\s+COLUMN\s+\w+\s+(SET\s+DATA\s+)?TYPE\b|\bSET\s+NOT\s+NULL\b"
    r"|\bADD\s+COLUMN\s+(IF\s+NOT\s+EXISTS\s+)?\w+\s+[^,;]*\bNOT\s+NULL\b(?![^,;]*\bDEFAULT\b)",
    re.IGNORECASE,
)
TABLE_GONE = re.compile(
    r"\bDROP\s+(?:TABLE|VIEW)\s+(?:IF\s+EXISTS\s+)?\{schema\}\.(\w+)|\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?"
    r"\{schema\}\.(\w+)\s+RENAME\s+TO\b",
    re.IGNORECASE,
)
CREATED = re.compile(r"\bCREATE\s+(?:TABLE|VIEW)\s+(?:IF\s+NOT\s+EXISTS\s+)?\{schema\}\.(\w+)", re.IGNORECASE)
CONTRACT_STEPS: dict[str, str] = {}


def _sql(migration: migrations.Migration) -> str:
    return re.sub(r"--[^\n]*", "", migration.path.read_text())  # comments say what they like


def breaking(text: str, known: set[str]) -> list[str]:
    """The statements of a migration's `text` that would break code knowing the tables `known`."""
    made = set(CREATED.findall(text))
    found = []
    for statement in text.split(";"):
        gone = {name for pair in TABLE_GONE.findall(statement) for name in pair if name}
        if BREAKING_COLUMN.search(statement) or (gone & known) - made:
            found.append(" ".join(statement.split())[:120])
    return found


def test_migrations_since_the_previous_release_are_additive() -> None:
    known = {name for m in migrations.available()[:PREVIOUS_VERSION] for name in CREATED.findall(_sql(m))}
    assert {"job", "job_archive", "schedule", "audit", "queue_control"} <= known
    found = [
        f"{m.path.name}: {statement}"
        for m in migrations.available()[PREVIOUS_VERSION:]
        if m.path.name not in CONTRACT_STEPS
        for statement in breaking(_sql(m), known)
    ]
    assert not found, "not additive (the previous release's workers run on this schema):\n" + "\n".join(found)


def test_the_additive_check_sees_what_breaks() -> None:
    known = {"job", "effect", "job_archive"}
    for text in (
        "ALTER TABLE {schema}.job DROP COLUMN meta",
        "ALTER TABLE {schema}.job RENAME COLUMN a TO b",
        "ALTER TABLE {schema}.job ADD COLUMN tenant text NOT NULL",
        "ALTER TABLE {schema}.job ALTER COLUMN attempts TYPE bigint",
        "ALTER TABLE {schema}.job ALTER COLUMN queue SET NOT NULL",
        "DROP TABLE {schema}.effect",
        "ALTER TABLE {schema}.job_archive RENAME TO job_archive_old",
    ):
        assert breaking(text, known), text
    for text in (
        "ALTER TABLE {schema}.job ADD COLUMN tenant text NOT NULL DEFAULT 'a'",
        "ALTER TABLE {schema}.job ADD COLUMN note text",
        "CREATE TABLE {schema}.t (id bigint NOT NULL, name text NOT NULL)",
        "DROP INDEX IF EXISTS {schema}.job_old_idx",
        "DROP TABLE {schema}.t_new_here",
        # Swapped for a table of the same name, which the previous release's statements still find.
        "ALTER TABLE {schema}.job_archive RENAME TO job_archive_legacy;"
        " CREATE TABLE {schema}.job_archive (LIKE {schema}.job_archive_legacy INCLUDING DEFAULTS)",
    ):
        assert not breaking(text, known), text
