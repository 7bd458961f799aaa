"""Regenerate the console screenshots in this folder from a live demo workload.

    .venv/bin/python screenshots/make_screenshots.py                      # JOBTUI_DSN's server
    .venv/bin/python screenshots/make_screenshots.py --dsn postgresql://postgres@127.0.0.1/postgres

It (re)creates its own database (jobtui_screens by default) on the given server, runs the demo
workload of `jobtui demo` in it (traffic, a worker inside the console, the crashing worker
process) long enough for every pane to have something to show, then drives the console with
Textual's pilot and saves one SVG per view:

    ready.svg  running.svg  job-detail.svg  dead.svg  confirm.svg  dead-drilldown.svg
    expiries.svg  schedules.svg  worker.svg  queues.svg  charts.svg  why.svg  console-80x24.svg
    dead-80x24.svg  search.svg  workers.svg

For the Workers pane, three `jobtui worker` processes serve the queue `reports` beside the
demo's: one is quieted (an operator's order, as `jobtui workers quiet` gives it) and one
killed with SIGKILL, so that it reads as lost.

Then it serves the same database with `jobtui serve`, signs in with Debian's Chromium
(/usr/bin/chromium, headless, driven by Playwright; no browser is downloaded), shows the dead
groups and saves browser.png (--no-browser skips it; --browser-only runs the workload
without the console, for --warmup seconds, and makes browser.png alone).

The archiver writes one queue_minute row a minute; a run of a minute would leave the charts
almost empty, so the script first writes the rows of an hour of a queue falling behind, as
the demo's schedules are rewound to show missed slots. The minutes of the run itself are the
archiver's own.

Convert one to look at it: rsvg-convert -o /tmp/ready.png screenshots/ready.svg
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobtui.cli import demo
from jobtui.clients.client import Client
from jobtui.core import queues
from jobtui.core.history import record_flow
from jobtui.core.members import Target, give_order
from jobtui.kernel import migrate
from jobtui.kernel.domain import NewJob
from jobtui.tui.app import JobtuiApp
from jobtui.tui.screens import ConfirmScreen, JobDetailScreen, JobListScreen
from jobtui.tui.search import JobSearchScreen
from jobtui.tui.widgets import KeyedTable
from jobtui.worker import Worker

HERE = Path(__file__).resolve().parent
SCHEMA = "jobtui"
GHOST = "batch-7:31337"  # a worker that "crashed" holding a lease, for the expired row


def with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


def create_database(server_dsn: str, name: str) -> str:
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_dbname(server_dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.migrate(conn, SCHEMA)
    return dsn


async def wait_for(pilot: Any, condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await pilot.pause(0.1)


def table_rows(app: JobtuiApp, pane: str) -> int:
    return app.query_one(f"#table-{pane}", KeyedTable).row_count


def row_keys(table: KeyedTable) -> list[str]:
    return [str(row.key.value) for row in table.ordered_rows]


async def select(pilot: Any, app: JobtuiApp, pane: str, key: str | None) -> None:
    """Put the cursor on the row `key` of `pane` (None: the first row)."""
    table = app.query_one(f"#table-{pane}", KeyedTable)
    await wait_for(pilot, lambda: table.row_count > 0 and (key is None or key in row_keys(table)), 10, f"row {key}")
    table.move_cursor(row=0 if key is None else row_keys(table).index(key))


async def shoot(app: JobtuiApp, pilot: Any, out: Path, name: str) -> None:
    await pilot.pause(0.3)
    app.save_screenshot(f"{name}.svg", str(out))
    print(f"  {out / (name + '.svg')}", file=sys.stderr)


def pull_levers(dsn: str) -> None:
    """An incident's first moves: reports held in their own queue, webhooks paused, a limit."""
    with Client(dsn, schema=SCHEMA, max_connections=1) as client:
        client.enqueue_many([NewJob("report.build", {"seconds": 1}, queue="reports")] * 40)
    with psycopg.connect(dsn, autocommit=True) as conn:
        queues.pause(conn, "queue", "reports", actor="screenshots", schema=SCHEMA)
        queues.pause(conn, "type", "webhook.deliver", actor="screenshots", schema=SCHEMA)
        queues.set_limit(conn, "default", 6, actor="screenshots", schema=SCHEMA)
        queues.set_rate(conn, "type", "webhook.deliver", 2.0, actor="screenshots", schema=SCHEMA)
        queues.set_rate(conn, "type", "image.resize", 5.0, actor="screenshots", schema=SCHEMA)
        record_flow(conn, SCHEMA, until=conn.execute("SELECT now()").fetchone()[0])  # type: ignore[index]


