"""The guard of what runs on a timer: every statement sent by the console's refresh (and by
its drill-downs, which refresh every second too), `jobtui stats --json`, `jobtui queue list`, a
Prometheus scrape and the claim of a worker's slot for jobtui's own jobs reads a bounded number
of pages however big the ready backlog is.

A database with a big ready backlog (BIG_READY jobs) and one with a small one are built once
for the module. Each path runs for real on both, with every statement it sends recorded; then
each statement runs again under EXPLAIN (ANALYZE, BUFFERS) with the same parameters, and the
pages it touched (shared, local and temporary buffers, of the whole plan) are compared with
PAGE_BOUND, a figure that does not depend on the backlog. A statement that counts or sorts
every ready job reads thousands of pages more on the big table and fails, named. Pages, not
milliseconds: the figure holds on a loaded machine.

A statement joins by its name in `jobtui.reads.timers.TIMED`, which the paths themselves check; the
guard then finds it in what they run (docs/design.md, "What runs on a timer").
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobtui import Jobs, Worker
from jobtui.cli import main as cli
from jobtui.cli import ops as cli_ops
from jobtui.cli import queues as cli_queues
from jobtui.cli import why as cli_why
from jobtui.core.history import record_flow, record_minute
from jobtui.core.maintenance import BUILTIN_QUEUE
from jobtui.kernel import db, migrate
from jobtui.service import prometheus
from jobtui.tui import data
from tests.conftest import with_dbname

BIG_READY = 400_000
SMALL_READY = 1_000
# At most this many pages (8 kB) per statement, whatever the backlog. The ready jobs' exact
# figures read at most backlog.READY_EXACT_CAP + 1 ready jobs in claim order, and the done jobs
# of the last minute at most backlog.DONE_SAMPLE + 1, a page each at worst in a scattered table
# no vacuum has reached; counting all of 400,000 ready jobs reads over 3,000 pages of the
# ready index alone and over 6,000 of the table.
PAGE_BOUND = 2_000
SCHEMAS = {"guard_big": BIG_READY, "guard_small": SMALL_READY}

FILL = [
    # The ready backlog: six types, one job in a hundred in the `reports` queue, 10 % delayed.
    # Its run_at is unrelated to its place in the table, as delays, retries and bursts make it:
    # i * 7919 % {ready} visits every slot of the last two hours once, in scattered order. In
    # claim order, each next job then sits on another page of the table.
    """INSERT INTO {schema}.job (type, status, run_at, attempts, queue)
       SELECT 'type_' || (i % 6), 'ready',
              CASE WHEN i % 10 = 0 THEN now() + ((i::bigint * 7919) % {ready}) * interval '3600 seconds' / {ready}
                   ELSE now() - interval '2 hours' + ((i::bigint * 7919) % {ready}) * interval '7200 seconds' / {ready}
              END,
              0, CASE WHEN i % 100 = 7 THEN 'reports' ELSE 'default' END
       FROM generate_series(1, {ready}) AS i""",
    # A queue whose only jobs wait behind the whole backlog.
    """INSERT INTO {schema}.job (type, status, run_at, attempts, queue)
       SELECT 'late.type', 'ready', now() - interval '1 second', 0, 'late' FROM generate_series(1, 5)""",
    """INSERT INTO {schema}.job (type, status, run_at, attempts, locked_by, locked_until, lease_token,
                                 heartbeat_at, started_at, queue)
       SELECT 'type_' || (i % 6), 'running', now() - interval '1 minute', 1, 'worker-' || (i % 4),
              now() + interval '1 hour' + i * interval '1 second', 1, now(), now() - interval '30 seconds',
              CASE WHEN i % 3 = 0 THEN 'reports' ELSE 'default' END
       FROM generate_series(1, 300) AS i""",
    """INSERT INTO {schema}.job (type, status, run_at, attempts, max_attempts, locked_by, last_error,
                                 created_at, finished_at)
       SELECT 'type_' || (i % 5), 'dead', now() - interval '1 day', 3, 3, 'worker-1',
              format('KeyError: ''user %s''', i % 7), now() - interval '1 day', now() - i * interval '1 minute'
       FROM generate_series(1, 100) AS i""",
    """INSERT INTO {schema}.job (type, status, run_at, attempts, max_attempts, locked_by, lease_token,
                                 created_at, started_at, finished_at)
       SELECT 'type_' || (i % 6), 'done', now() - interval '1 hour', 1, 25, 'worker-1', 1,
              now() - interval '1 hour', now() - i * interval '1 second', now() - i * interval '1 second'
       FROM generate_series(1, 2000) AS i""",
    """INSERT INTO {schema}.lease_expiry (job_id, job_type, worker, attempt, expired_at, outcome)
       SELECT i, 'type_1', 'worker-2', 1, now() - i * interval '1 minute', 'ready' FROM generate_series(1, 20) AS i""",
    """INSERT INTO {schema}.schedule (name, job_type, cron, next_run_at, last_slot)
       SELECT 'nightly-' || i, 'type_' || i, '0 3 * * *', now() + interval '1 hour', now()
       FROM generate_series(1, 3) AS i""",
    """INSERT INTO {schema}.queue_control (kind, name, max_running, changed_by)
       VALUES ('queue', 'reports', 3, 'ops')""",
    """INSERT INTO {schema}.queue_control (kind, name, paused_at, paused_by, changed_by)
       VALUES ('queue', 'emails', now(), 'ops', 'ops'), ('type', 'type_5', now(), 'ops', 'ops')""",
    # A rated type, and a queue resumed with a ramp that still runs (migration 0013).
    """INSERT INTO {schema}.queue_control (kind, name, rate_per_second, changed_by)
       VALUES ('type', 'type_2', 20, 'ops')""",
    """INSERT INTO {schema}.queue_control (kind, name, ramp_from, ramp_until, changed_by)
       VALUES ('queue', 'late', now(), now() + interval '1 hour', 'ops')""",
    # A fleet of 1,000 processes on 50 hosts, some quiet, one in ten lost (migration 0016).
    """INSERT INTO {schema}.fleet (name, kind, host, pid, version, lost_after, queues, every_queue, types,
                                   executor, scheduler, in_flight, rss_bytes, state, seen_at)
       SELECT 'worker-' || i, CASE WHEN i % 100 = 0 THEN 'scheduler' ELSE 'worker' END, 'host-' || (i % 50),
              10000 + i, CASE WHEN i % 7 = 0 THEN '0.3.1' ELSE '0.3.0' END, 30,
              CASE WHEN i % 3 = 0 THEN '{{"reports": 2, "jobtui.builtin": 1}}'::jsonb ELSE '{{}}'::jsonb END,
              CASE WHEN i % 3 = 0 THEN NULL ELSE 10 END,
              ARRAY['type_0', 'type_1', 'type_2', 'type_3', 'jobtui.archive'], 'thread', true, i % 10,
              100000000, CASE WHEN i % 11 = 0 THEN 'quiet' ELSE 'running' END,
              CASE WHEN i % 10 = 0 THEN now() - interval '5 minutes' ELSE now() END
       FROM generate_series(1, 1000) AS i""",
]


@dataclass(frozen=True)
class Sent:
    """One statement a path sent: its name in jobtui/kernel/sql/ (or its text), and its parameters."""

    name: str
    text: str
    params: Any


def statement_names(schema: str) -> dict[str, str]:
    """Each statement's text as it is sent on `schema`, to its name."""
    stmts = db.statements(schema)
    return {stmts[name].as_string(None).strip(): name for name in db.query_names()}


