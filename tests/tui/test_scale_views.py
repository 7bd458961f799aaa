"""The console's honest lists and its last hour, against a real database: the Running pane
says "N of M" and pages by keyset, the charts come from queue_minute rows written before the
console opened, the job view shows every attempt's whole error, and a drill-down says it is
loading instead of showing an empty list."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from jobtui.reads.joblists import RUNNING_PAGE
from jobtui.tui.app import JobtuiApp
from jobtui.tui.panes.charts import NO_MINUTES, Chart, Series
from jobtui.tui.screens import JobDetailScreen

from .helpers import wait_for

SIZE = (120, 36)


def label(node: Any, selector: str) -> str:
    """What a Static or Label under `node` shows ("" before it is mounted)."""
    found = node.query(selector)
    if not found:
        return ""
    content: Any = found.first().content
    return str(content.plain if hasattr(content, "plain") else content)


def running_jobs(dsn: str, n: int) -> list[int]:
    """`n` running jobs with distinct, long leases; their ids in lease order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "INSERT INTO jobtui.job (type, status, attempts, locked_by, locked_until, lease_token, heartbeat_at,"
            " started_at) SELECT 'page.test', 'running', 1, 'w', now() + interval '1 hour' + i * interval '1 second',"
            " 1, now(), now() FROM generate_series(1, %s) AS i RETURNING id",
            (n,),
        ).fetchall()
    return [int(r[0]) for r in rows]


async def test_the_running_pane_says_n_of_m_and_pages(dsn: str) -> None:
    assert RUNNING_PAGE == 100
    ids = running_jobs(dsn, 250)
    app = JobtuiApp(dsn, refresh_interval=0.25, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        await pilot.press("2")
        caption = "#running-page"
        await wait_for(pilot, lambda: label(app, caption).startswith("jobs 1-100 of 250"), what="page 1")
        assert label(app, caption).endswith("] next page")
        assert app.latest is not None and [j.id for j in app.latest.running] == ids[:100]
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: label(app, caption).startswith("jobs 101-200 of 250"), what="page 2")
        assert app.latest is not None and [j.id for j in app.latest.running] == ids[100:200]
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: label(app, caption).startswith("jobs 201-250 of 250"), what="page 3")
        assert "next page" not in label(app, caption) and label(app, caption).endswith("[ first page")
        assert app.latest is not None and [j.id for j in app.latest.running] == ids[200:]
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: label(app, caption).startswith("jobs 1-100 of"), what="back to page 1")
        await app.action_quit()


async def charts_drawn(app: JobtuiApp, pilot: Any) -> list[Series]:
    """The charts of the `8` view, once each is drawn after the first read."""
    await wait_for(pilot, lambda: app.latest is not None, what="the first read")
    await pilot.press("8")
    charts = list(app.query(Chart))
    await wait_for(pilot, lambda: all(c.drawn is not None for c in charts), what="the charts drawn")
    return [c.drawn for c in charts if c.drawn is not None]


async def test_the_charts_show_the_hour_before_the_console_opened(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobtui.queue_minute (minute, ready, ready_due, oldest_ready_age, done, dead, lease_expiries)"
            " SELECT date_bin('1 minute', now(), timestamptz '2000-01-01') - i * interval '1 minute',"
            " 100 * i, 90 * i, 10.0 * i, 5, i % 2, 0 FROM generate_series(1, 30) AS i"
        )
    app = JobtuiApp(dsn, refresh_interval=0.25, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        drawn = {d.title: d.points for d in await charts_drawn(app, pilot)}
        # x is in minutes before the read's own minute: one later than the insert's when a
        # minute began in between, and then every point sits one minute further back.
        ready = drawn["ready jobs"]
        late = -1 - ready[-1][0]
        assert late in (0, 1), ready
        assert ready == tuple((-i - late, 100.0 * i) for i in range(30, 0, -1))
        assert drawn["oldest ready age, s"][-1] == (-1 - late, 10.0)
        assert drawn["dead and failed per minute"][:2] == ((-30 - late, 0.0), (-29 - late, 1.0))
        assert len(drawn["done per minute"]) == 59  # whole minutes, from the done rows
        await app.action_quit()


async def test_without_minute_rows_the_charts_say_why_they_are_empty(dsn: str) -> None:
    app = JobtuiApp(dsn, refresh_interval=0.25, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        titles = [d.title for d in await charts_drawn(app, pilot)]
        assert sum(NO_MINUTES in t for t in titles) == 4 and "done per minute" in titles
        await app.action_quit()


async def test_the_job_view_lists_every_attempt_with_its_whole_error(dsn: str) -> None:
    errors = [
        {"at": f"2026-01-01T00:0{n}:00+00:00", "started": f"2026-01-01T00:0{n - 1}:30+00:00",
         "attempt": n, "worker": f"w{n}", "kind": "error",
         "error": f"ValueError: try {n}\nTraceback (most recent call last):\n  File \"app.py\", line {n}"}
        for n in (1, 2)
    ]  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO jobtui.job (type, payload, status, attempts, max_attempts, last_error, errors, finished_at)"
            " VALUES ('t', '{\"a\": {\"b\": [1, 2]}}', 'dead', 2, 2, %s, %s::jsonb, now()) RETURNING id",
            (errors[-1]["error"], Jsonb(errors)),
        ).fetchone()
    assert row is not None
    app = JobtuiApp(dsn, refresh_interval=0.25, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.latest is not None, what="the first read")
        app.push_screen(JobDetailScreen(int(row[0])))
        await wait_for(pilot, lambda: "Attempts and events" in label(app.screen, "#detail"), what="the job")
        text = label(app.screen, "#detail")
        attempts = text.split("Attempts and events (2 recorded, newest first):")[1]
        assert attempts.index("attempt 2  error on w2") < attempts.index("attempt 1  error on w1")
        assert attempts.count('  File "app.py", line') == 2  # the whole traceback, not a first line
        assert "started 2026-01-01T00:01:30+00:00, ended 2026-01-01T00:02:00+00:00" in attempts
        assert '"a": {\n    "b": [\n      1,' in text  # the payload pretty-printed
        await app.action_quit()