def an_hour_behind(dsn: str) -> None:
    """queue_minute rows for the hour before now: calm, then a backlog building up."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.queue_minute (minute, ready, ready_due, oldest_ready_age, done, dead, lease_expiries)"
                " SELECT date_bin('1 minute', now(), timestamptz '2000-01-01') - i * interval '1 minute',"
                " 30 + greatest(0, 25 - i) * 40, 25 + greatest(0, 25 - i) * 38, 1 + greatest(0, 25 - i) * 9.5,"
                " 240 - greatest(0, 25 - i) * 3, (i % 4 = 0)::int + (i < 20)::int, (i IN (12, 7))::int * 3"
                " FROM generate_series(2, 60) AS i ON CONFLICT DO NOTHING"
            ).format(sql.Identifier(SCHEMA))
        )


def fleet_workers(dsn: str) -> dict[str, subprocess.Popen[bytes]]:
    """Three worker processes of the `reports` queue, with a short lease (lost within 6 s)."""
    procs = {}
    for name in ("reports-1", "reports-2", "batch-9"):
        command = [
            sys.executable, "-m", "jobtui.cli", "--dsn", dsn, "--schema", SCHEMA, "worker", "--app",
            "jobtui.cli.demo:jobs", "--types", "report.build", "--queues", "reports=2", "--lease", "6s",
            "--no-scheduler", "--id", name,
        ]  # fmt: skip
        procs[name] = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return procs


def expire_a_lease(dsn: str) -> int:
    """A worker claims an image job and 'dies' holding it: its lease runs out unreaped."""
    with Client(dsn, schema=SCHEMA, max_connections=1) as client:
        client.enqueue("image.resize", {"image": 4711}, max_attempts=2)
        claimed = client.claim(["image.resize"], worker=GHOST, lease=2)
        return claimed[0].id


async def drive(dsn: str, out: Path, warmup: float) -> None:
    # The worker inside the console: the demo's main worker. Its reaper is slowed down so the
    # expired lease made below stays visible (the crash worker, which also reaps, is stopped
    # by then).
    worker = Worker(demo.jobs, dsn, concurrency=8, types=demo.MAIN_TYPES, lease=demo.LEASE, schema=SCHEMA,
                    shutdown_timeout=5, worker_id="demo-main", reap_interval=60)  # fmt: skip
    traffic = demo.Traffic(dsn, SCHEMA)
    crasher = demo.CrashWorker(dsn, SCHEMA)
    app = JobtuiApp(dsn, schema=SCHEMA, actor="screenshots", worker=worker, refresh_interval=0.5)
    worker.registered_as = "console"
    traffic.start()
    crasher.start()
    fleet: dict[str, subprocess.Popen[bytes]] = {}
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            print(f"warming up for {warmup:.0f}s (traffic, worker, crash worker)...", file=sys.stderr)
            with psycopg.connect(dsn, autocommit=True) as conn:  # the forecast's first span
                record_flow(conn, SCHEMA, until=conn.execute("SELECT now()").fetchone()[0])  # type: ignore[index]
            await asyncio.sleep(warmup)
            crasher.stop()
            ghost = expire_a_lease(dsn)
            await wait_for(
                pilot,
                lambda: any(j.id == ghost and j.lease_left < -1 for j in (app.latest.running if app.latest else [])),
                20,
                "the ghost lease to expire",
            )
            print("screenshots:", file=sys.stderr)
            # The worker keeps up with the demo traffic; pausing it a moment lets work queue up.
            await pilot.press("w")
            await asyncio.sleep(4)
            await pilot.pause(0.6)  # a refresh
            await shoot(app, pilot, out, "ready")
            await pilot.press("w")

            await pilot.press("2")
            await select(pilot, app, "running", str(ghost))
            await shoot(app, pilot, out, "running")

            await pilot.press("enter")  # the expired lease, explained
            await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), 5, "the detail screen")
            await wait_for(pilot, lambda: "Loading" not in str(app.screen.query_one("#detail").render()), 10, "job")
            await shoot(app, pilot, out, "job-detail")
            await pilot.press("escape")
            # Once the expired lease is pictured: these workers' reapers would have taken it.
            fleet = fleet_workers(dsn)

            await pilot.press("3")
            await wait_for(pilot, lambda: table_rows(app, "dead") > 0, 10, "dead groups")
            await select(pilot, app, "dead", None)  # the largest group
            await shoot(app, pilot, out, "dead")
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
            await shoot(app, pilot, out, "confirm")
            await pilot.press("n")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, JobListScreen), 5, "the group's jobs")
            await wait_for(pilot, lambda: app.screen.query_one(KeyedTable).row_count > 0, 10, "the group's jobs")
            await shoot(app, pilot, out, "dead-drilldown")
            await pilot.press("escape")

            await pilot.press("4")
            await wait_for(pilot, lambda: table_rows(app, "expiries") > 0, 10, "lease expiries")
            await shoot(app, pilot, out, "expiries")

            await pilot.press("5")
            await wait_for(pilot, lambda: table_rows(app, "schedules") > 0, 10, "schedules")
            await shoot(app, pilot, out, "schedules")

            await pilot.press("6")
            await shoot(app, pilot, out, "worker")

            pull_levers(dsn)
            await asyncio.sleep(3)  # the paused work waits, and its oldest age grows
            await pilot.press("7")
            await wait_for(pilot, lambda: table_rows(app, "queues") > 2, 10, "queues")
            await pilot.pause(0.6)  # a refresh
            await shoot(app, pilot, out, "queues")

            await pilot.press("8")
            await pilot.pause(0.6)
            await shoot(app, pilot, out, "charts")

            with psycopg.connect(dsn, autocommit=True) as conn:  # an operator's quiet
                give_order(conn, "quiet", Target(name="reports-2"), actor="screenshots", schema=SCHEMA)
            fleet["batch-9"].kill()  # SIGKILL: its row stays, and reads as lost
            await pilot.press("9")
            await wait_for(
                pilot,
                lambda: (
                    app.latest is not None and any(p.lost and p.name == "batch-9" for p in app.latest.fleet.processes)
                ),
                20,
                "the killed worker lost",
            )
            await pilot.pause(0.6)
            await shoot(app, pilot, out, "workers")

            await pilot.press("0")  # why: the paused queue and type, with who paused them, and the rest
            await wait_for(pilot, lambda: table_rows(app, "why") > 0, 15, "the Why pane")
            await pilot.pause(0.6)
            await shoot(app, pilot, out, "why")

            await pilot.press("1", "slash", *"type:invoice.render status:dead,failed", "enter")  # the jobs search
            await wait_for(pilot, lambda: isinstance(app.screen, JobSearchScreen), 5, "the search")
            await wait_for(pilot, lambda: "match" in str(app.screen.query_one("#search-status").render()), 15, "it")
            await shoot(app, pilot, out, "search")
            await pilot.press("escape")

            await pilot.press("1")
            await pilot.resize_terminal(80, 24)
            await shoot(app, pilot, out, "console-80x24")
            await pilot.press("3")
            await shoot(app, pilot, out, "dead-80x24")

            await pilot.press("q")
            await wait_for(pilot, lambda: not worker.running, 30, "the worker to stop")
    finally:
        traffic.stop()
        crasher.stop()
        for proc in fleet.values():
            proc.terminate()
            proc.wait(30)


async def workload(dsn: str, seconds: float, then: Callable[[], None] | None = None) -> None:
    """The demo's traffic and main worker, without the console, for `seconds`, then while
    `then` runs (in a thread): the browser's console shows a queue that is being worked."""
    worker = Worker(demo.jobs, dsn, concurrency=8, types=demo.MAIN_TYPES, lease=demo.LEASE, schema=SCHEMA,
                    shutdown_timeout=5, worker_id="demo-main")  # fmt: skip
    traffic = demo.Traffic(dsn, SCHEMA)
    traffic.start()
    try:
        print(f"workload for {seconds:.0f}s...", file=sys.stderr)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(seconds)
        if then is not None:
            await asyncio.to_thread(then)
        worker.stop()
        await task
    finally:
        traffic.stop()


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
ESCAPES = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]P^_].*?(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")


def browser(dsn: str, out: Path) -> None:
    """The console in Chromium, served by `jobtui serve`, signed in as an operator."""
    if not os.access(CHROMIUM, os.X_OK):
        print(f"  no {CHROMIUM}: browser.png not made (apt-get install -y chromium)", file=sys.stderr)
        return
    from playwright.sync_api import sync_playwright

    from jobtui.web.users import OPERATOR, UsersFile

    work = Path(tempfile.mkdtemp(prefix="jobtui-screens-"))
    UsersFile(work / "users").add("alice", "alice-password-1", role=OPERATOR)
    log = (work / "serve.log").open("w+")
    command = [sys.executable, "-m", "jobtui.cli", "--schema", SCHEMA, "serve", "--users", str(work / "users")]
    env = {**os.environ, "JOBTUI_DSN": dsn}
    server = subprocess.Popen([*command, "--port", "0"], env=env, stderr=log, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"listening on (\S+)", (work / "serve.log").read_text())):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"jobtui serve did not start: {(work / 'serve.log').read_text()}")
            time.sleep(0.1)
        url = found.group(1).rstrip("/")
        seen: list[bytes] = []
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
            page = chromium.new_page(viewport={"width": 1280, "height": 720})
            page.on(
                "websocket",
                lambda ws: ws.on("framereceived", lambda f: seen.append(f) if isinstance(f, bytes) else None),
            )

            def showing(text: bytes) -> None:
                deadline = time.monotonic() + 20
                while not any(text in ESCAPES.sub(b"", frame) for frame in seen):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the browser's console never showed {text!r}")
                    page.wait_for_timeout(100)

            page.goto(f"{url}/login")
            page.fill("#name", "alice")
            page.fill("#password", "alice-password-1")
            page.click("button[type=submit]")
            showing(b"updated")
            seen.clear()
            page.keyboard.press("3")
            showing(b"error fingerprint")
            page.wait_for_timeout(1500)  # a refresh, and the footer's keys
            page.screenshot(path=str(out / "browser.png"))
            print(f"  {out / 'browser.png'}", file=sys.stderr)
            chromium.close()
    finally:
        server.terminate()
        server.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("JOBTUI_DSN"), help="a server to create the database on")
    parser.add_argument("--database", default="jobtui_screens", help="the database to (re)create")
    parser.add_argument("--warmup", type=float, default=40.0, help="seconds of workload before the screenshots")
    parser.add_argument("--out", type=Path, default=HERE, help="where the SVGs go (default: this folder)")
    parser.add_argument("--no-browser", action="store_true", help="no browser.png (jobtui serve in Chromium)")
    parser.add_argument("--browser-only", action="store_true", help="browser.png alone, after --warmup of workload")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("give --dsn or set JOBTUI_DSN")
    logging.getLogger("jobtui").setLevel(logging.ERROR)
    args.out.mkdir(parents=True, exist_ok=True)
    dsn = create_database(args.dsn, args.database)
    demo.prepare(dsn, SCHEMA)
    an_hour_behind(dsn)
    if not args.browser_only:
        asyncio.run(drive(dsn, args.out, args.warmup))
    if not args.no_browser:
        warmup = args.warmup if args.browser_only else 5.0
        asyncio.run(workload(dsn, warmup, lambda: browser(dsn, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
