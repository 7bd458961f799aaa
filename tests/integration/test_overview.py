"""The queue overview (`queue list`, `stats`, Prometheus, the Queues pane) read the way the
header reads the backlog: counted up to a cap, then estimated and marked so, the oldest ages
exact where the ready index can tell them.

The cap is lowered for the test (a figure of configuration, not of the database), so a few
dozen real rows stand for millions; tests/integration/test_timer_guard.py measures the pages
read on a real big backlog.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from jobtui import Client
from jobtui.core import history
from jobtui.kernel.domain import NewJob
from jobtui.reads.overview import QueueLine, overview
from tests.integration.test_backlog import archivers_away, away_from_minute_boundary

if TYPE_CHECKING:
    from jobtui.tui.data import Fetched

Conn = psycopg.Connection[Any]
CAP = 20


def lines(conn: Conn, cap: int = CAP) -> dict[tuple[str, str], QueueLine]:
    return {(q.kind, q.name): q for q in overview(conn, cap=cap).lines}


@pytest.fixture
def flood(dsn: str, conn: Conn) -> None:
    """30 ready jobs of `default` due for an hour, then 4 of `reports` due for a minute, behind
    them in claim order; 2 delayed jobs of `default`."""
    with Client(dsn) as q:
        q.enqueue_many([NewJob("a", {}) for _ in range(30)] + [NewJob("r", {}, queue="reports") for _ in range(4)])
        q.enqueue_many([NewJob("a", {}, delay=3600) for _ in range(2)])
    conn.execute("UPDATE jobtui.job SET run_at = now() - interval '1 hour' WHERE type = 'a' AND run_at <= now()")
    conn.execute("UPDATE jobtui.job SET run_at = now() - interval '1 minute' WHERE queue = 'reports'")


def test_up_to_the_cap_every_figure_is_counted(conn: Conn, flood: None) -> None:
    seen = overview(conn, cap=100)
    assert seen.counted and seen.source == ""
    got = {(q.kind, q.name): (q.ready, q.due, q.estimated) for q in seen.lines}
    assert got[("queue", "default")] == (32, 30, ())
    assert got[("queue", "reports")] == (4, 4, ())
    assert got[("type", "a")] == (32, 30, ())


def test_above_the_cap_the_archivers_row_gives_each_queue_and_the_ages_stay_honest(conn: Conn, flood: None) -> None:
    away_from_minute_boundary(conn)
    assert history.record_minute(conn)  # the archiver's count, once a minute
    seen = overview(conn, cap=CAP)
    assert not seen.counted and seen.source.endswith("by the archiver")
    default, reports = lines(conn)[("queue", "default")], lines(conn)[("queue", "reports")]
    assert (default.ready, default.due) == (32, 30) and {"ready", "due"} <= set(default.estimated)
    assert (reports.ready, reports.due) == (4, 4) and {"ready", "due"} <= set(reports.estimated)
    # default's oldest job is the first entry of the ready index: exact, and about an hour.
    assert "oldest_age" not in default.estimated and default.oldest_age is not None and default.oldest_age >= 3600
    # reports waits behind the entries read: its age is the archiver's, aged since, never above
    # the age of the last entry read (an hour).
    assert "oldest_age" in reports.estimated
    assert reports.oldest_age is not None and 60 <= reports.oldest_age <= default.oldest_age
    assert lines(conn)[("type", "r")].ready == 4


def test_above_the_cap_without_a_minute_row_the_planner_estimates(conn: Conn, flood: None) -> None:
    conn.execute("ANALYZE jobtui.job")  # the planner's statistics, as autovacuum keeps them
    conn.execute("VACUUM jobtui.job")
    seen = overview(conn, cap=CAP)
    assert (
        not seen.counted
        and seen.source == "the planner's estimate of the ready index, split as the first ready jobs in claim order"
    )
    default = lines(conn)[("queue", "default")]
    assert "ready" in default.estimated and 20 <= default.ready <= 40
    assert default.oldest_age is not None and "oldest_age" not in default.estimated


def test_with_every_due_job_among_the_entries_read_the_due_figures_stay_counted(dsn: str, conn: Conn) -> None:
    with Client(dsn) as q:
        q.enqueue_many([NewJob("a", {}) for _ in range(5)] + [NewJob("b", {}, queue="later") for _ in range(3)])
        q.enqueue_many([NewJob("a", {}, delay=3600) for _ in range(30)])
    got = lines(conn, cap=10)
    default, later = got[("queue", "default")], got[("queue", "later")]
    assert (default.due, later.due) == (5, 3)
    assert "due" not in default.estimated and "oldest_age" not in later.estimated
    assert "ready" in default.estimated and default.ready >= 5


def test_done_jobs_of_the_last_minute_by_queue_and_type_are_read_only_when_asked(dsn: str, conn: Conn) -> None:
    """The Queues pane's done column: counted per queue and type (a type with done jobs only
    gets a line), the newest `sample` + 1 read and scaled past that; the header's read leaves
    them out, and its other figures are the same."""
    with Client(dsn) as q:
        q.enqueue_many([NewJob("a", {}) for _ in range(3)] + [NewJob("b", {}, queue="mail") for _ in range(4)])
        q.enqueue_many([NewJob("gone", {}, queue="mail") for _ in range(2)] + [NewJob("old", {})])
    conn.execute(
        "UPDATE jobtui.job SET status = 'done', finished_at = now() - interval '5 seconds'"
        " WHERE type = 'gone' OR type = 'b' AND id IN (SELECT id FROM jobtui.job WHERE type = 'b' ORDER BY id LIMIT 1)"
    )
    conn.execute("UPDATE jobtui.job SET status = 'done', finished_at = now() - interval '2 minutes' WHERE type = 'old'")
    read = overview(conn)
    got = {(q.kind, q.name): q.done_last_minute for q in read.lines}
    assert read.done_read and got[("queue", "mail")] == 3 and got[("queue", "default")] == 0, got
    assert got[("type", "gone")] == 2 and got[("type", "b")] == 1 and got[("type", "a")] == 0, got
    assert ("type", "old") not in got, got  # done over a minute ago: no line of its own
    unread = overview(conn, done=False)
    assert not unread.done_read and ("type", "gone") not in {(q.kind, q.name) for q in unread.lines}
    assert all(q.done_last_minute == 0 for q in unread.lines)
    figures = {(q.kind, q.name): (q.ready, q.due, q.running) for q in read.lines if q.name != "gone"}
    assert figures == {(q.kind, q.name): (q.ready, q.due, q.running) for q in unread.lines}
    # Past the sample: the newest sample + 1 read, their rate per minute, marked an estimate.
    sampled = {(q.kind, q.name): q for q in overview(conn, sample=1).lines}
    assert "done_last_minute" in sampled[("queue", "mail")].estimated
    assert sampled[("queue", "mail")].done_last_minute >= 2


def test_estimates_are_marked_in_queue_list_and_its_json(app_dsn: str, conn: Conn, flood: None) -> None:
    from jobtui.cli import ops as cli_ops

    shown = cli_ops.queue_table(list(overview(conn, cap=CAP).lines))
    cells = [str(c) for col in shown.columns for c in col._cells]
    assert any(c.startswith("~") for c in cells)
    data = cli_ops.queue_json(overview(conn, cap=CAP).lines)
    assert all("estimated" in d for d in data)


def stats_text(dsn: str) -> str:
    import contextlib
    import io

    from jobtui.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--dsn", dsn, "stats"]) == 0
    return out.getvalue()


def type_cells(text: str, job_type: str) -> list[str]:
    """The cells of a type's row in the `Jobs by type` table of `stats`."""
    rows = [[c.strip() for c in row.split("│")[1:-1]] for row in text.splitlines() if "│" in row]
    return next(cells for cells in rows if cells and cells[0] == job_type)


