"""`jobtui serve` for tests: the real server as a process, its users, a protocol client, and the
screen a browser shows, rebuilt from what the browser received.

server = ServeProcess(dsn, users, tmp_path)       # jobtui serve --port 0, on this test's database
client = await signed_in(server.url, "alice", PASSWORD)
console = await open_console(client, server.url)   # the WebSocket a browser tab opens
await console.keys("3"); await console.wait("dead", lambda s: "Dead" in s)

The screen: the bytes a console sends are what the browser's terminal (xterm.js) draws; a
terminal emulator (pyte) fed the same bytes gives its text, so a test reads what a person
sees, in a browser (Playwright's frame events) or in a protocol client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pyte
from psycopg.conninfo import make_conninfo

from jobtui.web.users import OPERATOR, VIEWER, UsersFile
from tests.waits import wait_until
from tests.workers import ROOT

PASSWORDS = {"alice": "alice-password-1", "bob": "bob-password-12"}  # alice an operator, bob a viewer
CHROMIUM = "/usr/bin/chromium"
# The flags of every browser the tests start: headless, and nothing that reaches the network.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is not installed (apt-get install -y chromium; .ci/run does)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


def write_users(path: Path) -> UsersFile:
    users = UsersFile(path)
    users.add("alice", PASSWORDS["alice"], role=OPERATOR)
    users.add("bob", PASSWORDS["bob"], role=VIEWER)
    return users


def seed_dead(dsn: str, n: int = 3, job_type: str = "email.send") -> list[int]:
    """`n` dead jobs of one group (one error), as a worker's last failed attempt leaves them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "INSERT INTO jobtui.job (type, status, attempts, max_attempts, last_error, started_at, finished_at)"
            " SELECT %s, 'dead', 3, 3, 'SMTPError: 550 mailbox ' || i || ' unavailable', now(), now()"
            " FROM generate_series(1, %s) AS i RETURNING id",
            (job_type, n),
        ).fetchall()
    return [int(r[0]) for r in rows]


def statuses(dsn: str, ids: list[int]) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT status FROM jobtui.job WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
    return [str(r[0]) for r in rows]


def audit_rows(dsn: str) -> list[tuple[str, str, int]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT actor, action, rows FROM jobtui.audit ORDER BY id").fetchall()
    return [(str(a), str(b), int(c)) for a, b, c in rows]


def header_where(dsn: str) -> str:
    """Where the console's header says it reads `dsn`: role@host:port/database, as the server
    answers it (a socket directory for the embedded server, no assumed host or port)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_user, current_database()").fetchone()
        assert row is not None
        return f"{row[0]}@{conn.info.host}:{conn.info.port}/{row[1]}"


def console_connections(dsn: str, user: str) -> int:
    """Database connections the consoles of `user` hold (each names its user, PGAPPNAME)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (f"jobtui serve {user}",)
        ).fetchone()
    assert row is not None
    return int(row[0])


@contextlib.contextmanager
def read_only_role(admin_dsn: str) -> Iterator[str]:
    """A role of the test's own with the read grants of docs/grants.sql (-v read_only=1), made
    by psql running the file; its DSN. Dropped afterwards."""
    from tests.roles import drop_roles, role_names, run_grants

    _, role = role_names("viewer")
    try:
        run_grants(admin_dsn, role, read_only=True, create_role=True)
        yield make_conninfo(admin_dsn, user=role)
    finally:
        drop_roles(admin_dsn, role)


