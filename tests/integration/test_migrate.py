"""Migrations: applied once, safe to race, refused on a newer schema, in any schema name,
and producing exactly the schema the named statements of jobtui/kernel/sql/ expect."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobtui import Client, Failure, InvalidInput, JobStatus, NewJob, SchemaNotMigrated, SchemaTooNew
from jobtui.core.jobs import COPY_THRESHOLD
from jobtui.kernel import migrate as migrations
from jobtui.kernel.db import query_names, statements
from jobtui.kernel.errors import MigrationLockTimeout
from tests.waits import wait_until

Conn = psycopg.Connection[Any]


@pytest.fixture
def empty_conn(empty_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(empty_dsn, autocommit=True) as connection:
        yield connection


# Advisory locks held in this test's own database (other databases of the server may hold theirs).
ADVISORY_LOCKS_HERE = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def versions(conn: Conn, schema: str = "jobtui") -> list[int]:
    query = sql.SQL("SELECT version FROM {}.migration ORDER BY version").format(sql.Identifier(schema))
    return [r[0] for r in conn.execute(query).fetchall()]


def schema_exists(conn: Conn, schema: str) -> bool:
    return bool(conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()[0])  # type: ignore[index]


def test_migrate_applies_every_version_once(empty_conn: Conn) -> None:
    expected = [m.version for m in migrations.available()]
    assert migrations.code_version() == expected[-1] >= 1
    assert migrations.applied_version(empty_conn) is None
    applied = migrations.migrate(empty_conn)
    assert [m.version for m in applied] == expected
    assert [m.name for m in applied] == [m.name for m in migrations.available()]
    assert applied[0].version == 1 and applied[0].name == "job_queue"
    assert versions(empty_conn) == expected
    assert migrations.applied_version(empty_conn) == expected[-1]
    assert migrations.check(empty_conn) == expected[-1]
    # The second run finds nothing to do and changes nothing.
    assert migrations.migrate(empty_conn) == []
    assert versions(empty_conn) == expected


def job_table_options(conn: Conn) -> list[str]:
    row = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'jobtui.job'::regclass").fetchone()
    assert row is not None
    return list(row[0] or [])


def test_the_job_table_fills_its_pages(empty_conn: Conn) -> None:
    # Free room kept on every page drew each update to a different page of old done rows.
    migrations.migrate(empty_conn)
    assert not [o for o in job_table_options(empty_conn) if o.startswith("fillfactor")]


def test_migration_5_resets_the_fillfactor_and_keeps_the_operators_settings(empty_conn: Conn) -> None:
    _migrated_to(empty_conn, 4)
    # As docs/operations.md advises operators to set.
    empty_conn.execute("ALTER TABLE jobtui.job SET (autovacuum_vacuum_threshold = 50000)")
    assert sorted(job_table_options(empty_conn)) == ["autovacuum_vacuum_threshold=50000", "fillfactor=80"]
    assert [m.version for m in migrations.migrate(empty_conn)] == [m.version for m in migrations.available()[4:]]
    assert job_table_options(empty_conn) == ["autovacuum_vacuum_threshold=50000"]


def test_migration_8_adds_the_queue_without_rewriting_or_scanning_the_job_table(empty_conn: Conn) -> None:
    _migrated_to(empty_conn, 7)
    empty_conn.execute("INSERT INTO jobtui.job (type) SELECT 't' FROM generate_series(1, 1000)")
    before = empty_conn.execute("SELECT pg_relation_filenode('jobtui.job')").fetchone()
    scans = "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'jobtui.job'::regclass"
    with empty_conn.transaction():
        scanned = empty_conn.execute(scans).fetchone()
        empty_conn.execute(migrations.available()[7].text("jobtui").encode())
        assert empty_conn.execute(scans).fetchone() == scanned  # the check is NOT VALID: no scan
    assert empty_conn.execute("SELECT pg_relation_filenode('jobtui.job')").fetchone() == before  # no rewrite
    assert empty_conn.execute("SELECT DISTINCT queue FROM jobtui.job").fetchall() == [("default",)]
    with pytest.raises(psycopg.errors.CheckViolation):
        empty_conn.execute("UPDATE jobtui.job SET queue = '' WHERE id = 1")


def test_migrate_applies_only_the_missing_versions(empty_conn: Conn) -> None:
    if migrations.code_version() < 2:
        pytest.skip("needs at least two migrations")
    _migrated_to(empty_conn, 1)
    with pytest.raises(SchemaNotMigrated, match="at version 1"):
        migrations.check(empty_conn)
    applied = migrations.migrate(empty_conn)
    assert [m.version for m in applied] == [m.version for m in migrations.available()[1:]]
    assert versions(empty_conn) == [m.version for m in migrations.available()]


def test_concurrent_migrations_of_an_empty_database(empty_dsn: str, empty_conn: Conn) -> None:
    workers = 4
    barrier = threading.Barrier(workers, timeout=10)
    applied: list[list[int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            with psycopg.connect(empty_dsn, autocommit=True) as own:
                barrier.wait()
                done = migrations.migrate(own)
            with lock:
                applied.append([m.version for m in done])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(applied) == workers
    expected = [m.version for m in migrations.available()]
    # Each migration applied once, by one of them: one applied the first ones, the others
    # found nothing left to do, or the rest once an online migration's index was built.
    assert sorted(v for done in applied for v in done) == expected
    assert [m.version for m in migrations.available() if m.online] != [], "the race crosses an index build"
    assert versions(empty_conn) == expected
    assert migrations.check(empty_conn) == expected[-1]
    # Every advisory lock was released.
    assert empty_conn.execute(ADVISORY_LOCKS_HERE).fetchone() == (0,)


def test_a_newer_schema_is_refused(conn: Conn) -> None:
    conn.execute("INSERT INTO jobtui.migration (version, name) VALUES (99, 'from_the_future')")
    before = versions(conn)
    with pytest.raises(SchemaTooNew) as info:
        migrations.migrate(conn)
    message = str(info.value)
    assert "99" in message and str(migrations.code_version()) in message
    assert "upgrade jobtui" in message and "\n" not in message
    assert versions(conn) == before
    assert conn.execute(ADVISORY_LOCKS_HERE).fetchone() == (0,)


def test_check_on_an_empty_database(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn) as own:
        with pytest.raises(SchemaNotMigrated) as info:
            migrations.check(own)
        assert "missing" in str(info.value) and "jobtui migrate" in str(info.value)
        # check leaves no transaction open on the caller's connection.
        assert own.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with Client(empty_dsn) as queue, pytest.raises(SchemaNotMigrated):
        queue.check_schema()


def test_check_on_an_older_schema(conn: Conn) -> None:
    newest = migrations.code_version()
    previous = migrations.available()[-2].version
    assert migrations.check(conn) == newest
    conn.execute("DELETE FROM jobtui.migration WHERE version = %s", (newest,))
    previous = migrations.available()[-2].version
    with pytest.raises(SchemaNotMigrated, match=f"at version {previous}, this jobtui needs version {newest}"):
        migrations.check(conn)


@pytest.mark.parametrize("bad", ["", "Jobs", "jobs-alt", "1jobs", "jobs alt", 'x"; DROP TABLE y; --', "a" * 64])
def test_bad_schema_names_are_refused(empty_conn: Conn, empty_dsn: str, bad: str) -> None:
    with pytest.raises(InvalidInput, match="bad schema name"):
        migrations.migrate(empty_conn, bad)
    with pytest.raises(InvalidInput, match="bad schema name"):
        Client(empty_dsn, schema=bad)
    assert empty_conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'pg_%' "
                              "AND nspname NOT IN ('public', 'information_schema')").fetchone() == (0,)  # fmt: skip


def test_a_custom_schema(empty_dsn: str, empty_conn: Conn) -> None:
    applied = migrations.migrate(empty_conn, "jobs_alt")
    assert [m.version for m in applied] == [m.version for m in migrations.available()]
    assert schema_exists(empty_conn, "jobs_alt") and not schema_exists(empty_conn, "jobtui")
    assert migrations.check(empty_conn, "jobs_alt") == migrations.code_version()
    with pytest.raises(SchemaNotMigrated):
        migrations.check(empty_conn, "jobtui")

    empty_conn.execute('LISTEN "jobs_alt.job"')
    with Client(empty_dsn, schema="jobs_alt") as q:
        q.check_schema()
        first = q.enqueue("t", {"n": 1}, key="k")
        assert q.enqueue("t", {"n": 2}, key="k") == first
        small = q.enqueue_many([NewJob("t", key="k"), NewJob("t", {"n": 3})])
        assert small[0] == first
        bulk = q.enqueue_many([NewJob("bulk", {"i": i}) for i in range(COPY_THRESHOLD)])
        assert len(bulk) == COPY_THRESHOLD and bulk == sorted(bulk)
        assert len(list(empty_conn.notifies(timeout=5, stop_after=1))) >= 1

        a, b = q.claim(["t"], worker="w1", limit=5)
        assert {a.id, b.id} == {first, small[1]}
        assert q.heartbeat([a.lease, b.lease]) == {a.id, b.id}
        assert q.complete([a.lease]) == {a.id}
        [outcome] = q.fail([Failure(b.lease, "boom", 0)])
        assert outcome.status == JobStatus.READY
        [again] = q.claim(["t"], worker="w2", lease=300)
        empty_conn.execute("UPDATE jobs_alt.job SET locked_until = now() - interval '1 second' WHERE id = %s",
                           (again.id,))  # fmt: skip
        [reaped] = q.reap()
        assert reaped.job_id == again.id
        [c] = q.claim(["t"], worker="w3")
        assert q.fail_permanently([c.lease], ["no"]) == {c.id}
        assert q.count_requeueable(job_type="t") == 1
        assert q.requeue([c.id], actor="op") == [c.id]
        [d] = q.claim(["t"], worker="w4")
        assert q.kill_lease([d.id], actor="op") == [d.id]
        assert q.cancel([d.id], actor="op") == [d.id]
        assert q.requeue_matching(error="cancelled", actor="op") == [d.id]
        [e] = q.claim(["t"], worker="w5")
        assert q.release([e.lease]) == {e.id}
        row = q.get(e.id)
        assert row is not None and row.status == JobStatus.READY

    counts = empty_conn.execute("SELECT count(*), count(*) FILTER (WHERE status = 'done') FROM jobs_alt.job").fetchone()
    assert counts == (2 + COPY_THRESHOLD, 1)
    assert empty_conn.execute("SELECT count(*) FROM jobs_alt.lease_expiry").fetchone() == (1,)


# -- the schema matches the code -----------------------------------------------------------

_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)[sbt]|%[sbt]")  # psycopg: s = any format, b = binary, t = text
# Utility statements, which PREPARE does not take: each is run for real by the tests of what
# uses it (bulk enqueue, LISTEN wake-ups, jobtui bench, demo --reset, jobtui index payload,
# jobtui uninstall).
_UTILITY = re.compile(r"^(\s*--[^\n]*\n)*\s*(COPY|LISTEN|DROP|COMMENT|VACUUM|CREATE|DO)\b", re.IGNORECASE)
UTILITY_STATEMENTS = {
    "job_copy", "claim_listen", "uninstall_schema_drop", "bench_schema_set_mark", "bench_vacuum",
    "payload_index_create", "payload_index_drop", "uninstall_role_drop",
}  # fmt: skip


def as_server_statement(text: str) -> str:
    """psycopg's %(name)s placeholders as $n (one number per name), and %% as %."""
    numbers: dict[str, int] = {}

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        key = match.group(1) or f"#{len(numbers)}"
        numbers.setdefault(key, len(numbers) + 1)
        return f"${numbers[key]}"

    return _PLACEHOLDER.sub(replace, text)