def test_estimates_are_marked_in_stats_above_the_cap(
    dsn: str, conn: Conn, flood: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobtui.reads import overview as overview_module

    counted = stats_text(dsn)  # below the cap: every figure counted, none marked
    assert "ready 36 (34 due)" in counted and "~" not in counted, counted
    assert type_cells(counted, "a")[1:3] == ["32", "30"]
    # The overview's cap: stats reads the ready jobs by type once, for both of its tables.
    monkeypatch.setattr(overview_module, "READY_EXACT_CAP", CAP)
    away_from_minute_boundary(conn)
    assert history.record_minute(conn)  # the archiver's count, once a minute
    text = stats_text(dsn)
    assert "ready ~36 (~34 due)" in text, text
    # The oldest ready age of every queue stays exact: the first entry of the ready index.
    assert "oldest ready 1h" in text and "oldest ready ~" not in text, text
    a, r = type_cells(text, "a"), type_cells(text, "r")
    assert a[1:3] == ["~32", "~30"] and a[3].startswith("~1h"), a
    assert r[1:3] == ["~4", "~4"] and r[3].startswith("~1m"), r
    assert a[4:] == ["0", "0", "0"]  # running, dead and failed are counted whatever the backlog
    assert "~ estimated: too many ready jobs to count on every read; from counted at" in text, text
    # Without the archiver's row: the planner's size split as the entries read; a's age is the
    # one read with them, as the queues' is.
    conn.execute("DELETE FROM jobtui.queue_minute")
    conn.execute("VACUUM ANALYZE jobtui.job")
    text = stats_text(dsn)
    assert type_cells(text, "a")[3].startswith("~1h") and type_cells(text, "a")[1].startswith("~"), text
    assert "from the planner's estimate of the ready index" in text, text


def test_with_the_archivers_away_the_planners_size_keeps_the_last_counts_split(conn: Conn, flood: None) -> None:
    archivers_away(conn)
    seen = overview(conn, cap=CAP)
    assert not seen.counted and "split as the archiver counted at" in seen.source, seen.source
    got = {(q.kind, q.name): (q.ready, q.due) for q in seen.lines}
    assert got[("queue", "default")] == (32, 30) and got[("queue", "reports")] == (4, 4)
    assert got[("type", "a")] == (32, 30) and got[("type", "r")] == (4, 4)
    assert got.get(("type", "only_done"), (0, 0)) == (0, 0)  # done jobs only, none ready


def test_a_previous_archivers_row_without_queues_leaves_the_queues_to_the_planner(conn: Conn, flood: None) -> None:
    """An archiver of the previous release writes no split by queue (by_queue stays '{}'): the
    queues' sizes then come from the planner's size, split as the entries read (never from the
    planner's statistics of the column, which count every status)."""
    away_from_minute_boundary(conn)
    assert history.record_minute(conn)
    conn.execute("UPDATE jobtui.queue_minute SET by_queue = '{}'")
    conn.execute("VACUUM ANALYZE jobtui.job")
    default = lines(conn)[("queue", "default")]
    assert default.ready > CAP + 1, default  # more than the probe could have seen
    # The first CAP + 1 entries are all of default: the whole of the planner's 36.
    assert default.ready == 36 and "ready" in default.estimated


@pytest.fixture
def dead_types_beside_a_flood(dsn: str, conn: Conn, flood: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flood above every cap of the console, no archiver's row, and a type whose 50 jobs
    are all dead or failed: the planner's statistics of the type column (every status) give it
    more rows than any type that waits."""
    from jobtui.reads import metrics
    from jobtui.reads import overview as overview_module

    monkeypatch.setattr(metrics, "READY_EXACT_CAP", CAP)
    monkeypatch.setattr(overview_module, "READY_EXACT_CAP", CAP)
    conn.execute(
        "INSERT INTO jobtui.job (type, status, attempts, max_attempts, finished_at)"
        " SELECT 'gone', CASE WHEN i % 5 = 0 THEN 'failed' ELSE 'dead' END, 3, 3, now()"
        " FROM generate_series(1, 50) AS i"
    )
    conn.execute("DELETE FROM jobtui.queue_minute")
    conn.execute("VACUUM ANALYZE jobtui.job")


@pytest.fixture
def fetched(dsn: str, dead_types_beside_a_flood: None) -> Fetched:
    """What the console reads of that database, once."""
    from jobtui.tui.data import DataSource

    source = DataSource(dsn, "jobtui")
    try:
        return source.fetch()
    finally:
        source.close()


def test_a_type_with_only_dead_jobs_is_given_no_ready_estimate(fetched: Fetched) -> None:
    snap = fetched.snapshot
    assert snap.ready_estimate is not None and not snap.ready_estimate.by_type.get("gone"), snap.ready_estimate
    gone = {t.type: t for t in snap.by_type}["gone"]
    assert (gone.ready, gone.ready_due, gone.dead + gone.failed) == (0, 0, 50)  # the Ready pane
    shown = {(q.kind, q.name): q for q in fetched.queues}
    assert ("type", "gone") not in shown or shown[("type", "gone")].ready == 0  # the Queues pane
    assert {name for kind, name in shown if kind == "type"} >= {"a"}


def test_the_oldest_wait_agrees_between_the_panes_above_the_cap(fetched: Fetched) -> None:
    snap = fetched.snapshot
    assert snap.ready_estimate is not None
    ready_pane = {t.type: t.oldest_ready_age for t in snap.by_type if t.ready}
    queues_pane = {q.name: q.oldest_age for q in fetched.queues if q.kind == "type" and q.ready}
    assert set(ready_pane) == set(queues_pane) == {"a"}, (ready_pane, queues_pane)  # r waits behind the cap
    assert ready_pane["a"] is not None and queues_pane["a"] is not None
    assert ready_pane["a"] == pytest.approx(queues_pane["a"], abs=1.0) and ready_pane["a"] >= 3600
    # The header's oldest wait is the Queues pane's oldest queue.
    header = snap.oldest_ready_age
    oldest_queue = max(q.oldest_age for q in fetched.queues if q.kind == "queue" and q.oldest_age is not None)
    assert header is not None and header == pytest.approx(oldest_queue, abs=1.0)


class Recording(psycopg.Cursor[Any]):
    """A cursor that notes the name of every statement of jobtui's it executes."""

    sent: list[str] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        from jobtui.reads.timers import statement_name

        Recording.sent.append(statement_name(query, "jobtui") or "?")
        return super().execute(query, params, **kwargs)


def test_a_console_refresh_reads_the_head_of_the_ready_jobs_once(
    dsn: str, dead_types_beside_a_flood: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header, the Ready pane and the Queues pane all come from one read of the first ready
    jobs in claim order (overview_backlog), not one for the snapshot and another for the queues;
    the done jobs by queue and type (overview_done) are read only while the Queues pane is open."""
    from jobtui.kernel import db
    from jobtui.tui import data

    def recording(*args: Any, **kwargs: Any) -> Conn:
        conn = db.connect(*args, **kwargs)
        conn.cursor_factory = Recording
        return conn

    monkeypatch.setattr(data, "connect", recording)
    source = data.DataSource(dsn, "jobtui")
    try:
        source.fetch()  # the first: the connection's session too
        Recording.sent = []
        fetched = source.fetch()
        header_only = Recording.sent
        source.done_wanted = True
        Recording.sent = []
        opened = source.fetch()
    finally:
        source.close()
    assert header_only.count("overview_backlog") == 1, header_only
    assert "overview_done" not in header_only and not fetched.queues_done, header_only
    assert "metrics_ready" not in header_only, header_only
    assert Recording.sent.count("overview_backlog") == 1 and Recording.sent.count("overview_done") == 1, Recording.sent
    assert opened.queues_done and "metrics_ready" not in Recording.sent, Recording.sent
    # And what it read is shown: the flood's type, estimated above the lowered cap.
    a = {t.type: t for t in fetched.snapshot.by_type}["a"]
    assert a.ready >= 32 and a.oldest_ready_age is not None and a.oldest_ready_age >= 3600, a
