"""The console in a real browser: Debian's Chromium, headless, driven by Playwright, on a real
`jobtui serve` and its console processes, on a real database.

A person signs in with the form, reads the console (the frames the page's socket received,
drawn by a terminal emulator as xterm.js draws them), presses keys in the page, and clicks
Sign out. One server and one browser serve the module's tests; each test has a browser
context (cookies) of its own.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.waits import wait_until
from tests.web import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    PASSWORDS,
    Screen,
    ServeProcess,
    audit_rows,
    chromium_missing,
    header_where,
    read_only_role,
    seed_dead,
    statuses,
    watch_browser_socket,
    write_users,
)

MISSING = chromium_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

# Opens the console's WebSocket from the page it runs in: "open" or "refused".
TRY_SOCKET = """(url) => new Promise((resolve) => {
  const socket = new WebSocket(url);
  socket.onopen = () => { socket.close(); resolve("open"); };
  socket.onerror = () => resolve("refused");
  setTimeout(() => resolve("no answer"), 10000);
})"""


@pytest.fixture(scope="module")
def database(server_dsn: str, template_db: str) -> Iterator[tuple[str, str]]:
    """A migrated database of the module's own: its name and DSN."""
    from tests.conftest import with_dbname

    name = f"jobtui_browser_{time.monotonic_ns()}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db))
        )
    yield name, with_dbname(server_dsn, name)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "users"
    write_users(path)
    return path


@pytest.fixture(scope="module")
def viewer_dsn(database: tuple[str, str]) -> Iterator[str]:
    """A read-only role's DSN (docs/grants.sql), for viewers' consoles."""
    with read_only_role(database[1]) as made:
        yield made


@pytest.fixture(scope="module")
def server(database: tuple[str, str], users: Path, viewer_dsn: str) -> Iterator[ServeProcess]:
    serve = ServeProcess(database[1], users, viewer_dsn=viewer_dsn)
    yield serve
    serve.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # launch() gives the browser a fresh, temporary profile (user-data-dir) of its own.
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def context(browser: Any, server: ServeProcess) -> Iterator[Any]:
    """A browser context (its own cookies); the consoles it opened are gone after it."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    yield ctx
    ctx.close()
    wait_until(lambda: server.consoles() == [], 15, "the test's console processes to end", server.log)


@contextlib.contextmanager
def other_origin() -> Iterator[str]:
    """A page on another port of this host: another origin, but the same site, so the browser
    sends it the server's SameSite=Strict cookie (a real server: Chromium refuses a page that
    came from no address at all the right to reach a local one)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(Path(__file__).parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}/"
        finally:
            httpd.shutdown()