class Recording(psycopg.Cursor[Any]):
    """A cursor that notes every statement it executes on `sent`."""

    sent: list[tuple[str, Any]] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.as_string(self.connection) if isinstance(query, sql.Composable) else str(query)
        Recording.sent.append((text.strip(), params))
        return super().execute(query, params, **kwargs)


@pytest.fixture(scope="module")
def guard_dsn(server_dsn: str) -> Iterator[str]:
    """One database, a schema per size, filled once for the module."""
    name = f"jobtui_guard_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_dbname(server_dsn, name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for schema, ready in SCHEMAS.items():
                migrate.migrate(conn, schema)
                # No vacuum reaches the table, as in an incident where the backlog grew faster
                # than autovacuum: the visibility map marks no page all-visible, so an entry of
                # an index still visits its row. Statistics, though, as ANALYZE keeps them.
                job = sql.SQL("{}.job").format(sql.Identifier(schema))
                conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(job))
                for text in FILL:
                    conn.execute(sql.SQL(text).format(schema=sql.Identifier(schema), ready=sql.Literal(ready)))
                conn.execute(sql.SQL("ANALYZE {}").format(job))
                record_minute(conn, schema)  # the archiver's row of the last minute, as a worker writes it
                # Its flow spans, two minutes apart: the forecast then reads enqueues and finishes.
                moment = conn.execute("SELECT now()").fetchone()
                assert moment is not None
                record_flow(conn, schema, until=moment[0] - timedelta(minutes=2))
                record_flow(conn, schema, until=moment[0])
        yield dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def recording_connect(real: Callable[..., psycopg.Connection[Any]]) -> Callable[..., psycopg.Connection[Any]]:
    def connect(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = real(*args, **kwargs)
        conn.cursor_factory = Recording
        return conn

    return connect


def run_paths(dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Sent]]:
    """What each path sends on `schema`, by path."""
    for module in (data, cli_ops, cli_queues, cli_why, prometheus):
        monkeypatch.setattr(module, "connect", recording_connect(db.connect))
    names = statement_names(schema)
    paths: dict[str, Callable[[], object]] = {}
    source = data.DataSource(dsn, schema)

    def refresh() -> None:
        first = source.fetch()
        source.fetch("KeyError")  # with the filter: the dead groups whose error matches
        if first.running:
            source.running_after = first.running[-1].cursor  # the Running pane's next page
            source.fetch()
            source.running_after = None

    def drill_downs() -> None:
        source.ready_jobs("late.type")  # a type whose jobs wait behind the backlog
        source.ready_jobs("type_1")
        fetched = source.fetch()
        group = fetched.snapshot.dead[0]
        source.dead_jobs(group.status, group.type, group.fingerprint)
        source.job(fetched.running[0].id)

    def why_pane() -> None:
        # The Why pane open (and the header past the warning age): the diagnosis's reads too.
        source.why_open = True
        try:
            source.fetch()
        finally:
            source.why_open = False

    def builtin_slot() -> None:
        # A worker serving only a named queue keeps a slot for the archiver's jobs, and claims
        # for it every poll: through the ready index it would step over the whole backlog.
        worker = Worker(Jobs(), dsn, queues={"reports": 2}, schema=schema, scheduler=False)
        with recording_connect(db.connect)(dsn) as conn, conn.transaction(force_rollback=True):
            db.run(conn, worker._claim_call(BUILTIN_QUEUE, 1), schema)

    def command(*args: str) -> None:
        assert cli.main(["--dsn", dsn, "--schema", schema, *args]) == 0

    paths["console refresh"] = refresh
    paths["console drill-downs"] = drill_downs
    paths["console Why pane"] = why_pane
    # Exit code 1: something waits with a cause (the fill has paused queues, a limit, ...).
    paths["why --json"] = lambda: cli.main(["--dsn", dsn, "--schema", schema, "why", "--json"]) in (0, 1)
    paths["stats --json"] = lambda: command("stats", "--json")
    paths["queue list --json"] = lambda: command("queue", "list", "--json")
    paths["Prometheus scrape"] = lambda: list(prometheus.QueueCollector(dsn, schema).collect())
    paths["a worker's slot for jobtui's own jobs"] = builtin_slot
    sent: dict[str, list[Sent]] = {}
    try:
        for path, run in paths.items():
            Recording.sent = []
            with contextlib.redirect_stdout(open(os.devnull, "w")):
                run()
            sent[path] = [Sent(names.get(text, text[:60]), text, params) for text, params in Recording.sent]
    finally:
        source.close()
    return sent


