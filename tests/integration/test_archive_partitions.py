"""The archive by day (migration 0014): a day past its retention goes with its partition, old
archives become job_archive_legacy without a rewrite and are pruned until empty, and a
worker of the previous release keeps archiving into, and pruning, the partitioned archive."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobtui import Client, NewJob
from jobtui.cli.bench import NOOP
from jobtui.core.maintenance import ARCHIVE_TYPE, Retention, sweep
from jobtui.core.scheduler import run_now
from jobtui.kernel import migrate as migrations
from tests import conftest
from tests.waits import wait_until

Conn = psycopg.Connection[Any]

ROOT = Path(__file__).resolve().parents[2]
# The previous release (0.2.0): its workers must keep working against this schema.
PREVIOUS_RELEASE = "c7e9f9b"
PARTITIONS = next(m for m in migrations.available() if m.name == "archive_partitions")


def partitions(conn: Conn) -> set[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'jobtui.job_archive'::regclass"
    )
    return {r[0] for r in rows}


def day_name(conn: Conn, days_from_today: int) -> str:
    row = conn.execute(
        "SELECT 'job_archive_' || to_char((now() AT TIME ZONE 'UTC')::date + %s, 'YYYYMMDD')", (days_from_today,)
    ).fetchone()
    assert row is not None
    return str(row[0])


def archived_where(conn: Conn, ids: list[int] | None = None) -> dict[str, int]:
    """How many archived rows (of `ids`, or all) each partition holds."""
    rows = conn.execute(
        "SELECT tableoid::regclass::text, count(*) FROM jobtui.job_archive"
        " WHERE %(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s) GROUP BY 1",
        {"ids": ids},
    )
    return {str(name).removeprefix("jobtui."): int(n) for name, n in rows}


def done_jobs(dsn: str, conn: Conn, n: int) -> list[int]:
    """`n` jobs made done at once, finished a day ago (the archiver's default retention)."""
    with Client(dsn) as q:
        ids = q.enqueue_many([NewJob("t", {"i": i}) for i in range(n)])
    conn.execute(
        "UPDATE jobtui.job SET status = 'done', attempts = 1, started_at = now() - interval '2 days',"
        " finished_at = now() - interval '2 days' WHERE id = ANY(%s)",
        (ids,),
    )
    return ids


def test_the_archive_is_made_of_days_ahead_of_time(conn: Conn) -> None:
    assert {day_name(conn, d) for d in range(3)} | {"job_archive_default"} <= partitions(conn)
    assert conn.execute("SELECT to_regclass('jobtui.job_archive_legacy')").fetchone() == (None,)  # nothing to keep


def test_a_session_past_midnight_clones_a_template_migrated_that_day(server_dsn: str, template_db: str) -> None:
    """Each test's database is a clone of a template migrated on the day it runs: one migrated
    before midnight would lack the day after tomorrow (tests/conftest.py)."""
    days = conftest._TEMPLATES[template_db]
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        today = conftest._utc_day(admin)
    # This session's template as if it had been migrated yesterday.
    days.clear()
    days[today - timedelta(days=1)] = template_db
    name, url = conftest._create_clone(server_dsn, template_db)
    try:
        made = f"{template_db}_{today:%Y%m%d}"
        assert days[today] == made
        with psycopg.connect(server_dsn) as admin:
            assert admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (made,)).fetchone() == (1,)
        with psycopg.connect(url) as clone:
            assert {day_name(clone, d) for d in range(3)} <= partitions(clone)
        # Made once: the next clone of the day takes the same template.
        again, _ = conftest._create_clone(server_dsn, template_db)
        conftest._drop(server_dsn, again)
        assert len(days) == 2
    finally:
        conftest._drop(server_dsn, name)