def test_placeholder_conversion() -> None:
    converted = as_server_statement("SELECT %(a)s, %(b)b, %(a)s, format('%%s', %(c)s) FROM x WHERE y LIKE 'z%%'")
    assert converted == "SELECT $1, $2, $1, format('%s', $3) FROM x WHERE y LIKE 'z%'"


@pytest.mark.parametrize("schema", ["jobtui", "jobs_alt"])
def test_every_named_statement_prepares_against_the_migrated_schema(dsn: str, schema: str) -> None:
    """PREPARE makes the server resolve every table, column, function and parameter type
    without running anything. A parameter whose type cannot be inferred fails here as it
    fails when psycopg binds a str (sent untyped)."""
    names = query_names()
    assert {
        "job_enqueue",
        "claim_take",
        "claim_heartbeat",
        "claim_complete",
        "claim_fail",
        "claim_reap",
        "job_copy",
    } <= set(names)
    failures = []
    skipped = []
    with psycopg.connect(dsn, autocommit=True) as own:
        if schema != "jobtui":
            migrations.migrate(own, schema)
        for name in names:
            text = statements(schema)[name].as_string(own)
            if _UTILITY.match(text):
                skipped.append(name)
                continue
            try:
                own.execute(f"PREPARE jobtui_check AS {as_server_statement(text)}".encode())
                own.execute("DEALLOCATE jobtui_check")
            except psycopg.Error as exc:
                failures.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    assert not failures, "\n".join(failures)
    assert set(skipped) == UTILITY_STATEMENTS, skipped


