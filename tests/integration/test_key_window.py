"""Idempotency keys outlive their jobs: a key is kept `--key-retention` (7 days by default)
after its job finished, whatever became of the job (archived, deleted by --delete-done, dead
and pruned, discarded). A repeated enqueue inside that window returns the original id, on
every enqueue path; outside it, the key makes a new job. At the boundary (the row moving
out while enqueues of its key arrive, the key pruned while they arrive) there is still one
job."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from jobtui import AsyncClient, Client, Failure, NewJob
from jobtui.core.bulk import Bulk
from jobtui.core.maintenance import Retention, sweep
from jobtui.core.registry import ScheduleSpec
from jobtui.core.scheduler import fire_due, slot_key, upsert
from jobtui.kernel.db import Call, run
from jobtui.kernel.jobfilter import JobFilter
from tests.conftest import scalar
from tests.waits import wait_until

Conn = psycopg.Connection[Any]
DAY = 86400.0


@pytest.fixture
def queue(dsn: str) -> Any:
    with Client(dsn) as q:
        yield q


def finished(q: Client, key: str, outcome: str = "done", job_type: str = "mail") -> int:
    """A job of `key` that ended `outcome` (done, failed or dead)."""
    job_id = q.enqueue(job_type, {"user_id": 42}, key=key, max_attempts=1)
    [claimed] = q.claim([job_type], worker="w1")
    if outcome == "done":
        assert q.complete([claimed.lease]) == {job_id}
    elif outcome == "failed":
        assert q.fail_permanently([claimed.lease], ["bad input"]) == {job_id}
    else:
        [failed] = q.fail([Failure(claimed.lease, "RuntimeError: no", 0.0)])
        assert failed.status == "dead"
    return job_id


def age(conn: Conn, ids: list[int], interval: str) -> None:
    """Pretend these jobs finished `interval` ago."""
    conn.execute("UPDATE jobtui.job SET finished_at = now() - %s::interval WHERE id = ANY(%s)", (interval, ids))


def rows_of(conn: Conn, key: str) -> int:
    """Jobs holding `key` in the queue table."""
    row = conn.execute("SELECT count(*) FROM jobtui.job WHERE idempotency_key = %s", (key,)).fetchone()
    assert row is not None
    return int(row[0])


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--dsn", dsn, *args], capture_output=True, text=True, timeout=60
    )


async def _async_enqueue(dsn: str, key: str) -> list[int]:
    async with AsyncClient(dsn) as aq:
        one = await aq.enqueue("mail", {"again": "async"}, key=key)
        many = await aq.enqueue_many([NewJob("mail", {"again": "async many"}, key=key)])
    return [one, *many]


def every_enqueue_path(dsn: str, q: Client, key: str) -> list[int]:
    """The id each enqueue path returns for `key`: Client.enqueue, enqueue_many (with a keyless
    job and a repeated key in the batch), inside a caller's transaction, AsyncClient's two, and
    `jobtui enqueue`."""
    ids = [q.enqueue("mail", {"again": True}, key=key)]
    many = q.enqueue_many([NewJob("mail", {"n": 1}), NewJob("mail", {"n": 2}, key=key), NewJob("mail", key=key)])
    ids += many[1:]
    with psycopg.connect(dsn) as caller:
        caller.execute("SELECT 1")  # the caller's transaction is open
        ids.append(q.enqueue("mail", {"again": "in a transaction"}, key=key, conn=caller))
        ids += q.enqueue_many([NewJob("mail", key=key)], conn=caller)
    ids += asyncio.run(_async_enqueue(dsn, key))
    enqueued = cli(dsn, "enqueue", "mail", "--key", key)
    assert enqueued.returncode == 0, enqueued.stderr
    ids.append(int(enqueued.stdout))
    return ids


def test_an_archived_jobs_key_returns_its_id_on_every_enqueue_path(dsn: str, conn: Conn, queue: Client) -> None:
    original = finished(queue, "welcome:42")
    age(conn, [original], "2 days")
    assert sweep(conn, Retention()).archived == 1
    assert rows_of(conn, "welcome:42") == 0  # gone from the queue table
    assert every_enqueue_path(dsn, queue, "welcome:42") == [original] * 8
    assert rows_of(conn, "welcome:42") == 0  # and no new job made


@pytest.mark.parametrize(
    ("outcome", "retention"),
    [
        ("done", Retention(delete_done=True)),  # --delete-done
        ("dead", Retention(dead=DAY)),  # dead, pruned after --dead-retention
        ("failed", Retention(dead=DAY)),
    ],
    ids=["deleted-done", "dead-pruned", "failed-pruned"],
)
def test_a_deleted_jobs_key_returns_its_id(conn: Conn, queue: Client, outcome: str, retention: Retention) -> None:
    original = finished(queue, f"k-{outcome}", outcome)
    age(conn, [original], "2 days")
    swept = sweep(conn, retention)
    assert swept.deleted_done + swept.deleted_dead == 1
    assert conn.execute("SELECT count(*) FROM jobtui.job_archive").fetchone() == (0,)
    assert queue.enqueue("mail", key=f"k-{outcome}") == original
    assert rows_of(conn, f"k-{outcome}") == 0


def test_a_discarded_jobs_key_returns_its_id(conn: Conn, queue: Client) -> None:
    original = finished(queue, "discarded", "dead")
    discard = Bulk(conn, "discard", JobFilter(types=("mail",)), actor="olga")
    assert discard.run(discard.start()).changed == 1
    assert queue.enqueue("mail", key="discarded") == original
    assert rows_of(conn, "discarded") == 0


def test_the_window_counts_from_when_the_job_finished(conn: Conn, queue: Client) -> None:
    inside = finished(queue, "inside")
    outside = finished(queue, "outside")
    age(conn, [inside], "6 days")
    age(conn, [outside], "8 days")
    assert sweep(conn, Retention()).archived == 2  # the default window: 7 days
    assert queue.enqueue("mail", key="inside") == inside
    renewed = queue.enqueue("mail", key="outside")
    assert renewed > outside and rows_of(conn, "outside") == 1
    assert queue.enqueue("mail", key="outside") == renewed
    # A shorter window, as `--key-retention 1d` sets it.
    later = finished(queue, "short", job_type="report")
    age(conn, [later], "2 days")
    sweep(conn, Retention(key=DAY))
    assert queue.enqueue("mail", key="short") > later
    assert queue.enqueue("mail", key="inside") > inside


def test_a_repeated_enqueue_of_a_live_key_is_unchanged(conn: Conn, queue: Client) -> None:
    first = queue.enqueue("mail", {"n": 1}, key="live")
    ids = queue.enqueue_many([NewJob("mail", key="live"), NewJob("mail", key="new"), NewJob("mail", key="new")])
    assert ids[0] == first and ids[1] == ids[2] != first
    # A caller's transaction that rolls back takes its key with it.
    with psycopg.connect(queue.dsn) as caller:
        gone = queue.enqueue("mail", key="rolled-back", conn=caller)
        caller.rollback()
    again = queue.enqueue("mail", key="rolled-back")
    assert again != gone and rows_of(conn, "rolled-back") == 1


# -- schedules ----------------------------------------------------------------------------------


async def _tick(dsn: str) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        return await fire_due(aconn)


def test_a_late_backfill_after_the_slots_job_was_archived_enqueues_nothing(dsn: str, conn: Conn) -> None:
    spec = ScheduleSpec(name="nightly", cron="0 3 * * *", type="report", missed="all", offset=0.0)
    with conn.transaction():
        sid = upsert(conn, spec, source="cli")
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    assert isinstance(now, datetime)
    # The newest slot passed (03:00 UTC today or yesterday), long past its grace.
    slot = (now - timedelta(hours=3)).astimezone(UTC).replace(hour=3, minute=0, second=0, microsecond=0)

    def rewind() -> None:
        # As if no scheduler had handled anything since just before the slot.
        before = slot - timedelta(seconds=1)
        conn.execute("UPDATE jobtui.schedule SET last_slot = %s, next_run_at = %s WHERE id = %s", (before, slot, sid))

    rewind()
    fired = [f for f in asyncio.run(_tick(dsn)) if f.schedule == "nightly"]
    assert [f.slot for f in fired] == [slot]
    key = slot_key(sid, slot)
    with Client(dsn) as q:
        [claimed] = q.claim(["report"], worker="w1")
        q.complete([claimed.lease])
    age(conn, [claimed.id], "2 days")
    assert sweep(conn, Retention()).archived == 1
    rewind()  # a scheduler (of any release) handles the slot again, late
    asyncio.run(_tick(dsn))
    assert rows_of(conn, key) == 0, "the slot's job was enqueued twice"
    archived = conn.execute("SELECT count(*) FROM jobtui.job_archive WHERE idempotency_key = %s", (key,))
    assert archived.fetchone() == (1,)


# -- the boundary, raced ------------------------------------------------------------------------


def _waiting(conn: Conn, n: int, timeout: float = 10.0) -> None:
    """Until `n` sessions of this database wait for a lock."""
    wait_until(lambda: _lock_waits(conn) >= n, timeout, f"{n} enqueues to wait for the lock")


def _lock_waits(conn: Conn) -> int:
    """How many sessions of this database wait for a lock."""
    ours = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    return int(scalar(conn, f"SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND pid IN ({ours})"))


def _racing(dsn: str, key: str, n: int = 2) -> tuple[list[threading.Thread], list[int | BaseException]]:
    """`n` enqueues of `key` at once, each on its own connection, started."""
    results: list[int | BaseException] = []

    def enqueue() -> None:
        try:
            with Client(dsn, max_connections=1) as q:
                results.append(q.enqueue("mail", {"raced": True}, key=key))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=enqueue) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, results


def _answered_or_waiting(conn: Conn, threads: list[threading.Thread], n: int) -> None:
    """Until each enqueue has its answer or waits for a lock."""
    wait_until(
        lambda: sum(not t.is_alive() for t in threads) + _lock_waits(conn) >= n,
        10,
        "the enqueues to answer or wait for the lock",
    )


@pytest.mark.parametrize("end", ["commit", "rollback"])
@pytest.mark.parametrize("made_by", ["this release", "the previous release"])
def test_enqueues_racing_the_archiver_moving_the_job_get_the_original(
    dsn: str, conn: Conn, queue: Client, end: str, made_by: str
) -> None:
    original = finished(queue, "raced")
    if made_by == "the previous release":  # which enqueued it with no row in job_key
        conn.execute("DELETE FROM jobtui.job_key WHERE key = 'raced'")
    age(conn, [original], "2 days")
    with psycopg.connect(dsn) as mover:
        # The archiver's batch has moved the row out of the queue table and not committed.
        moved = run(mover, Call("maintenance_archive_done", {"retention": DAY, "limit": 10}, lambda rows: rows[0][0]))
        assert moved == 1
        threads, results = _racing(dsn, "raced")
        _answered_or_waiting(conn, threads, 2)
        getattr(mover, end)()
    for t in threads:
        t.join(30)
    assert results == [original, original], results
    assert rows_of(conn, "raced") == (0 if end == "commit" else 1)
    if end == "commit":  # and the key stays with its job, whichever release enqueued it
        assert queue.enqueue("mail", key="raced") == original


def test_enqueues_racing_the_pruning_of_an_expired_key_make_one_new_job(dsn: str, conn: Conn, queue: Client) -> None:
    original = finished(queue, "expiring")
    age(conn, [original], "10 days")
    assert sweep(conn, Retention(key=30 * DAY)).archived == 1  # archived, its key kept
    with psycopg.connect(dsn) as pruner:
        pruned = run(
            pruner, Call("maintenance_job_key_prune", {"retention": 7 * DAY, "limit": 10}, lambda rows: rows[0][0])
        )
        assert pruned == 1
        threads, results = _racing(dsn, "expiring", 3)
        _waiting(conn, 3)
        pruner.commit()
    for t in threads:
        t.join(30)
    assert len(set(results)) == 1 and isinstance(results[0], int) and results[0] > original, results
    assert rows_of(conn, "expiring") == 1


# -- what the operator reads --------------------------------------------------------------------


def test_stats_shows_the_key_window_with_the_tables_health(dsn: str, queue: Client) -> None:
    finished(queue, "shown")
    text = cli(dsn, "stats")
    assert text.returncode == 0, text.stderr
    assert "job_key: " in text.stdout and "keys kept 7d after their jobs finish" in text.stdout, text.stdout
    raw = cli(dsn, "stats", "--json")
    assert raw.returncode == 0, raw.stderr
    assert json.loads(raw.stdout)["key_retention"] == 7 * DAY


def test_the_roles_that_could_use_the_job_table_can_use_the_keys_after_the_migration(empty_dsn: str) -> None:
    """Granted as the previous release's docs/grants.sql did, before job_key existed."""
    from jobtui.kernel import migrate as migrations
    from tests.roles import drop_roles, role_names

    worker, reader = role_names()
    delegate = f"{worker}_delegate"
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as admin:
            for statement in migrations._bootstrap("jobtui"):
                admin.execute(statement)
            for m in migrations.available():
                if m.version < 17:
                    admin.execute(m.text("jobtui").encode())
                    admin.execute(migrations._recorded("jobtui", m))
            for role in (worker, reader):
                admin.execute(f'CREATE ROLE "{role}" LOGIN')
                admin.execute(f'GRANT USAGE ON SCHEMA jobtui TO "{role}"')
            admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON jobtui.job TO "{worker}"')
            admin.execute(f'CREATE ROLE "{delegate}"')
            admin.execute(f'GRANT INSERT ON jobtui.job TO "{delegate}" WITH GRANT OPTION')
            admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA jobtui TO "{reader}"')
            assert [m.version for m in migrations.migrate(admin)] == [
                m.version for m in migrations.available() if m.version >= 17
            ]
            granted = admin.execute(
                "SELECT r, p, has_table_privilege(r, 'jobtui.job_key', p) FROM unnest(%s::text[]) AS r,"
                " unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p ORDER BY 1, 2",
                ([worker, reader],),
            ).fetchall()
            # A keyed enqueue draws its id from the sequence (migration 0024 grants it, with
            # the grant option where INSERT has it).
            sequence = admin.execute(
                "SELECT has_sequence_privilege(%s, pg_get_serial_sequence('jobtui.job', 'id'), 'USAGE'),"
                " has_sequence_privilege(%s, pg_get_serial_sequence('jobtui.job', 'id'), 'USAGE WITH GRANT OPTION'),"
                " has_sequence_privilege(%s, pg_get_serial_sequence('jobtui.job', 'id'), 'USAGE')",
                (worker, delegate, reader),
            ).fetchone()
        assert {(r, p) for r, p, ok in granted if ok} == {
            (worker, p) for p in ("SELECT", "INSERT", "UPDATE", "DELETE")
        } | {(reader, "SELECT")}
        assert sequence == (True, True, False)
        # The role enqueued keyed jobs before the upgrade, and still does, one by one and in a
        # batch.
        with Client(make_conninfo(empty_dsn, user=worker)) as as_worker:
            first = as_worker.enqueue("mail", key="granted-by-hand")
            batch = [NewJob("mail", key="granted-by-hand"), NewJob("mail", key="other")]
            assert as_worker.enqueue_many(batch)[0] == first
    finally:
        drop_roles(empty_dsn, worker, reader, delegate)