# A fault in every web console process, for the tests: Python imports sitecustomize at start
# from PYTHONPATH. In a console of `jobtui serve` (TERM_PROGRAM says so), the first connection
# the console opens sends change statements of its own, each in a transaction rolled back,
# and the outcome goes to FAULTS_DIR/<pid>.json: "ok", or PostgreSQL's SQLSTATE and message.
FAULT_HOOK = """
import json, os
from pathlib import Path

if os.environ.get("TERM_PROGRAM") == "jobtui-serve" and os.environ.get("JOBTUI_TEST_FAULTS"):
    import psycopg

    _connect = psycopg.connect
    _done = []

    def _fault(conn):
        outcome = {"role": conn.execute("SELECT current_user").fetchone()[0]}
        audit = "INSERT INTO jobtui.audit (actor, action, rows) VALUES ('fault', 'requeue', 1)"
        for name, statements in (
            ("audit", [audit]),
            ("requeue", ["UPDATE jobtui.job SET status = 'ready', attempts = 0 WHERE status = 'dead'"]),
            ("reset role", ["RESET ROLE", audit]),
        ):
            try:
                with conn.transaction(force_rollback=True):
                    for statement in statements:
                        conn.execute(statement)
                outcome[name] = "ok"
            except psycopg.Error as exc:
                outcome[name] = f"{exc.sqlstate} {str(exc).splitlines()[0]}"
        folder = Path(os.environ["JOBTUI_TEST_FAULTS"])
        (folder / f"{os.getpid()}.tmp").write_text(json.dumps(outcome))
        (folder / f"{os.getpid()}.tmp").rename(folder / f"{os.getpid()}.json")

    def connect(*args, **kwargs):
        conn = _connect(*args, **kwargs)
        if not _done:
            _done.append(True)
            _fault(conn)
        return conn

    psycopg.connect = connect
"""


class ConsoleFaults:
    """The hook above, installed for the consoles of a `ServeProcess` given `env()`."""

    def __init__(self, directory: Path) -> None:
        self.hook = directory / "hook"
        self.found = directory / "faults"
        self.hook.mkdir()
        self.found.mkdir()
        self.seen: set[str] = set()
        (self.hook / "sitecustomize.py").write_text(FAULT_HOOK)

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.hook), os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": path, "JOBTUI_TEST_FAULTS": str(self.found)}

    def next(self, timeout: float = 20.0) -> dict[str, str]:
        """The outcome of the fault of the next console to connect: its role, and what each
        change got."""

        def outcome() -> dict[str, str] | None:
            for path in sorted(self.found.glob("*.json")):
                if path.name not in self.seen:
                    self.seen.add(path.name)
                    found: dict[str, str] = json.loads(path.read_text())
                    return found
            return None

        return wait_until(outcome, timeout, "a console to send its fault")  # type: ignore[no-any-return]