def test_copy_statement_matches_the_table(conn: Conn) -> None:
    """COPY cannot be prepared: run it for real with one row, inside a rolled-back transaction."""
    with conn.transaction(force_rollback=True), conn.cursor() as cur:
        cur.execute(statements("jobtui")["job_ids_reserve"], {"table": '"jobtui".job', "n": 1})
        [(job_id,)] = cur.fetchall()
        with cur.copy(statements("jobtui")["job_copy"]) as copy:
            copy.write_row((job_id, "t", '{"a": 1}', 3, '{"traceparent": "x"}', "q"))
        cur.execute("SELECT type, payload, max_attempts, status, meta, queue FROM jobtui.job WHERE id = %s", (job_id,))
        assert cur.fetchone() == ("t", {"a": 1}, 3, "ready", {"traceparent": "x"}, "q")


# Columns of the job table by the migration that added them; the union up to the code's
# version must be exactly what the database has.
JOB_COLUMNS_BY_VERSION: dict[int, dict[str, str]] = {
    1: {
        "id": "bigint",
        "type": "text",
        "payload": "jsonb",
        "idempotency_key": "text",
        "status": "text",
        "run_at": "timestamp with time zone",
        "attempts": "integer",
        "max_attempts": "integer",
        "locked_by": "text",
        "locked_until": "timestamp with time zone",
        "lease_token": "bigint",
        "heartbeat_at": "timestamp with time zone",
        "last_error": "text",
        "errors": "jsonb",
        "lease_expirations": "integer",
        "created_at": "timestamp with time zone",
        "started_at": "timestamp with time zone",
        "finished_at": "timestamp with time zone",
    },
    3: {"error_fingerprint": "text"},
    6: {"uncounted": "integer"},
    8: {"queue": "text"},
    10: {"meta": "jsonb"},
    12: {"runner": "jsonb"},
}


