"""Migrations that build an index on a large table build it CONCURRENTLY, outside the
migration's transaction: enqueues and claims never wait for the build, a build killed midway
leaves an invalid index that the next `jobtui migrate` finds and builds again, and `migrate
--check` and `--dry-run` say so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from jobtui.kernel import migrate as migrations
from tests.waits import wait_until

Conn = psycopg.Connection[Any]
ROOT = Path(__file__).resolve().parents[2]
INDEX = "job_builtin_ready_idx"  # migration 0015's


def jobtui(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JOBTUI_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def migrated_before(conn: Conn, version: int) -> None:
    """The schema as an older `jobtui migrate` left it: every migration below `version`."""
    for statement in migrations._bootstrap("jobtui"):
        conn.execute(statement)
    for m in migrations.available():
        if m.version < version:
            conn.execute(m.text("jobtui").encode())
            conn.execute(migrations._recorded("jobtui", m))


def fill(conn: Conn, jobs: int) -> None:
    """`jobs` ready jobs of about 400 bytes each: past 8 MiB (migrate.SMALL_TABLE_BYTES) from
    25,000 on, so that the index is built CONCURRENTLY rather than in the migration's
    transaction."""
    conn.execute(
        "INSERT INTO jobtui.job (type, payload) SELECT 't', jsonb_build_object('pad', repeat('x', 300))"
        " FROM generate_series(1, %s)",
        (jobs,),
    )
    size = conn.execute("SELECT pg_relation_size('jobtui.job')").fetchone()
    assert size is not None and (size[0] >= 8 * 2**20) == (jobs >= 25_000), size


def index_state(conn: Conn, name: str) -> str:
    row = conn.execute(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'jobtui' AND c.relname = %s",
        (name,),
    ).fetchone()
    return "missing" if row is None else ("valid" if row[0] else "invalid")


def versions(conn: Conn) -> list[int]:
    return [r[0] for r in conn.execute("SELECT version FROM jobtui.migration ORDER BY version").fetchall()]


def building(conn: Conn, waiting: bool = False) -> int | None:
    """The backend of a session building (or waiting to build) an index on the job table;
    with `waiting`, only once it waits for a lock (a writer's open transaction)."""
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND query ~ 'CREATE INDEX' AND state = 'active'" + (" AND wait_event_type = 'Lock'" if waiting else "")
    ).fetchone()
    return None if row is None else int(row[0])


def timed(conn: Conn, statement: str) -> float:
    """Seconds `statement` took; it gives up on a lock after 3 s."""
    started = time.monotonic()
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '3s'")
        conn.execute(statement)
    return time.monotonic() - started


ENQUEUE = "INSERT INTO jobtui.job (type, payload) VALUES ('t', '{}')"
CLAIM = (
    "UPDATE jobtui.job SET status = 'running', locked_until = now() + interval '30 s', attempts = attempts + 1"
    " WHERE id = (SELECT id FROM jobtui.job WHERE status = 'ready' ORDER BY run_at, id LIMIT 1"
    " FOR UPDATE SKIP LOCKED)"
)


def test_a_build_killed_midway_blocks_nobody_and_the_next_migrate_builds_it_again(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrated_before(conn, 15)
        fill(conn, 25_000)
        with psycopg.connect(empty_dsn) as writer:
            # A writer's transaction left open: a build of an index on job waits for it.
            writer.execute(ENQUEUE)
            migrate = subprocess.Popen(
                [sys.executable, "-m", "jobtui.cli", "--dsn", empty_dsn, "migrate"],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            try:
                pid = wait_until(lambda: building(conn, waiting=True), 30, "the build to wait for the writer")
                # Meanwhile, enqueues and claims go on as before.
                assert timed(conn, ENQUEUE) < 1.0
                assert timed(conn, CLAIM) < 1.0
                # The migration is killed midway (its process, and then its session).
                migrate.send_signal(signal.SIGKILL)
                migrate.wait(10)
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                wait_until(lambda: building(conn) is None, 30, "the killed build's session to end")
            finally:
                if migrate.poll() is None:
                    migrate.kill()
                    migrate.wait(10)
            writer.rollback()
        assert index_state(conn, INDEX) == "invalid"  # what a killed CONCURRENTLY build leaves
        assert 15 not in versions(conn)

        check = jobtui(empty_dsn, "migrate", "--check")
        assert check.returncode == 1, check
        assert f"index {INDEX} is invalid (a build was interrupted)" in check.stdout, check.stdout
        dry = jobtui(empty_dsn, "migrate", "--dry-run")
        assert dry.returncode == 0, dry
        drop = dry.stdout.index(f'DROP INDEX CONCURRENTLY IF EXISTS "jobtui"."{INDEX}";')
        assert dry.stdout.index(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX}", drop) > drop, dry.stdout
        assert index_state(conn, INDEX) == "invalid"  # neither changed anything

        again = jobtui(empty_dsn, "migrate")
        assert again.returncode == 0, again
        assert f"rebuilt index {INDEX} (invalid: a build was interrupted)" in again.stdout, again.stdout
        assert index_state(conn, INDEX) == "valid"
        assert versions(conn) == [m.version for m in migrations.available()]
        plan = conn.execute(
            "EXPLAIN SELECT id FROM jobtui.job WHERE status = 'ready' AND queue = 'jobtui.builtin' ORDER BY run_at, id"
        ).fetchall()
        assert INDEX in str(plan)


def test_two_migrations_racing_over_an_index_build_apply_each_migration_once(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrated_before(conn, 15)
        fill(conn, 25_000)
    applied: list[list[int]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(3, timeout=10)

    def run() -> None:
        try:
            with psycopg.connect(empty_dsn, autocommit=True) as own:
                barrier.wait()
                applied.append([m.version for m in migrations.migrate(own)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    done = sorted(v for versions_ in applied for v in versions_)
    assert done == [m.version for m in migrations.available() if m.version >= 15]  # each once, by one of them
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert index_state(conn, INDEX) == "valid"
        assert versions(conn) == [m.version for m in migrations.available()]


def test_on_a_small_table_the_index_is_built_in_the_migrations_transaction(empty_dsn: str) -> None:
    """A new install (or a small queue): a CONCURRENTLY build would wait for every older
    transaction of the database, here one left open on another table."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrated_before(conn, 15)
        fill(conn, 1000)
        conn.execute("CREATE TABLE elsewhere (n int)")
        with psycopg.connect(empty_dsn) as reader:
            reader.execute("SELECT count(*) FROM elsewhere")  # its snapshot held, the transaction open
            dry = jobtui(empty_dsn, "migrate", "--dry-run")
            assert "built in the transaction" in dry.stdout and "CREATE INDEX IF NOT EXISTS job_builtin" in dry.stdout
            done = jobtui(empty_dsn, "migrate")
            assert done.returncode == 0, done
            assert "concurrently" not in done.stdout
        assert index_state(conn, INDEX) == "valid"
        assert versions(conn) == [m.version for m in migrations.available()]


def test_the_small_table_bound_is_the_one_the_tests_fill_past() -> None:
    assert migrations.SMALL_TABLE_BYTES == 8 * 2**20