def test_a_key_forgotten_between_a_batchs_two_statements_makes_its_job_and_nothing_twice(
    conn: Conn, queue: Client
) -> None:
    """The archiver forgets a key (its window passed) after the batch's insert found it taken
    and before the batch reads whose it is: that job is enqueued again, alone."""
    old = finished(queue, "forgotten")
    age(conn, [old], "2 days")
    sweep(conn, Retention())
    # Stands in for the archiver: the batch's insert itself forgets the key once it is done.
    conn.execute(
        "CREATE FUNCTION forget() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN DELETE FROM jobtui.job_key WHERE key = 'forgotten'; RETURN NULL; END $$"
    )
    conn.execute("CREATE TRIGGER forget AFTER INSERT ON jobtui.job FOR EACH STATEMENT EXECUTE FUNCTION forget()")
    ids = queue.enqueue_many([NewJob("mail", {"n": 1}), NewJob("mail", key="forgotten"), NewJob("mail", key="new")])
    conn.execute("DROP TRIGGER forget ON jobtui.job")
    assert ids[1] not in (old, ids[0], ids[2])
    assert rows_of(conn, "forgotten") == 1 and rows_of(conn, "new") == 1
    assert conn.execute("SELECT count(*) FROM jobtui.job WHERE type = 'mail'").fetchone() == (3,)