def test_migration_10_adds_meta_without_rewriting_the_table(empty_conn: Conn) -> None:
    _migrated_to(empty_conn, 9)
    empty_conn.execute("INSERT INTO jobtui.job (type) SELECT 't' FROM generate_series(1, 5000)")
    filenode = "SELECT pg_relation_filenode('jobtui.job')"
    before = empty_conn.execute(filenode).fetchone()
    assert [m.version for m in migrations.migrate(empty_conn)] == [m.version for m in migrations.available()[9:]]
    assert empty_conn.execute(filenode).fetchone() == before  # the same file: not rewritten
    assert empty_conn.execute("SELECT count(*), count(meta) FROM jobtui.job").fetchone() == (5000, 0)
    assert empty_conn.execute("SELECT count(meta) FROM jobtui.job_archive").fetchone() == (0,)


def test_migration_11_gives_schedules_and_minute_rows_a_queue_while_the_previous_release_writes_on(
    empty_conn: Conn,
) -> None:
    """A scheduler and an archiver of the previous release name no queue: their rows take the
    defaults, and the job table is not touched."""
    _migrated_to(empty_conn, 10)
    old_schedule = (
        "INSERT INTO jobtui.schedule (name, job_type, cron, next_run_at, last_slot)"
        " VALUES (%s, 't', '* * * * *', now(), now())"
    )
    old_minute = (
        "INSERT INTO jobtui.queue_minute (minute, ready, ready_due, done, dead, lease_expiries)"
        " VALUES (%s, 1, 1, 0, 0, 0)"
    )
    empty_conn.execute(old_schedule, ("before",))
    empty_conn.execute(old_minute, (datetime(2026, 1, 1, tzinfo=UTC),))
    filenode = "SELECT pg_relation_filenode('jobtui.job')"
    before = empty_conn.execute(filenode).fetchone()
    assert [m.version for m in migrations.migrate(empty_conn)][:1] == [11]
    assert empty_conn.execute(filenode).fetchone() == before
    empty_conn.execute(old_schedule, ("after",))  # the previous release's statements, as they are
    empty_conn.execute(old_minute, (datetime(2026, 1, 2, tzinfo=UTC),))
    queues = empty_conn.execute("SELECT name, queue FROM jobtui.schedule ORDER BY name").fetchall()
    assert queues == [("after", "default"), ("before", "default")]
    assert empty_conn.execute("SELECT DISTINCT by_queue::text FROM jobtui.queue_minute").fetchall() == [("{}",)]