class ServeProcess:
    """`jobtui serve --port 0` on `dsn`, its log gathered from stderr; viewers' consoles on
    `viewer_dsn` (JOBTUI_VIEWER_DSN)."""

    def __init__(
        self, dsn: str, users: Path, *args: str, viewer_dsn: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.lines: list[str] = []
        full_env = {**os.environ, "JOBTUI_DSN": dsn, **(env or {})}
        full_env.pop("JOBTUI_VIEWER_DSN", None)
        if viewer_dsn is not None:
            full_env["JOBTUI_VIEWER_DSN"] = viewer_dsn
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobtui.cli", "serve", "--users", str(users), "--port", "0", *args],
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        found = wait_until(
            lambda: self.proc.poll() is not None or re.search(r"listening on (\S+)", self.log()),
            30,
            "jobtui serve to listen",
            self.log,
        )
        if self.proc.poll() is not None:
            raise AssertionError(f"jobtui serve exited with {self.proc.returncode}:\n{self.log()}")
        self.url = found.group(1).rstrip("/")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for text in self.proc.stderr:
            self.lines.append(text)

    def log(self) -> str:
        return "".join(self.lines)

    def said(self, text: str, timeout: float = 10.0) -> bool:
        """Wait until the server's log holds `text`: stderr is read by a thread, so a line
        the server wrote just now may not have been gathered yet."""
        wait_until(lambda: text in self.log(), timeout, f"{text!r} in the server's log", self.log)
        return True

    def consoles(self) -> list[int]:
        """The pids of the console processes the server runs now (its children)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if int(fields[1]) == self.proc.pid and fields[0] != "Z":
                    pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Screen:
    """A terminal of the browser's size, fed the console's bytes."""

    def __init__(self, width: int = 80, height: int = 24) -> None:
        self._screen = pyte.Screen(width, height)
        self._stream = pyte.ByteStream(self._screen)
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        with self._lock:
            self._stream.feed(data)

    def resize(self, width: int, height: int) -> None:
        with self._lock:
            self._screen.resize(height, width)

    def text(self) -> str:
        with self._lock:
            return "\n".join(row.rstrip() for row in self._screen.display)


def watch_browser_socket(page: Any) -> tuple[Screen, dict[str, Any]]:
    """The screen of the console a Playwright page opens, from the frames its socket receives;
    and what became of the socket (`closed` once it has)."""
    screen = Screen()
    state: dict[str, Any] = {"closed": False, "url": None}

    def on_socket(socket: Any) -> None:
        if "/ws" not in socket.url:
            return
        state["url"] = socket.url
        size = dict(re.findall(r"(width|height)=(\d+)", socket.url))
        screen.resize(int(size.get("width", 80)), int(size.get("height", 24)))
        socket.on("framereceived", lambda payload: screen.feed(payload) if isinstance(payload, bytes) else None)
        socket.on("framesent", lambda payload: _sent(screen, payload))
        socket.on("close", lambda _: state.update(closed=True))

    page.on("websocket", on_socket)
    return screen, state


def _sent(screen: Screen, payload: str | bytes) -> None:
    if isinstance(payload, str) and payload.startswith('["resize"'):
        size = json.loads(payload)[1]
        screen.resize(int(size["width"]), int(size["height"]))


async def signed_in(url: str, name: str, password: str | None = None) -> aiohttp.ClientSession:
    """A client session signed in as `name`, as the sign-in form does it."""
    client = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    form = {"name": name, "password": PASSWORDS[name] if password is None else password}
    async with client.post(f"{url}/login", data=form, headers={"Origin": url}, allow_redirects=False) as answer:
        assert answer.status == 303, await answer.text()
    return client


class ProtocolConsole:
    """A console's WebSocket, spoken as textual-serve's browser client speaks it. A task reads
    every frame into the screen until the socket closes."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse, width: int, height: int) -> None:
        self.socket = socket
        self.screen = Screen(width, height)
        self._fed = asyncio.Event()  # set by each frame, and when the socket closes
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for message in self.socket:  # ends when the socket closes, from either side
                if message.type == aiohttp.WSMsgType.BINARY:
                    self.screen.feed(message.data)
                    self._fed.set()
        finally:
            self._fed.set()

    async def keys(self, *keys: str) -> None:
        for key in keys:
            await self.socket.send_str(json.dumps(["stdin", key]))

    async def wait(self, what: str, condition: Callable[[str], bool], timeout: float = 20.0) -> str:
        """Until the screen satisfies `condition`, looked at again after each frame."""
        deadline = time.monotonic() + timeout
        while True:
            # Cleared before the look: a frame that comes after it sets the event again.
            self._fed.clear()
            text = self.screen.text()
            if condition(text):
                return text
            left = deadline - time.monotonic()
            if left <= 0 or self._reader.done():
                state = "closed" if self._reader.done() else "open"
                raise AssertionError(f"timed out waiting for {what} (the socket is {state}); the screen:\n{text}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fed.wait(), left)

    async def until_closed(self, timeout: float = 20.0) -> int | None:
        """Until the server closes the socket; its close code."""
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        except TimeoutError:
            raise AssertionError(
                f"the socket is still open after {timeout}s; the screen:\n{self.screen.text()}"
            ) from None
        return self.socket.close_code


def console_started(screen: str) -> bool:
    """The console is up: the Dead pane's tab and a refresh's time are on its screen."""
    return "3 Dead" in screen and "updated" in screen


async def started_console(
    client: aiohttp.ClientSession, url: str, what: str = "the console"
) -> tuple[ProtocolConsole, str]:
    """A console over the socket, once it is up; and its screen then."""
    console = await open_console(client, url)
    return console, await console.wait(what, console_started)


async def open_console(
    client: aiohttp.ClientSession, url: str, *, origin: str | None = None, width: int = 160, height: int = 40
) -> ProtocolConsole:
    ws_url = url.replace("http", "ws", 1) + f"/ws?width={width}&height={height}"
    socket = await client.ws_connect(ws_url, headers={"Origin": origin or url})
    await socket.send_str(json.dumps(["resize", {"width": width, "height": height}]))
    return ProtocolConsole(socket, width, height)


def openssl_cert(directory: Path) -> tuple[Path, Path] | None:
    """A self-signed certificate for 127.0.0.1, made with the openssl command (None without it)."""
    if shutil.which("openssl") is None:
        return None
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key