def sign_in(page: Any, url: str, name: str, password: str | None = None) -> None:
    page.goto(f"{url}/login")
    page.fill("#name", name)
    page.fill("#password", PASSWORDS[name] if password is None else password)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def until(page: Any, screen: Screen, what: str, condition: Callable[[str], bool], timeout: float = 20.0) -> str:
    """Let the page run until its console's screen satisfies `condition`."""
    deadline = time.monotonic() + timeout
    while not condition(text := screen.text()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; the screen:\n{text}")
        page.wait_for_timeout(50)
    return text


def press(page: Any, screen: Screen, key: str, what: str, condition: Callable[[str], bool]) -> str:
    """Press `key` once, and let the page run until the console's screen satisfies `condition`."""
    page.keyboard.press(key)
    return until(page, screen, what, condition)


def footer(screen: str) -> str:
    return screen.rstrip().splitlines()[-1]


def test_an_operator_signs_in_switches_panes_and_requeues_a_dead_group(
    context: Any, server: ServeProcess, database: tuple[str, str]
) -> None:
    _, dsn = database
    ids = seed_dead(dsn, 3, "email.send")
    page = context.new_page()
    screen, _ = watch_browser_socket(page)
    sign_in(page, server.url, "alice")
    assert page.url == f"{server.url}/"
    assert page.inner_text("#user") == "alice"

    # The header names the database the console reads.
    where = header_where(dsn)
    until(page, screen, "the header", lambda s: f"{where} schema jobtui" in s)
    for key, column in (("2", "lease left"), ("5", "missed"), ("7", "paused"), ("3", "error fingerprint")):
        press(page, screen, key, f"pane {key}", lambda s, c=column: c in s)
    # The dead group, and the key to requeue it (the footer follows the pane a frame later).
    until(page, screen, "the dead group", lambda s: "SMTPError: <n> mailbox <n> unavailable" in s)
    until(page, screen, "the requeue key", lambda s: "r Requeue" in footer(s))

    asked = press(page, screen, "r", "the question", lambda s: "3 row(s) will change" in s)
    assert "Requeue every dead job of type email.send" in asked
    assert statuses(dsn, ids) == ["dead"] * 3  # nothing before the answer
    page.keyboard.press("y")
    until(page, screen, "the toast", lambda s: "requeued 3 job(s)" in s)
    assert statuses(dsn, ids) == ["ready"] * 3
    assert audit_rows(dsn)[-1] == ("web:alice", "requeue", 3)


def test_signing_out_closes_the_socket_and_ends_the_console(context: Any, server: ServeProcess) -> None:
    first = context.new_page()
    screen, socket = watch_browser_socket(first)
    sign_in(first, server.url, "alice")
    until(first, screen, "the console", lambda s: "updated" in s)
    assert len(server.consoles()) == 1

    # Signing out in another tab of the same browser ends the session, and so this tab's socket.
    second = context.new_page()
    second.goto(f"{server.url}/")
    second.click("#signout")
    second.wait_for_url(f"{server.url}/login?out")
    assert "Signed out." in second.inner_text("main")
    first.wait_for_selector("#closed", state="visible", timeout=15000)
    assert socket["closed"]
    wait_until(lambda: server.consoles() == [], 15, "the console processes to end", server.log)
    assert context.cookies() == []
    first.reload()
    assert first.url == f"{server.url}/login"


def test_a_viewer_sees_no_change_keys_and_changes_nothing(
    context: Any, server: ServeProcess, database: tuple[str, str]
) -> None:
    _, dsn = database
    ids = seed_dead(dsn, 2, "sms.send")
    audited = audit_rows(dsn)
    page = context.new_page()
    screen, _ = watch_browser_socket(page)
    sign_in(page, server.url, "bob")
    assert "viewer: read-only console" in page.inner_text("#bar")
    until(page, screen, "the header", lambda s: "read-only console" in s)
    shown = press(page, screen, "3", "the dead pane's keys", lambda s: "sms.send" in s and "Sort" in footer(s))
    assert "Requeue" not in footer(shown)
    # The group's jobs: no requeue or cancel keys either.
    listed = press(page, screen, "Enter", "the group's jobs", lambda s: "Back" in footer(s))
    assert "Requeue" not in footer(listed) and "Cancel" not in footer(listed)
    for key in ("r", "y", "R", "y", "Escape"):
        page.keyboard.press(key)
    helped = press(page, screen, "?", "the help", lambda s: "this help" in s)
    assert "row(s) will change" not in helped
    assert statuses(dsn, ids) == ["dead"] * 2
    assert audit_rows(dsn) == audited


def test_wrong_password_no_cookie_other_origin_and_idle_session_are_refused(
    browser: Any, database: tuple[str, str], users: Path, viewer_dsn: str
) -> None:
    server = ServeProcess(database[1], users, "--idle-timeout", "4s", viewer_dsn=viewer_dsn)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    ws_url = server.url.replace("http://", "ws://") + "/ws"
    try:
        page = context.new_page()
        # No cookie: the console's page sends to the sign-in, and its socket does not open.
        page.goto(f"{server.url}/")
        assert page.url == f"{server.url}/login"
        assert page.evaluate(TRY_SOCKET, ws_url) == "refused"

        # Signed in, the console opens; left idle past the timeout, its socket is closed.
        screen, socket = watch_browser_socket(page)
        sign_in(page, server.url, "alice")
        until(page, screen, "the console", lambda s: "updated" in s)
        page.wait_for_selector("#closed", state="visible", timeout=20000)
        assert socket["closed"]
        wait_until(lambda: "'alice' signed out: idle" in server.log(), 10, "the sign-out in the log", server.log)
        page.reload()
        assert page.url == f"{server.url}/login"

        # A page of another origin on the same host (same site: the browser sends the cookie)
        # cannot open a console of the signed-in user.
        sign_in(page, server.url, "alice")
        with other_origin() as elsewhere:
            foreign = context.new_page()
            foreign.goto(elsewhere)
            assert foreign.evaluate(TRY_SOCKET, ws_url) == "refused"
            said = f"console refused to 'alice' from 127.0.0.1: Origin '{elsewhere.rstrip('/')}' is not"
            wait_until(lambda: said in server.log(), 10, "the refusal in the log", server.log)
            foreign.close()

        # A wrong password: the form again, saying so, and no cookie.
        context.clear_cookies()
        sign_in(page, server.url, "alice", "not-the-password")
        assert page.url == f"{server.url}/login"
        assert "Wrong name or password." in page.inner_text("main")
        assert context.cookies() == []
        assert server.said("failed sign-in as 'alice' from 127.0.0.1 (1 in a row)")
    finally:
        context.close()
        server.stop()


# Drill-downs opened, each with its key in the same write: 50 in the slow run, 10 by default.
KEYED = [10, pytest.param(50, marks=pytest.mark.slow)]
# Types keys as one input event of the terminal's text area, as a fast typist's or an input
# method's keys may come: xterm.js sends them in one message (insert_text would send "\r" as a
# line break, which the terminal does not take).
TYPE_AT_ONCE = """(keys) => document.querySelector(".xterm-helper-textarea")
  .dispatchEvent(new InputEvent("input", {data: keys, inputType: "insertText"}))"""


@pytest.mark.parametrize("times", KEYED)
def test_a_screens_key_typed_with_the_key_that_opens_it_arrives_every_time(
    context: Any, server: ServeProcess, database: tuple[str, str], times: int
) -> None:
    """Enter (a dead group's jobs), r (requeue the job under the cursor), y (the answer) and q
    (back), typed as one input of the page's terminal (one WebSocket message, one write to the
    console), 10 times (50 in the slow run): every requeue happens, counted by its audit row."""
    _, dsn = database
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobtui.job (type, status, attempts, max_attempts, last_error, started_at, finished_at)"
            " SELECT 'burst.send', 'dead', 3, 3, 'BurstError: upstream ' || i || ' did not answer', now(), now()"
            " FROM generate_series(1, %s) AS i",
            (times,),
        )
    before = len(audit_rows(dsn))
    page = context.new_page()
    screen, _ = watch_browser_socket(page)
    sent: list[str] = []
    page.on("websocket", lambda socket: socket.on("framesent", lambda p: sent.append(p) if "stdin" in p else None))
    sign_in(page, server.url, "alice")
    until(page, screen, "the console", lambda s: "updated" in s)

    def dead_pane(s: str) -> bool:
        return "error fingerprint" in s and " jobs of " not in s

    page.keyboard.press("3")
    until(page, screen, "the dead pane", lambda s: "error fingerprint" in s)
    page.keyboard.press("/")
    until(page, screen, "the filter box", lambda s: "search jobs: payload:" in s)
    page.keyboard.type("BurstError")
    page.keyboard.press("Enter")
    until(page, screen, "the group alone", lambda s: "BurstError" in s and "filter: 'BurstError'" in s)
    for done in range(1, times + 1):
        sent.clear()
        # One input: open the list, requeue its first job, answer the question, back (q).
        page.evaluate(TYPE_AT_ONCE, "\rryq")
        # Waits pump the page's events (page.wait_for_timeout): a page whose socket frames
        # nobody reads stalls its socket, and with it the console's output.
        until(page, screen, f"requeue {done} of {times}", lambda _, n=done: len(audit_rows(dsn)) >= before + n)
        until(page, screen, "back to the dead pane", dead_pane)
        assert sent == ['["stdin","\\rryq"]'], sent  # one message: one write to the console
    assert audit_rows(dsn)[before:] == [("web:alice", "requeue", 1)] * times
    assert statuses(dsn, [int(r[0]) for r in job_ids(dsn, "burst.send")]) == ["ready"] * times