def test_migration_12_adds_the_runner_without_rewriting_the_table(empty_conn: Conn) -> None:
    _migrated_to(empty_conn, 11)
    empty_conn.execute("INSERT INTO jobtui.job (type) SELECT 't' FROM generate_series(1, 5000)")
    # An archived job keeps the archive as it was (job_archive_legacy, migration 14).
    empty_conn.execute("INSERT INTO jobtui.job_archive (id, type, status) VALUES (1, 't', 'done')")
    filenode = "SELECT pg_relation_filenode('jobtui.job')"
    before = empty_conn.execute(filenode).fetchone()
    assert [m.version for m in migrations.migrate(empty_conn)][:1] == [12]
    assert empty_conn.execute(filenode).fetchone() == before  # the same file: not rewritten
    assert empty_conn.execute("SELECT count(*), count(runner) FROM jobtui.job").fetchone() == (5000, 0)
    # The archive, its day partitions and the legacy table all have it, as jsonb.
    names = _runner_in_archives(empty_conn)
    assert len(names) >= 5, names  # and the days ahead
    assert empty_conn.execute("SELECT count(*), count(runner) FROM jobtui.job_archive_legacy").fetchone() == (1, 0)


def test_migration_12_lands_after_13_and_14(empty_conn: Conn) -> None:
    """A schema migrated by code that had 0013 and 0014 but not yet 0012 (numbers are handed out
    ahead): it is not up to date, and `migrate` applies 0012 alone, archives included."""
    _migrated_to(empty_conn, 11)
    empty_conn.execute("INSERT INTO jobtui.job (type) SELECT 't' FROM generate_series(1, 5000)")
    empty_conn.execute("INSERT INTO jobtui.job_archive (id, type, status) VALUES (1, 't', 'done')")
    for m in migrations.available():
        if m.version > 12:
            _apply(empty_conn, m)
    runner = "SELECT count(*) FROM pg_attribute WHERE attrelid = 'jobtui.job'::regclass AND attname = 'runner'"
    assert empty_conn.execute(runner).fetchone() == (0,)
    assert migrations.applied_version(empty_conn) == migrations.code_version()
    newest = migrations.code_version()
    with pytest.raises(SchemaNotMigrated, match=f"at version {newest} but lacks 0012_job_runner, which this jobtui"):
        migrations.check(empty_conn)
    assert [m.version for m in migrations.pending(empty_conn)[1]] == [12]
    filenode = "SELECT pg_relation_filenode('jobtui.job')"
    before = empty_conn.execute(filenode).fetchone()
    assert [m.version for m in migrations.migrate(empty_conn)] == [12]
    assert empty_conn.execute(filenode).fetchone() == before  # the same file: not rewritten
    migrations.check(empty_conn)
    assert migrations.migrate(empty_conn) == []
    _runner_in_archives(empty_conn)
    assert empty_conn.execute("SELECT count(*), count(runner) FROM jobtui.job_archive_legacy").fetchone() == (1, 0)