def test_a_truncate_that_restarts_the_ids_forgets_every_key(conn: Conn, queue: Client) -> None:
    """TRUNCATE ... RESTART IDENTITY gives the ids out again: a key kept for a job that left
    before would return whichever new job drew its id. Every key goes with the restart."""
    archived = finished(queue, "left-before")
    age(conn, [archived], "2 days")
    sweep(conn, Retention())
    conn.execute("TRUNCATE jobtui.job RESTART IDENTITY")
    drawn = 0
    while drawn < archived:  # new jobs draw the ids again, up to the one the key kept
        drawn = queue.enqueue("billing", {"amount": 100})
    assert drawn == archived
    again = queue.enqueue("mail", key="left-before")
    assert again != archived
    assert conn.execute("SELECT type, idempotency_key FROM jobtui.job WHERE id = %s", (again,)).fetchone() == (
        "mail",
        "left-before",
    )


def test_a_role_that_may_truncate_the_job_table_truncates_it_and_the_kept_keys_stay(
    dsn: str, conn: Conn, queue: Client
) -> None:
    """TRUNCATE on `job` alone is enough: the trigger forgets the keys with its owner's rights.
    Without a restart the kept keys stay, the ids below the sequence's next."""
    from tests.roles import drop_roles, role_names

    role, _ = role_names("keys")
    archived = finished(queue, "left-before")
    age(conn, [archived], "2 days")
    sweep(conn, Retention())
    live = queue.enqueue("mail", key="in-the-table")
    try:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT USAGE ON SCHEMA jobtui TO "{role}"')
        conn.execute(f'GRANT TRUNCATE ON jobtui.job TO "{role}"')
        with psycopg.connect(make_conninfo(dsn, user=role), autocommit=True) as truncater:
            truncater.execute("TRUNCATE jobtui.job")
        assert queue.enqueue("mail", key="left-before") == archived
        assert queue.enqueue("mail", key="in-the-table") != live
    finally:
        drop_roles(dsn, role)