def test_a_search_typed_with_its_bulk_key_in_one_input_asks_about_its_jobs(
    context: Any, server: ServeProcess, database: tuple[str, str]
) -> None:
    """The filter box's search words, enter and r as one input of the page's terminal: r asks
    about the search's jobs (before, it landed in the box, which the search then emptied)."""
    _, dsn = database
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobtui.job (type, status, attempts, max_attempts, last_error, started_at, finished_at)"
            " SELECT 'oneinput.send', 'dead', 3, 3, 'OneInputError', now(), now() FROM generate_series(1, 3)"
        )
    page = context.new_page()
    screen, _ = watch_browser_socket(page)
    sign_in(page, server.url, "alice")
    until(page, screen, "the console", lambda s: "updated" in s)
    page.evaluate(TYPE_AT_ONCE, "/type:oneinput.send status:dead\rr")
    until(page, screen, "the question", lambda s: "3 row(s) will change" in s)
    page.keyboard.press("n")
    until(page, screen, "the search again", lambda s: "row(s) will change" not in s)
    assert statuses(dsn, [int(r[0]) for r in job_ids(dsn, "oneinput.send")]) == ["dead"] * 3


def job_ids(dsn: str, job_type: str) -> list[tuple[int]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT id FROM jobtui.job WHERE type = %s ORDER BY id", (job_type,)).fetchall()


def test_a_link_to_the_workers_pane_opens_it_after_the_sign_in_with_the_users_own_role(
    context: Any, server: ServeProcess, database: tuple[str, str]
) -> None:
    """A link pasted in an incident channel: `/?open=workers`. Followed by a viewer who is not
    signed in, it goes through the sign-in and opens the console on the Workers pane (where
    the server itself is listed), read-only: the link gives no role."""
    page = context.new_page()
    screen, _ = watch_browser_socket(page)
    page.goto(f"{server.url}/?open=workers")
    assert page.url == f"{server.url}/login?open=workers"
    page.fill("#name", "bob")
    page.fill("#password", PASSWORDS["bob"])
    page.click("button[type=submit]")
    page.wait_for_load_state()
    assert page.url == f"{server.url}/?open=workers"
    shown = until(page, screen, "the Workers pane", lambda s: "live on" in s and " serve " in s)
    assert "workers before" in shown and "read-only console" in shown
    assert "Quiet" not in footer(shown) and "Stop" not in footer(shown)
    # A view the console does not have opens the console as it is, and the page says so.
    page.goto(f"{server.url}/?open=nowhere")
    assert "the link's view 'nowhere' is not one the console has" in page.inner_text("#bar")
    until(page, screen, "the console", lambda s: "updated" in s)


def test_the_why_view_in_the_browser_names_the_pause_and_goes_to_its_fix(
    context: Any, server: ServeProcess, database: tuple[str, str]
) -> None:
    """The Why pane is the console's: a link `/?open=why` opens it in the browser, it names
    what holds the queue (a pause, by whom, with its audit row) and the key that fixes it, and
    enter goes to the queue's line in the Queues pane."""
    from jobtui import Client
    from jobtui.core import queues

    _, dsn = database
    with Client(dsn) as q:
        for _ in range(3):
            q.enqueue("report.build", {}, queue="reports")
    with psycopg.connect(dsn) as conn:
        queues.pause(conn, "queue", "reports", actor="ops@incident")
    try:
        page = context.new_page()
        screen, _ = watch_browser_socket(page)
        sign_in(page, server.url, "alice")
        page.goto(f"{server.url}/?open=why")
        # The header names the first cause too: wait for the pane's own line of the pause.
        until(page, screen, "the Why pane", lambda s: "0 Why" in s and "7 p" in s)
        # Other tests' jobs wait in the same database, so their causes may come first: go
        # down to the pause, whose detail names its audit row.
        for _ in range(12):
            if "audit row" in screen.text():
                break
            press(page, screen, "ArrowDown", "the next cause", lambda s: True)
            page.wait_for_timeout(200)
        shown = until(page, screen, "the pause's detail", lambda s: "audit row" in s and "fix:" in s)
        assert "queue reports is paused (by ops@incident)" in shown
        page.keyboard.press("Enter")
        moved = until(page, screen, "the queue's line in Queues", lambda s: "p Pause/resume" in footer(s))
        assert "by ops@incident" in moved
    finally:
        with psycopg.connect(dsn) as conn:
            queues.resume(conn, "queue", "reports", actor="ops@incident")
            conn.execute("DELETE FROM jobtui.job WHERE queue = 'reports'")
