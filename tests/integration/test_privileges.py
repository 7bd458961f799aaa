"""jobtui under least privilege: the roles and GRANTs of docs/grants.sql (README, Privileges).

A worker role runs workers, schedulers, enqueueing and every operator command, and cannot
change the schema; a read-only role can read everything (CLI, metrics, the console in
read-only mode) and change nothing: a write fails with a permission error, reported by the
CLI in one line. The roles are created in this test's own database and dropped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from jobtui import Client, Failure, JobStatus, NewJob
from jobtui.cli.main import main
from jobtui.core.maintenance import Retention, summarise_hours, sweep
from jobtui.core.registry import Job, Jobs
from jobtui.reads.metrics import snapshot
from jobtui.worker import Worker
from tests.conftest import with_dbname
from tests.waits import until, wait_until

GRANTS = Path(__file__).resolve().parents[2] / "docs" / "grants.sql"
DENIED = psycopg.errors.InsufficientPrivilege
Conn = psycopg.Connection[Any]

# What the worker role may do, table by table: nothing more (checked against the catalog).
WORKER_TABLES = {
    "job": {"SELECT", "INSERT", "UPDATE", "DELETE"},
    "job_key": {"SELECT", "INSERT", "UPDATE", "DELETE"},
    "schedule": {"SELECT", "INSERT", "UPDATE", "DELETE"},
    "job_archive": {"SELECT", "INSERT", "DELETE"},
    "lease_expiry": {"SELECT", "INSERT", "DELETE"},
    "stats_hourly": {"SELECT", "INSERT", "DELETE"},
    "done_tally": {"SELECT", "INSERT", "UPDATE", "DELETE"},
    "queue_minute": {"SELECT", "INSERT", "DELETE"},
    "effect": {"SELECT", "INSERT", "DELETE"},
    "audit": {"SELECT", "INSERT"},
    "migration": {"SELECT"},
    "queue_control": {"SELECT", "INSERT", "UPDATE"},
    "rate_bucket": {"SELECT", "INSERT", "UPDATE"},
    "queue_flow": {"SELECT", "INSERT", "DELETE"},
    "bulk_run": {"SELECT", "INSERT", "UPDATE"},
    "fleet": {"SELECT", "INSERT", "UPDATE", "DELETE"},
}


@dataclass(frozen=True)
class Roles:
    admin: str  # the owner's (the test's superuser) DSN of the database
    worker: str
    readonly: str
    worker_role: str
    readonly_role: str


def apply_grants(admin_dsn: str, role: str, *, read_only: bool) -> None:
    """Apply docs/grants.sql as docs/operations.md says: with psql, or (no psql here) the same text
    with psql's variables filled in the way psql does."""
    variables = ["-v", "schema=jobtui", "-v", f"role={role}"] + (["-v", "read_only=1"] if read_only else [])
    psql = shutil.which("psql")
    if psql:
        subprocess.run([psql, "-X", "-q", admin_dsn, *variables, "-f", str(GRANTS)], check=True, timeout=60)
        return
    text = GRANTS.read_text(encoding="utf-8")
    text = re.sub(r"\\if :\{\?create_role\}\n.*?\\endif\n\\endif\n", "", text, flags=re.S)  # roles exist here
    text = re.sub(r"\\if :\{\?read_only\}\n(.*)\\else\n(.*)\\endif\n", r"\1" if read_only else r"\2", text, flags=re.S)
    text = text.replace("\\set ON_ERROR_STOP on\n", "")
    text = text.replace(':"schema"', '"jobtui"').replace(':"role"', sql.Identifier(role).as_string())
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(text.encode())