def test_the_job_table_has_exactly_the_expected_columns(dsn: str, conn: Conn) -> None:
    expected: dict[str, str] = {}
    for version, columns in JOB_COLUMNS_BY_VERSION.items():
        if version <= migrations.code_version():
            expected.update(columns)
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = 'jobtui' AND table_name = 'job'"
    ).fetchall()
    assert dict(rows) == expected
    # get_job reads every column it knows by position: the row decodes as a JobRow.
    with Client(dsn) as q:
        job_id = q.enqueue("t", {"x": 1}, key="k")
        row = q.get(job_id)
    assert row is not None and row.idempotency_key == "k" and row.payload == {"x": 1}


def test_the_indexes_the_claim_and_reaper_rely_on(conn: Conn) -> None:
    rows = conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'jobtui' AND tablename = 'job'")
    indexes = dict(rows.fetchall())
    assert "(run_at, id) INCLUDE (type) WHERE (status = 'ready'::text)" in indexes["job_ready_idx"]
    assert "(locked_until) WHERE (status = 'running'::text)" in indexes["job_running_idx"]
    assert "UNIQUE" in next(d for d in indexes.values() if "(idempotency_key)" in d)


def test_migration_13_leaves_the_job_table_and_the_previous_claim_alone(empty_conn: Conn) -> None:
    _migrated_to(empty_conn, 12)
    empty_conn.execute("INSERT INTO jobtui.job (type, queue) SELECT 't', 'lim' FROM generate_series(1, 5000)")
    empty_conn.execute(
        "INSERT INTO jobtui.queue_control (kind, name, max_running, changed_by) VALUES ('queue', 'lim', 2, 'x')"
    )
    filenode = "SELECT pg_relation_filenode('jobtui.job')"
    before = empty_conn.execute(filenode).fetchone()
    after_levers = [m.version for m in migrations.available() if m.version >= 13]
    assert [m.version for m in migrations.migrate(empty_conn)] == after_levers
    assert empty_conn.execute(filenode).fetchone() == before  # the same file: not rewritten
    # The previous release's claim calls claim_limited with three arguments: it is there, as it was.
    got = empty_conn.execute("SELECT jobtui.claim_limited(NULL, ARRAY['t'], 10)").fetchone()
    assert got is not None and len(got[0]) == 2


def _migrated_to(conn: Conn, last: int) -> None:
    """The schema as the code of migration `last` left it: every migration up to it, recorded."""
    conn.execute("CREATE SCHEMA jobtui")
    conn.execute("CREATE TABLE jobtui.migration (version integer PRIMARY KEY, name text NOT NULL,"
                 " applied_at timestamptz NOT NULL DEFAULT now())")  # fmt: skip
    for m in migrations.available():
        if m.version <= last:
            _apply(conn, m)


def _apply(conn: Conn, m: migrations.Migration) -> None:
    """Migration `m`, applied and recorded as the code of its day did."""
    conn.execute(m.text("jobtui").encode())
    conn.execute("INSERT INTO jobtui.migration (version, name) VALUES (%s, %s)", (m.version, m.name))