ATTACH = "CREATE TRIGGER steal AFTER TRUNCATE ON mine FOR EACH STATEMENT EXECUTE FUNCTION jobtui.job_key_truncated()"


def test_no_role_makes_the_truncate_trigger_forget_keys_from_a_table_of_its_own(dsn: str, queue: Client) -> None:
    """The truncate's trigger runs with its owner's rights: PUBLIC may not make it the trigger
    of a table of its own (a read-only role's temporary one), and it refuses any table but
    `job` for a role that may execute it."""
    from tests.roles import grant_roles

    kept = queue.enqueue("mail", key="still-here")
    with grant_roles(dsn) as roles:
        with psycopg.connect(roles.readonly_dsn, autocommit=True) as viewer:
            viewer.execute("CREATE TEMP TABLE mine (x int)")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                viewer.execute(ATTACH)
        with psycopg.connect(roles.worker_dsn, autocommit=True) as worker:
            worker.execute("CREATE TEMP TABLE mine (x int)")
            worker.execute(ATTACH)
            with pytest.raises(psycopg.errors.RaiseException, match="trigger of"):
                worker.execute("TRUNCATE mine")
    assert queue.enqueue("mail", key="still-here") == kept


def test_a_truncated_job_table_takes_its_jobs_keys_with_it(conn: Conn, queue: Client) -> None:
    """A test suite's reset: the keys of the jobs it removed are free again; those of jobs that
    had left the table before keep their window."""
    archived = finished(queue, "left-before")
    age(conn, [archived], "2 days")
    sweep(conn, Retention())
    live = queue.enqueue("mail", key="in-the-table")
    conn.execute("TRUNCATE jobtui.job")
    assert queue.enqueue("mail", key="in-the-table") != live
    assert rows_of(conn, "in-the-table") == 1
    assert queue.enqueue("mail", key="left-before") == archived