def pages(conn: psycopg.Connection[Any], statement: Sent) -> int:
    """The pages `statement` touches, from EXPLAIN (ANALYZE, BUFFERS) of the whole plan."""
    # Rolled back: some statements set a session's timeouts, which must not outlive them here.
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement.text,
            statement.params,
        ).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"] if isinstance(row[0], list) else json.loads(row[0])[0]["Plan"]

    def touched(node: dict[str, Any]) -> int:
        own = sum(
            int(node.get(f"{kind} {what} Blocks", 0))
            for kind in ("Shared", "Local", "Temp")
            for what in ("Hit", "Read")
            if not (kind == "Temp" and what == "Hit")
        )
        return max([own, *(touched(child) for child in node.get("Plans", []))])

    return touched(plan)


@pytest.fixture(scope="module")
def measured(guard_dsn: str) -> dict[str, dict[tuple[str, str], int]]:
    """Pages touched per (path, statement), on each schema."""
    figures: dict[str, dict[tuple[str, str], int]] = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for schema in SCHEMAS:
            sent = run_paths(guard_dsn, schema, monkeypatch)
            figures[schema] = {}
            with psycopg.connect(guard_dsn) as conn:
                for path, statements in sent.items():
                    for statement in statements:
                        key = (path, statement.name)
                        figures[schema][key] = max(pages(conn, statement), figures[schema].get(key, 0))
    return figures


def test_no_statement_on_a_timer_reads_more_pages_as_the_ready_backlog_grows(
    measured: dict[str, dict[tuple[str, str], int]],
) -> None:
    big, small = measured["guard_big"], measured["guard_small"]
    over = {key: (small.get(key), big[key]) for key in big if big[key] > PAGE_BOUND}
    report = "; ".join(
        f"{name} in {path}: {b:,} pages with {BIG_READY:,} ready jobs ({s:,} with {SMALL_READY:,})"
        for (path, name), (s, b) in sorted(over.items(), key=lambda kv: -kv[1][1])
    )
    assert not over, f"statements past the bound of {PAGE_BOUND:,} pages: {report}"


def test_every_statement_on_a_timer_is_registered_and_every_registered_one_runs(
    measured: dict[str, dict[tuple[str, str], int]],
) -> None:
    from jobtui.reads.timers import TIMED

    ran = {name for _, name in measured["guard_big"]}
    unregistered = sorted(ran - set(TIMED))
    assert not unregistered, f"statements run on a timer but not in jobtui.reads.timers.TIMED: {unregistered}"
    unseen = sorted(set(TIMED) - ran)
    assert not unseen, f"registered in jobtui.reads.timers.TIMED, but no path of the guard ran them: {unseen}"