def _runner_in_archives(conn: Conn) -> list[str]:
    """The archive tables, each checked to have the runner column, as jsonb."""
    archives = conn.execute(
        "SELECT c.relname, format_type(a.atttypid, a.atttypmod) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'jobtui'"
        " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'runner' AND NOT a.attisdropped"
        " WHERE c.relname LIKE 'job\\_archive%' AND c.relkind IN ('r', 'p') ORDER BY c.relname"
    ).fetchall()
    names = [str(name) for name, _ in archives]
    assert {"job_archive", "job_archive_default", "job_archive_legacy"} <= set(names), names
    assert {kind for _, kind in archives} == {"jsonb"}, archives
    return names


def test_a_migration_waiting_for_a_lock_lets_the_claims_go_on_and_tries_again(empty_dsn: str, empty_conn: Conn) -> None:
    """0012 locks the job table, then 0014 waits behind a long read of the archive: with no
    lock timeout every claim would queue behind the migration for as long as that read runs."""
    _migrated_to(empty_conn, 11)
    said: list[str] = []
    done: list[list[migrations.Migration]] = []
    with psycopg.connect(empty_dsn) as reader:
        reader.execute("SELECT count(*) FROM jobtui.job_archive")  # a long read, its transaction open

        def run() -> None:
            with psycopg.connect(empty_dsn, autocommit=True) as conn:
                done.append(migrations.migrate(conn, lock_timeout=0.5, tries=100, waited=said.append))

        thread = threading.Thread(target=run)
        thread.start()
        wait_until(lambda: said, 30, "the migration saying it waits for a lock")
        assert said and "nothing applied, the claims go on" in said[0], said
        # The job table is not held for the read's whole length: a claim's lock comes in time.
        started = time.monotonic()
        empty_conn.execute("SELECT count(*) FROM jobtui.job WHERE status = 'ready'")
        assert time.monotonic() - started < 2.0
        assert versions(empty_conn) == list(range(1, 12))
        reader.rollback()
    thread.join(30)
    assert [m.version for m in done[0]] == [m.version for m in migrations.available() if m.version >= 12]
    assert versions(empty_conn) == [m.version for m in migrations.available()]


def test_a_lock_never_granted_applies_nothing_and_says_what_to_do(empty_dsn: str, empty_conn: Conn) -> None:
    _migrated_to(empty_conn, 11)
    with psycopg.connect(empty_dsn) as reader:
        reader.execute("SELECT count(*) FROM jobtui.job_archive")
        with pytest.raises(MigrationLockTimeout, match="no migration applied: a table lock was not granted in 2 tries"):
            migrations.migrate(empty_conn, lock_timeout=0.2, tries=2)
        reader.rollback()
    assert versions(empty_conn) == list(range(1, 12))


def test_an_owner_without_create_on_the_database_migrates_the_schema_made_for_it(empty_dsn: str) -> None:
    """A DBA creates the schema for the owner role: that role needs no CREATE on the database."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from tests.roles import drop_roles, role_names

    owner, _ = role_names("jobtui_owner")
    dbname = conninfo_to_dict(empty_dsn)["dbname"]
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(owner)))
            admin.execute(sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(sql.Identifier(str(dbname))))
            admin.execute(sql.SQL("CREATE SCHEMA jobtui AUTHORIZATION {}").format(sql.Identifier(owner)))
            assert not admin.execute(
                "SELECT has_database_privilege(%s, current_database(), 'CREATE')", (owner,)
            ).fetchone()[0]  # type: ignore[index]
        with psycopg.connect(make_conninfo(empty_dsn, user=owner), autocommit=True) as conn:
            applied = migrations.migrate(conn)
            assert [m.version for m in applied] == [m.version for m in migrations.available()]
            assert migrations.migrate(conn) == []
    finally:
        drop_roles(empty_dsn, owner)