@pytest.fixture(scope="module")
def roles(server_dsn: str, template_db: str) -> Iterator[Roles]:
    """A migrated database of this module's own, with the two roles and their grants."""
    suffix = os.getpid()
    db, worker_role, readonly_role = (f"jobtui_priv_{suffix}", f"jobtui_worker_{suffix}", f"jobtui_readonly_{suffix}")
    ident = sql.Identifier
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(ident(db), ident(template_db)))
        for role in (worker_role, readonly_role):
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident(role)))
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident(role)))
    admin_dsn = with_dbname(server_dsn, db)
    apply_grants(admin_dsn, worker_role, read_only=False)
    apply_grants(admin_dsn, readonly_role, read_only=True)
    yield Roles(
        admin_dsn,
        make_conninfo(admin_dsn, user=worker_role),
        make_conninfo(admin_dsn, user=readonly_role),
        worker_role,
        readonly_role,
    )
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        for role in (worker_role, readonly_role):
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(ident(role)))  # its privileges here
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident(db)))
        for role in (worker_role, readonly_role):
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident(role)))


@pytest.fixture
def admin(roles: Roles) -> Iterator[Conn]:
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        yield conn


def jobtui(dsn: str, *args: str) -> tuple[int, str, str]:
    """`jobtui --dsn DSN ARGS`, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["--dsn", dsn, *args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def works(dsn: str, *args: str) -> str:
    code, out, err = jobtui(dsn, *args)
    assert code == 0, (args, code, out, err)
    return out


def refused(dsn: str, *args: str) -> str:
    """A write the role may not make: one line, exit code 2, naming the privilege problem."""
    code, out, err = jobtui(dsn, *args)
    assert (code, out) == (2, ""), (args, code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.fullmatch(
        r"jobtui: error: permission denied for table \w+: the database role lacks a privilege .*", lines[0]
    )
    return lines[0]


def everything(admin: Conn) -> list[Any]:
    """Every row of every jobtui table, to show that nothing changed."""
    names = [r[0] for r in admin.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'jobtui' ORDER BY 1")]
    return [
        (
            name,
            admin.execute(
                sql.SQL("SELECT to_jsonb(t) FROM jobtui.{} t ORDER BY 1").format(sql.Identifier(name))
            ).fetchall(),
        )
        for name in names
    ]


def dead_job(admin_dsn: str, job_type: str = "priv.dead") -> int:
    with Client(admin_dsn) as q:
        job_id = q.enqueue(job_type, max_attempts=1)
        [job] = q.claim([job_type], worker="w0")
        q.fail([Failure(job.lease, "RuntimeError: boom", 0)])
    return job_id


# -- the grants ----------------------------------------------------------------------------


def test_the_roles_have_exactly_the_documented_privileges(roles: Roles, admin: Conn) -> None:
    def privileges(role: str) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for table, privilege in admin.execute(
            "SELECT table_name, privilege_type FROM information_schema.role_table_grants"
            " WHERE table_schema = 'jobtui' AND grantee = %s",
            (role,),
        ):
            found.setdefault(table, set()).add(privilege)
        return found

    assert privileges(roles.worker_role) == WORKER_TABLES
    every_table = {
        r[0]
        for r in admin.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'jobtui'::regnamespace"
            " AND relkind IN ('r', 'p') AND NOT relispartition"
        )
    }
    assert every_table == set(WORKER_TABLES)  # a new table needs a line in docs/grants.sql
    # The archive's partitions (read through job_archive) may be readable too, nothing more.
    readable = privileges(roles.readonly_role)
    assert {t: p for t, p in readable.items() if t in every_table} == {table: {"SELECT"} for table in every_table}
    assert all(t.startswith("job_archive_") and p == {"SELECT"} for t, p in readable.items() if t not in every_table)
    for role in (roles.worker_role, roles.readonly_role):
        row = admin.execute(
            "SELECT has_schema_privilege(%(r)s, 'jobtui', 'USAGE'), has_schema_privilege(%(r)s, 'jobtui', 'CREATE'),"
            " has_database_privilege(%(r)s, current_database(), 'CREATE')",
            {"r": role},
        ).fetchone()
        assert row == (True, False, False)
    sequences = admin.execute(
        "SELECT bool_and(has_sequence_privilege(%s, c.oid, 'USAGE')),"
        " bool_or(has_sequence_privilege(%s, c.oid, 'USAGE'))"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'jobtui' AND c.relkind = 'S'",
        (roles.worker_role, roles.readonly_role),
    ).fetchone()
    assert sequences == (True, False)


# -- the worker role ------------------------------------------------------------------------


def _worker_app(dsn: str) -> Jobs:
    jobs = Jobs()

    @jobs.handler("priv.ok", max_attempts=2)
    def ok(job: Job) -> None:
        with psycopg.connect(dsn) as conn:  # the handler's own effect, with the same role
            job.once(conn, f"priv-effect:{job.id}")

    @jobs.handler("priv.boom", max_attempts=1)
    def boom(job: Job) -> None:
        raise RuntimeError("boom")

    jobs.schedule("priv.every-second", cron="* * * * * *", type="priv.ok")
    return jobs


def test_the_worker_role_runs_workers_enqueues_and_operates(roles: Roles, admin: Conn) -> None:
    w = roles.worker
    ok_id = int(works(w, "enqueue", "priv.ok", "--payload", '{"n": 1}', "--key", "priv-1"))
    boom_id = int(works(w, "enqueue", "priv.boom"))
    with Client(w) as q:
        bulk = q.enqueue_many([NewJob("priv.bulk", {"i": i}) for i in range(1000)])  # COPY, ids from the sequence
        assert len(set(bulk)) == 1000
    # A job whose worker died: the worker role's reaper returns it, and its worker runs it.
    with Client(roles.admin) as q:
        crashed = q.enqueue("priv.ok")
        [claimed] = q.claim(["priv.ok"], worker="dead-worker", lease=300)
        assert claimed.id in (ok_id, crashed)
        admin.execute("UPDATE jobtui.job SET locked_until = now() - interval '1 second' WHERE id = %s", (claimed.id,))

    async def run_worker() -> Worker:
        worker = Worker(_worker_app(w), w, concurrency=4, lease=5, poll_interval=0.1, reap_interval=0.2)
        task = asyncio.create_task(worker.run())

        def all_ran() -> bool:
            scheduled, finished = admin.execute(
                # The built-in archive schedule's jobs have schedule keys too: count this app's.
                "SELECT count(*) FILTER (WHERE status = 'done' AND type = 'priv.ok'"
                "                        AND idempotency_key LIKE 'schedule:%%'),"
                " count(*) FILTER (WHERE id = ANY(%s) AND status IN ('done', 'dead'))"
                " FROM jobtui.job",
                ([ok_id, boom_id, crashed],),
            ).fetchone() or (0, 0)
            return bool(scheduled >= 1 and finished == 3)

        await until(lambda: task.done() or all_ran(), 30, "the scheduled job and the three jobs run")
        worker.stop()
        await asyncio.wait_for(task, 20)
        return worker

    worker = asyncio.run(run_worker())
    statuses = dict(admin.execute("SELECT id, status FROM jobtui.job WHERE id = ANY(%s)", ([ok_id, boom_id, crashed],)))
    assert statuses == {ok_id: "done", boom_id: "dead", crashed: "done"}
    assert worker.counts["dead"] == 1 and worker.counts["done"] >= 3
    assert admin.execute("SELECT count(*) FROM jobtui.lease_expiry WHERE job_id = %s", (claimed.id,)).fetchone() == (1,)
    effects = admin.execute("SELECT count(*) FROM jobtui.effect WHERE key LIKE 'priv-effect:%%'").fetchone()
    assert effects is not None and effects[0] >= 3
    assert admin.execute("SELECT source FROM jobtui.schedule WHERE name = 'priv.every-second'").fetchone() == ("code",)

    # The operator's commands.
    assert "requeued 1 job(s)" in works(w, "requeue", str(boom_id))
    assert "would requeue 0 job(s)" in works(w, "requeue", "--type", "priv.boom", "--dry-run")
    assert "cancelled 1 job(s)" in works(w, "cancel", str(bulk[0]))
    with Client(roles.admin) as q:
        [running] = q.claim(["priv.bulk"], worker="stuck-worker")
    assert "killed 1 lease(s)" in works(w, "kill-lease", str(running.id))
    assert f"Job {boom_id} (priv.boom): ready" in works(w, "job", str(boom_id))
    assert "oldest ready" in works(w, "stats")
    works(w, "dead")
    works(w, "schedule", "add", "priv.cli", "--cron", "0 3 * * *", "--type", "priv.ok")
    works(w, "schedule", "pause", "priv.cli")
    works(w, "schedule", "resume", "priv.cli")
    assert works(w, "schedule", "run-now", "priv.cli").strip().isdigit()
    works(w, "schedule", "remove", "priv.cli")
    assert "requeue" in works(w, "audit")
    # A worker started with --delete-on-complete deletes and counts what it finishes.
    with Client(w) as q:
        [deleted] = q.claim(["priv.bulk"], worker="deleting-worker")
        assert q.complete([deleted.lease], delete=True) == {deleted.id}
        assert q.get(deleted.id) is None
    tallied = admin.execute("SELECT sum(jobs) FROM jobtui.done_tally WHERE worker = 'deleting-worker'").fetchone()
    assert tallied == (1,)
    # The archiver's statements (its schedule fires once a minute; run them directly).
    with psycopg.connect(w, autocommit=True) as conn:
        summarise_hours(conn)
        swept = sweep(conn, Retention(done=0.0, dead=0.0, archive=None))
        assert swept.archived >= 3
    # The archive is pruned by the day (migration 0014): a day past the retention goes with its
    # partition, and rows outside any day's partition go one by one. The worker role owns
    # neither, and prunes both.
    admin.execute(
        "CREATE TABLE jobtui.job_archive_20000101 PARTITION OF jobtui.job_archive"
        " FOR VALUES FROM ('2000-01-01 00:00+00') TO ('2000-01-02 00:00+00')"
    )
    admin.execute("UPDATE jobtui.job_archive SET archived_at = '2000-01-01 12:00+00' WHERE id % 2 = 0")
    admin.execute("UPDATE jobtui.job_archive SET archived_at = archived_at - interval '3 days' WHERE id % 2 = 1")
    with psycopg.connect(w, autocommit=True) as conn:
        swept = sweep(conn, Retention(done=0.0, dead=0.0, archive=86400.0))
        assert swept.dropped_archive_days == 1 and swept.deleted_archive >= 1
    assert admin.execute("SELECT count(*) FROM jobtui.job_archive").fetchone() == (0,)


def test_the_worker_role_cannot_change_the_schema_or_the_audit_log(roles: Roles, admin: Conn) -> None:
    before = everything(admin)
    with psycopg.connect(roles.worker, autocommit=True) as conn:
        for statement in (
            "DROP TABLE jobtui.job",
            "ALTER TABLE jobtui.job ADD COLUMN x int",
            "CREATE TABLE jobtui.x (id int)",
            "TRUNCATE jobtui.job",
            "DELETE FROM jobtui.audit",
            "UPDATE jobtui.audit SET actor = 'nobody'",
            "DELETE FROM jobtui.migration",
            "CREATE SCHEMA evil",
        ):
            with pytest.raises(DENIED):
                conn.execute(statement)
    code, _, err = jobtui(roles.worker, "migrate")
    assert code == 2 and err.startswith("jobtui: error: permission denied") and err.count("\n") == 1
    assert everything(admin) == before


# -- the read-only role ---------------------------------------------------------------------


def test_the_readonly_role_reads_everything(roles: Roles, admin: Conn) -> None:
    r = roles.readonly
    dead = dead_job(roles.admin)
    assert "oldest ready" in works(r, "stats")
    assert '"dead"' in works(r, "stats", "--json")
    assert f"Job {dead} (priv.dead): dead" in works(r, "job", str(dead))
    assert "priv.dead" in works(r, "dead", "--type", "priv.dead")
    works(r, "audit")
    works(r, "schedule", "list")
    with psycopg.connect(r, autocommit=True) as conn:
        snap = snapshot(conn)
    assert any(g.type == "priv.dead" for g in snap.dead)
    with Client(r) as q:
        row = q.get(dead)
        assert row is not None and row.status == JobStatus.DEAD
        assert q.count_requeueable(job_type="priv.dead") >= 1  # a dry run without an actor reads only


def test_the_readonly_role_cannot_change_anything(roles: Roles, admin: Conn) -> None:
    r = roles.readonly
    dead = dead_job(roles.admin)
    with Client(roles.admin) as q:
        ready = q.enqueue("priv.ro")
        q.enqueue("priv.running")
        [running] = q.claim(["priv.running"], worker="w")
    works(roles.admin, "schedule", "add", "priv.ro-schedule", "--cron", "0 4 * * *", "--type", "priv.ro")
    before = everything(admin)

    assert "table job" in refused(r, "enqueue", "priv.ro")
    refused(r, "requeue", str(dead))
    refused(r, "requeue", "--all")
    refused(r, "requeue", "--all", "--dry-run")  # a dry run is audited
    refused(r, "kill-lease", str(running.id))
    refused(r, "cancel", str(ready))
    assert "table schedule" in refused(r, "schedule", "pause", "priv.ro-schedule")
    refused(r, "schedule", "run-now", "priv.ro-schedule")
    refused(r, "schedule", "add", "priv.other", "--cron", "* * * * *", "--type", "t")
    refused(r, "schedule", "remove", "priv.ro-schedule")

    writes: list[Callable[[Client], object]] = [
        lambda q: q.enqueue("priv.ro"),
        lambda q: q.enqueue_many([NewJob("priv.ro")] * 1000),
        lambda q: q.claim(["priv.ro"], worker="ro"),
        lambda q: q.heartbeat([running.lease]),
        lambda q: q.complete([running.lease]),
        lambda q: q.complete([running.lease], delete=True),
        lambda q: q.fail([Failure(running.lease, "x", 0)]),
        lambda q: q.reap(),
        lambda q: q.requeue([dead], actor="ro"),
        lambda q: q.cancel([ready], actor="ro"),
    ]
    with Client(r) as q:
        for write in writes:
            with pytest.raises(DENIED):
                write(q)
    with psycopg.connect(r, autocommit=True) as conn:
        for statement in (
            "UPDATE jobtui.job SET status = 'done'",
            "DELETE FROM jobtui.job",
            "INSERT INTO jobtui.job (type) VALUES ('x')",
            "TRUNCATE jobtui.audit",
            "SELECT nextval(pg_get_serial_sequence('jobtui.job', 'id'))",
        ):
            with pytest.raises(DENIED):
                conn.execute(statement)
    assert everything(admin) == before


def test_the_read_only_console_with_the_readonly_role(roles: Roles, admin: Conn) -> None:
    from jobtui.tui.app import JobtuiApp
    from jobtui.tui.screens import ConfirmScreen

    dead_job(roles.admin, "priv.console")
    before = everything(admin)

    async def drive() -> list[str]:
        app = JobtuiApp(roles.readonly, read_only=True, refresh_interval=0.2)
        async with app.run_test(size=(160, 40)) as pilot:
            for _ in range(200):
                if app.latest is not None:
                    break
                await pilot.pause(0.05)
            assert app.latest is not None and app.connected, app.last_error
            assert any(g.type == "priv.console" for g in app.latest.snapshot.dead)
            assert app.actions_ is None
            await pilot.press("3")
            await pilot.pause()
            assert app.pane == "dead" and app.selected() is not None
            for key, action in (("r", "requeue"), ("k", "kill_lease"), ("c", "cancel"), ("p", "pause_schedule")):
                assert app.check_action(action, ()) is False
                await pilot.press(key)
                await pilot.pause()
                assert not isinstance(app.screen, ConfirmScreen) and len(app.screen_stack) == 1
            app.confirm_then("Requeue everything?", lambda: "requeued")
            await pilot.pause()
            assert len(app.screen_stack) == 1
            return [str(n.message) for n in app._notifications]

    messages = asyncio.run(drive())
    assert "read-only console: actions are disabled" in messages
    assert everything(admin) == before


def test_metrics_without_and_with_pg_read_all_stats(roles: Roles, admin: Conn) -> None:
    """Without pg_read_all_stats the read-only role sees no other role's transactions: the
    oldest-transaction figure degrades to none (every other figure is whole); with it, the
    figure names the open transaction."""
    with psycopg.connect(roles.admin) as holder:
        holder.execute("SELECT 1")  # a transaction left open, as a stuck application would
        pid = holder.info.backend_pid
        with psycopg.connect(roles.readonly, autocommit=True) as conn:
            blind = snapshot(conn)
        assert blind.oldest_xact_pid is None and blind.oldest_xact_age is None
        assert blind.tables, "table statistics are readable by every role"
        admin.execute(sql.SQL("GRANT pg_read_all_stats TO {}").format(sql.Identifier(roles.readonly_role)))
        try:
            with psycopg.connect(roles.readonly, autocommit=True) as conn:
                seeing = snapshot(conn)
            assert seeing.oldest_xact_pid == pid and seeing.oldest_xact_age is not None
        finally:
            admin.execute(sql.SQL("REVOKE pg_read_all_stats FROM {}").format(sql.Identifier(roles.readonly_role)))
        holder.rollback()


# -- a worker that lacks a privilege stops ----------------------------------------------------


def _jobtui_process(dsn: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "JOBTUI_DSN": dsn, "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "jobtui.cli", *args],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _one_error_line(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("jobtui: error:")]
    assert len(errors) == 1 and "Traceback" not in output, output
    return errors[0]


@pytest.mark.parametrize("command", ["worker", "scheduler"])
def test_a_worker_or_scheduler_without_its_privileges_stops_at_start(roles: Roles, command: str) -> None:
    proc = _jobtui_process(roles.readonly, command, "--app", "tests.apps.worker_app:jobs")
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    line = _one_error_line(output)
    # It names what is missing, rather than failing statement after statement.
    assert "the database role lacks INSERT on jobtui.job" in line and f"jobtui {command} needs" in line, line
    assert "docs/grants.sql" in line
    assert "claim failed" not in output


def test_a_worker_whose_grant_is_revoked_stops_with_one_line(roles: Roles, admin: Conn) -> None:
    role = f"jobtui_revoked_{os.getpid()}"
    ident = sql.Identifier(role)
    admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    try:
        apply_grants(roles.admin, role, read_only=False)
        proc = _jobtui_process(
            make_conninfo(roles.admin, user=role),
            "worker",
            "--app",
            "tests.apps.worker_app:jobs",
            "--lease",
            "2s",
            "--poll",
            "0.2s",
            "--no-scheduler",
        )
        assert proc.stdout is not None
        started = proc.stdout.readline()
        assert "started" in started, started
        admin.execute(sql.SQL("REVOKE UPDATE ON jobtui.job FROM {}").format(ident))
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == 2, output
        line = _one_error_line(output)
        assert "the claim was refused (permission denied for table job)" in line, line
        assert "the database role lacks UPDATE on jobtui.job" in line, line
    finally:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))


def test_the_start_check_asks_no_execute_on_trigger_functions(dsn: str) -> None:
    """A trigger fires whoever may call its function: where PUBLIC may not execute the schema's
    functions, a worker role without EXECUTE on a trigger function (one a later migration
    added) starts, and its deletes still keep their keys."""
    from jobtui.core.privileges import WORKER_NEEDS, missing_privileges_call
    from jobtui.kernel.db import run
    from tests.roles import grant_roles

    with psycopg.connect(dsn, autocommit=True) as admin, grant_roles(dsn) as granted:
        admin.execute("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA jobtui FROM PUBLIC")
        triggers = [
            str(row[0])
            for row in admin.execute(
                "SELECT p.oid::regprocedure FROM pg_proc p"
                " WHERE p.pronamespace = 'jobtui'::regnamespace AND p.prorettype = 'trigger'::regtype"
            )
        ]
        assert "jobtui.schedule_key_window_kept()" in triggers
        for function in triggers:
            revoke = sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM {}")
            admin.execute(revoke.format(sql.SQL(function), sql.Identifier(granted.worker)))
        with psycopg.connect(granted.worker_dsn, autocommit=True) as conn:
            assert run(conn, missing_privileges_call("jobtui", WORKER_NEEDS), "jobtui") == []
        with Client(granted.worker_dsn) as q:
            job_id = q.enqueue("t", key="kept")
        with psycopg.connect(granted.worker_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM jobtui.job WHERE id = %s", (job_id,))
        assert admin.execute("SELECT job_id FROM jobtui.job_key WHERE key = 'kept'").fetchone() == (job_id,)


def test_the_worker_role_prunes_old_audit_rows_only_through_the_owners_function(roles: Roles, admin: Conn) -> None:
    admin.execute(
        "INSERT INTO jobtui.audit (at, actor, action, rows) VALUES"
        " (now() - interval '100 days', 'old', 'requeue', 1), (now() - interval '40 days', 'mid', 'requeue', 1),"
        " (now() - interval '1 day', 'new', 'requeue', 1)"
    )
    with psycopg.connect(roles.worker, autocommit=True) as conn:
        with pytest.raises(DENIED):
            conn.execute("DELETE FROM jobtui.audit WHERE actor = 'old'")
        # The default retention (90 days) takes the oldest; even a retention of 0 keeps every
        # row younger than 30 days.
        assert sweep(conn, Retention()).deleted_audit == 1
        assert sweep(conn, Retention(audit=0)).deleted_audit == 1
    actors = {r[0] for r in admin.execute("SELECT actor FROM jobtui.audit")}
    assert "new" in actors and not {"old", "mid"} & actors
    with psycopg.connect(roles.readonly, autocommit=True) as conn, pytest.raises(DENIED):
        conn.execute("SELECT jobtui.prune_audit(interval '0', 10)")


def test_the_readonly_role_sees_every_roles_lock_waits(roles: Roles, admin: Conn) -> None:
    """Lock waits need no pg_read_all_stats: pg_locks shows every role's locks, and when each
    wait began; pg_stat_activity (database, pid) names the waiting session's database."""
    import threading

    with Client(roles.admin) as q:
        job_id = q.enqueue("t")
    with psycopg.connect(roles.admin) as holder:
        holder.execute("SELECT id FROM jobtui.job WHERE id = %s FOR UPDATE", (job_id,))

        def wait_for_the_row() -> None:
            with psycopg.connect(roles.admin, autocommit=True) as blocked:
                blocked.execute("SELECT id FROM jobtui.job WHERE id = %s FOR UPDATE", (job_id,))

        thread = threading.Thread(target=wait_for_the_row)
        thread.start()
        try:
            # pg_locks is the whole server's: only this database's sessions count, and their
            # wait must be 0.2s old by the database's clock, reckoned as the snapshot does.
            waited = (
                "SELECT coalesce(bool_and(clock_timestamp() - l.waitstart >= interval '0.2 seconds'), false)"
                " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE NOT l.granted AND a.datname = current_database()"
            )
            wait_until(lambda: admin.execute(waited).fetchone() == (True,), 30, "a lock waited for 0.2s")
            with psycopg.connect(roles.readonly, autocommit=True) as conn:
                snap = snapshot(conn)
            assert snap.lock_waits == snap.lock_waits_by_kind["transactionid"] == 1
            assert 0.2 <= snap.longest_lock_wait < 10
        finally:
            holder.rollback()
            thread.join(10)
        assert not thread.is_alive()