def test_a_day_past_its_retention_is_dropped_whole(dsn: str, conn: Conn) -> None:
    conn.execute(
        "CREATE TABLE jobtui.job_archive_20000101 PARTITION OF jobtui.job_archive"
        " FOR VALUES FROM ('2000-01-01 00:00+00') TO ('2000-01-02 00:00+00')"
    )
    old = done_jobs(dsn, conn, 300)
    recent = done_jobs(dsn, conn, 200)
    swept = sweep(conn, Retention(archive=None))
    assert swept.archived == 500
    assert archived_where(conn) == {day_name(conn, 0): 500}
    conn.execute("UPDATE jobtui.job_archive SET archived_at = '2000-01-01 12:00+00' WHERE id = ANY(%s)", (old,))
    assert archived_where(conn) == {"job_archive_20000101": 300, day_name(conn, 0): 200}

    swept = sweep(conn, Retention())
    assert (swept.dropped_archive_days, swept.deleted_archive) == (1, 0)  # one DROP, no row deleted
    assert "job_archive_20000101" not in partitions(conn)
    assert {r[0] for r in conn.execute("SELECT id FROM jobtui.job_archive")} == set(recent)
    # Today's rows stay even past a shorter retention, until their whole day is past it.
    assert sweep(conn, Retention(archive=0.0)).dropped_archive_days == 0
    assert archived_where(conn) == {day_name(conn, 0): 200}


def test_rows_of_a_day_without_partition_are_kept_and_pruned_one_by_one(dsn: str, conn: Conn) -> None:
    # Today's partition is missing (an archiver of the previous release archived before any
    # of this one made it, say): the rows go to the default partition.
    conn.execute(sql.SQL("DROP TABLE jobtui.{}").format(sql.Identifier(day_name(conn, 0))))
    ids = done_jobs(dsn, conn, 50)
    with conn.transaction():  # archive without making the day first, as the previous release does
        conn.execute(
            "WITH moved AS (DELETE FROM jobtui.job WHERE id = ANY(%s) RETURNING *)"
            " INSERT INTO jobtui.job_archive (id, type, payload, status, run_at, attempts, lease_token, errors,"
            " lease_expirations, created_at, started_at, finished_at, uncounted, queue)"
            " SELECT id, type, payload, status, run_at, attempts, lease_token, errors, lease_expirations,"
            " created_at, started_at, finished_at, uncounted, queue FROM moved",
            (ids,),
        )
    assert archived_where(conn) == {"job_archive_default": 50}
    # The day cannot be made while the default partition holds its rows; the archiver goes on.
    assert sweep(conn, Retention()).archived == 0
    assert day_name(conn, 0) not in partitions(conn) and day_name(conn, 1) in partitions(conn)
    conn.execute("UPDATE jobtui.job_archive SET archived_at = archived_at - interval '31 days' WHERE id = ANY(%s)",
                 (ids[:20],))  # fmt: skip
    swept = sweep(conn, Retention())
    assert (swept.dropped_archive_days, swept.deleted_archive) == (0, 20)
    assert archived_where(conn) == {"job_archive_default": 30}


def test_a_busy_archive_never_holds_the_archiver(dsn: str, conn: Conn) -> None:
    conn.execute(
        "CREATE TABLE jobtui.job_archive_20000101 PARTITION OF jobtui.job_archive"
        " FOR VALUES FROM ('2000-01-01 00:00+00') TO ('2000-01-02 00:00+00')"
    )
    with psycopg.connect(dsn) as reader:
        reader.execute("SELECT count(*) FROM jobtui.job_archive")  # a long query: its lock is held
        started = time.monotonic()
        swept = sweep(conn, Retention())
        assert time.monotonic() - started < 5
        assert swept.dropped_archive_days == 0  # it waited a second at most, and left the day
        assert "job_archive_20000101" in partitions(conn)
        reader.rollback()
    assert sweep(conn, Retention()).dropped_archive_days == 1


# -- existing installs ----------------------------------------------------------------------


@pytest.fixture
def empty_conn(empty_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(empty_dsn, autocommit=True) as connection:
        yield connection


def migrate_before_partitions(conn: Conn) -> None:
    conn.execute("CREATE SCHEMA jobtui")
    conn.execute("CREATE TABLE jobtui.migration (version integer PRIMARY KEY, name text NOT NULL,"
                 " applied_at timestamptz NOT NULL DEFAULT now())")  # fmt: skip
    for m in migrations.available():
        if m.version >= PARTITIONS.version:
            break
        conn.execute(m.text("jobtui").encode())
        conn.execute("INSERT INTO jobtui.migration (version, name) VALUES (%s, %s)", (m.version, m.name))


def test_an_existing_archive_is_kept_without_a_rewrite_and_pruned_until_empty(empty_conn: Conn) -> None:
    conn = empty_conn
    migrate_before_partitions(conn)
    # 20,000 archived rows, archived over the last 40 days, oldest finished first.
    conn.execute(
        "INSERT INTO jobtui.job_archive (id, type, status, attempts, finished_at, archived_at)"
        " SELECT g, 't', 'done', 1, now() - interval '41 days' + g * interval '2 minutes',"
        " now() - interval '40 days' + g * interval '2 minutes' FROM generate_series(1, 20000) AS g"
    )
    role = f"jobtui_archiver_{os.getpid()}"
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
    try:
        conn.execute(sql.SQL("GRANT SELECT, INSERT, DELETE ON jobtui.job_archive TO {}").format(sql.Identifier(role)))
        filenode = conn.execute("SELECT pg_relation_filenode('jobtui.job_archive')").fetchone()
        from_14 = [m.version for m in migrations.available() if m.version >= PARTITIONS.version]
        assert [m.version for m in migrations.migrate(conn)] == from_14
        # The same file, renamed: not rewritten.
        assert conn.execute("SELECT pg_relation_filenode('jobtui.job_archive_legacy')").fetchone() == filenode
        assert conn.execute("SELECT count(*) FROM jobtui.job_archive_legacy").fetchone() == (20000,)
        assert conn.execute("SELECT count(*) FROM jobtui.job_archive").fetchone() == (0,)
        # Whoever could archive before still can, and may prune by day.
        granted = conn.execute(
            "SELECT has_table_privilege(%(r)s, 'jobtui.job_archive', 'INSERT'),"
            " has_table_privilege(%(r)s, 'jobtui.job_archive', 'DELETE'),"
            " has_function_privilege(%(r)s, 'jobtui.archive_prune(interval, integer)', 'EXECUTE'),"
            " has_function_privilege('public', 'jobtui.archive_prune(interval, integer)', 'EXECUTE')",
            {"r": role},
        ).fetchone()
        assert granted == (True, True, True, False)

        # Ten days of the forty are past a 30-day retention: deleted, oldest first, in bounded runs.
        swept = sweep(conn, Retention())
        assert swept.deleted_archive == 7200  # 10 days of rows every 2 minutes
        assert conn.execute("SELECT count(*) FROM jobtui.job_archive_legacy").fetchone() == (12800,)
        assert sweep(conn, Retention()).deleted_archive == 0
        # Once every row is past it, the legacy archive empties and goes.
        swept = sweep(conn, Retention(archive=0.0))
        assert swept.deleted_archive == 12800
        sweep(conn, Retention(archive=0.0))
        assert conn.execute("SELECT to_regclass('jobtui.job_archive_legacy')").fetchone() == (None,)
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_the_migration_waits_for_no_scan_of_the_archive(empty_dsn: str, empty_conn: Conn) -> None:
    """The rename is a catalog change: an archiver inserting meanwhile is held for as long as
    the migration's transaction lasts, not for a scan of the archive's rows."""
    conn = empty_conn
    migrate_before_partitions(conn)
    conn.execute(
        "INSERT INTO jobtui.job_archive (id, type, status, attempts, finished_at)"
        " SELECT g, 't', 'done', 1, now() FROM generate_series(1, 200000) AS g"
    )
    conn.execute("VACUUM jobtui.job_archive")
    scans = "SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables WHERE relname = 'job_archive_legacy'"
    with conn.transaction():
        started = time.monotonic()
        conn.execute(PARTITIONS.text("jobtui").encode())
        took = time.monotonic() - started
        # The emptiness check reads the first row it finds, not the table.
        read = conn.execute(scans).fetchone()
    assert read is not None and read[0] <= 1
    assert took < 5, took


# -- the previous release -------------------------------------------------------------------


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's code (its jobtui package and migrations), from git."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and this repository's history for the previous release's code")
    out = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE, "jobtui", "migrations"], capture_output=True, timeout=60
    )
    if out.returncode != 0:
        pytest.skip(f"git has no commit {PREVIOUS_RELEASE}: {out.stderr.decode(errors='replace').strip()}")
    tree = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def test_a_worker_of_the_previous_release_archives_and_prunes(
    dsn: str, conn: Conn, previous_release: Path, tmp_path: Path
) -> None:
    with Client(dsn) as q:
        ids = q.enqueue_many([NewJob(NOOP) for _ in range(40)])
    log_path = tmp_path / "previous.log"
    env = {**os.environ, "PYTHONPATH": str(previous_release)}
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            # The previous release's own module names: its bench app lived in jobtui.sizing.
            [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "worker", "--app", "jobtui.sizing:jobs",
             "--id", "previous-release", "--concurrency", "5", "--retention", "0s", "--poll", "0.2s"],
            cwd=previous_release, env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:

            def log() -> str:
                return log_path.read_text(errors="replace")

            wait_until(lambda: "worker previous-release started" in log() or proc.poll() is not None, 20, "start", log)
            assert proc.poll() is None, log()
            assert str(previous_release) in subprocess.run(
                [sys.executable, "-c", "import jobtui; print(jobtui.__file__)"],
                cwd=previous_release, env=env, capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            # Done, or already archived: a worker started just before a minute's slot runs the
            # archiver at once, and with --retention 0s it moves the done jobs out.
            done = """SELECT (SELECT count(*) FROM jobtui.job WHERE id = ANY(%(ids)s) AND status = 'done')
                             + (SELECT count(*) FROM jobtui.job_archive WHERE id = ANY(%(ids)s))"""
            wait_until(lambda: conn.execute(done, {"ids": ids}).fetchone() == (40,), 20, "the jobs done", log)

            def archive_once() -> None:
                job_id = run_now(conn, ARCHIVE_TYPE)
                status = "SELECT status FROM jobtui.job WHERE id = %s"
                wait_until(lambda: (conn.execute(status, (job_id,)).fetchone() or ("done",))[0] == "done", 30,
                         "the previous release's archiver", log)  # fmt: skip

            archive_once()
            assert archived_where(conn, ids) == {day_name(conn, 0): 40}
            # Rows past the archive's retention (30 days) outside any day's partition: its
            # DELETE by archived_at prunes them.
            conn.execute("UPDATE jobtui.job_archive SET archived_at = archived_at - interval '40 days' WHERE id < %s",
                         (ids[10],))  # fmt: skip
            assert archived_where(conn, ids) == {day_name(conn, 0): 30, "job_archive_default": 10}
            archive_once()
            assert archived_where(conn, ids) == {day_name(conn, 0): 30}
            assert " ERROR " not in log(), log()
        finally:
            proc.terminate()
            proc.wait(30)


def test_archiving_while_the_partitions_are_made(dsn: str, conn: Conn) -> None:
    """Two archivers at once (a slow run overlapping the next): each day is made once, and
    neither fails."""
    conn.execute(sql.SQL("DROP TABLE jobtui.{}, jobtui.{}").format(
        sql.Identifier(day_name(conn, 1)), sql.Identifier(day_name(conn, 2))))  # fmt: skip
    errors: list[BaseException] = []
    barrier = threading.Barrier(4, timeout=10)

    def archiver() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as own:
                barrier.wait()
                sweep(own, Retention())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=archiver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert {day_name(conn, d) for d in range(3)} <= partitions(conn)
