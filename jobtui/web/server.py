"""The web server of `jobtui serve` (aiohttp): sign-in, sign-out, the console's page and its
WebSocket, each WebSocket bridged to a console process of its own (`bridge.py`).

What it refuses: any page but sign-in without a live session; a WebSocket or a form sent from
a page of another origin (the Origin header, which a browser always sets and a page cannot
forge); a console past `max_sessions`. What the browser may send down a console's socket is
keys, mouse and sizes, nothing else (`bridge.py`); whether a key may change the queue is the
console's own read-only mode, set for every user who is not an operator.

A link may name the view the console starts on (`/?open=workers`, kernel/views.py): it is
carried through the sign-in, and given to the console as `--open`, checked, never as text of
the command line otherwise; the user's role is the user's, whatever the link.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote as urlquote

from aiohttp import WSMsgType, web

from jobtui.kernel.domain import DEFAULT_SCHEMA
from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import line, quote, shorten
from jobtui.kernel.views import OpenView, parse_view
from jobtui.web import pages
from jobtui.web.bridge import MAX_CELLS, MAX_INPUT, ConsoleProcess
from jobtui.web.presence import Registered
from jobtui.web.sessions import Session, Sessions, SignInThrottle
from jobtui.web.users import MAX_PASSWORD, NAME, UsersFile, unknown_user_hash

log = logging.getLogger("jobtui.serve")

FAILED_PAUSE = 1.0  # seconds every failed sign-in waits for its answer
HASHES_AT_ONCE = 2  # password checks run at once: each takes 64 MiB for ~0.1 s
SWEEP_EVERY = 2.0  # seconds between looks for idle sessions and changed users
CLOSE_SIGNED_OUT = 4001  # the close code of a console whose session ended
CLOSE_FULL = 4002  # the close code of a console refused for the limit of consoles
HOST = re.compile(r"[A-Za-z0-9.\-]+(:\d{1,5})?|\[[0-9A-Fa-f:.]+\](:\d{1,5})?")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def textual_serve_static() -> Path:
    """The browser's terminal client (textual.js with xterm.js), its stylesheet and fonts."""
    import textual_serve

    return Path(textual_serve.__file__).resolve().parent / "static"


@dataclass(frozen=True)
class ServeConfig:
    dsn: str
    users: UsersFile
    console_options: list[str]  # the jobtui options of every console: schema, thresholds
    read_only: bool = False  # every console read-only, operators' too (`jobtui --read-only serve`)
    tls: bool = False
    trusted_proxies: tuple[Network, ...] = ()
    origin: str | None = None  # the address users open, when the Host header is not it
    max_sessions: int = 10
    idle_timeout: float = 900.0
    python: str = sys.executable
    schema: str = DEFAULT_SCHEMA  # where its row in the fleet goes
    pooler: str | None = None


@dataclass(eq=False)
class OpenConsole:
    socket: web.WebSocketResponse
    process: ConsoleProcess
    session: Session
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def close(self, code: int, why: str) -> None:
        with contextlib.suppress(Exception):
            await self.socket.close(code=code, message=why.encode("utf-8")[:120])


class WebConsole:
    """The application: `app()` builds the aiohttp app; `open` holds the consoles open."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.sessions = Sessions(config.idle_timeout)
        self.throttle = SignInThrottle()
        self.open: set[OpenConsole] = set()
        self._hashing = asyncio.Semaphore(HASHES_AT_ONCE)
        self._opened = 0  # consoles opened, to name each in the log
        self._sweeper: asyncio.Task[None] | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._headers], client_max_size=16 * 1024)
        app.add_routes(
            [
                web.get("/", self.console_page),
                web.get("/login", self.sign_in_page),
                web.post("/login", self.sign_in),
                web.post("/logout", self.sign_out),
                web.get("/ws", self.console_socket),
                web.get("/ws/{view}", self.console_socket),
                web.get("/jobtui.css", _text(pages.STYLE, "text/css")),
                web.get("/jobtui.js", _text(pages.SCRIPT, "text/javascript")),
                web.get("/favicon.ico", _no_content),
                web.static("/static", textual_serve_static(), show_index=False, follow_symlinks=False),
            ]
        )
        app.on_startup.append(self._start_sweeper)
        app.on_shutdown.append(self._close_all)
        app.on_cleanup.append(self._kill_all)
        return app

    # -- what a request says about itself ---------------------------------------------------

    def _from_proxy(self, request: web.Request) -> bool:
        try:
            peer = ipaddress.ip_address(request.remote or "")
        except ValueError:
            return False
        return any(peer in net for net in self.config.trusted_proxies)

    def client(self, request: web.Request) -> str:
        """The client's address: the peer's, or the one a trusted proxy says it forwards for."""
        forwarded = request.headers.get("X-Forwarded-For", "")
        if forwarded and self._from_proxy(request):
            return line(shorten(forwarded.split(",")[-1].strip(), 64))
        return request.remote or "?"

    def https(self, request: web.Request) -> bool:
        if self.config.tls:
            return True
        return self._from_proxy(request) and request.headers.get("X-Forwarded-Proto", "").lower() == "https"

    def origin(self, request: web.Request) -> str:
        """The origin of this server's pages, as the browser names it."""
        if self.config.origin:
            return self.config.origin
        return f"{'https' if self.https(request) else 'http'}://{request.host}".lower()

    def same_origin(self, request: web.Request) -> bool:
        return request.headers.get("Origin", "").lower() == self.origin(request)

    def cookie_name(self, request: web.Request) -> str:
        # __Host-: a browser keeps it only from a secure page, for this host alone, on path /.
        return "__Host-jobtui" if self.https(request) else "jobtui"

    def session(self, request: web.Request) -> Session | None:
        return self.sessions.get(request.cookies.get(self.cookie_name(request)))

    @web.middleware
    async def _headers(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if not HOST.fullmatch(request.host):
            raise web.HTTPBadRequest(text="bad Host header")
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # redirects and refusals: the same headers
            self._add_headers(request, exc)
            raise
        self._add_headers(request, response)
        return response

    def _add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        if response.prepared:  # a WebSocket, ended: its headers went with the handshake
            return
        ws_origin = ("wss://" if self.https(request) else "ws://") + self.origin(request).split("://", 1)[1]
        for name, value in pages.security_headers(websocket_origin=ws_origin, tls=self.https(request)).items():
            if name == "Cache-Control" and request.path.startswith("/static/"):
                continue  # the client's files may be cached
            response.headers.setdefault(name, value)
        response.headers["Server"] = "jobtui"

    # -- signing in and out -----------------------------------------------------------------

    async def sign_in_page(self, request: web.Request) -> web.StreamResponse:
        view = linked_view(request.query.get("open"))
        if self.session(request) is not None:
            raise web.HTTPSeeOther(console_url(view))
        note = "Signed out." if "out" in request.query else ""
        return _html(pages.sign_in_page(note=note, view=view.text if view else ""))

    async def sign_in(self, request: web.Request) -> web.StreamResponse:
        if not self.same_origin(request):
            log.warning("sign-in refused from %s: a form of another origin", self.client(request))
            raise web.HTTPForbidden(text="this form comes from another site")
        form = await request.post()
        name = str(form.get("name", "")).strip()[:64]  # no user's name is longer (users.NAME)
        password = str(form.get("password", ""))
        view = linked_view(str(form.get("open", "")) or None)
        address = self.client(request)
        keys = (f"name:{name}", f"address:{address}")
        async with self._hashing:
            # Asked only once this attempt's turn comes, so that attempts sent at once all
            # meet the failures of the ones before them.
            wait = self.throttle.wait(*keys)
            if wait > 0:
                log.warning("sign-in as %s from %s refused unchecked: %.0fs to wait", quote(name), address, wait)
                return _html(
                    pages.sign_in_page(
                        error=f"Too many failed sign-ins: try again in {wait:.0f} s.",
                        name=name,
                        view=view.text if view else "",
                    ),
                    status=429,
                    headers={"Retry-After": str(max(1, round(wait)))},
                )
            user, failures = None, 0
            if NAME.fullmatch(name) and len(password) <= MAX_PASSWORD:
                user = await asyncio.to_thread(self.config.users.verify, name, password)
            if user is None:
                failures = self.throttle.failed(*keys)
        if user is None:
            log.warning("failed sign-in as %s from %s (%d in a row)", quote(name), address, failures)
            await asyncio.sleep(FAILED_PAUSE)
            return _html(
                pages.sign_in_page(error="Wrong name or password.", name=name, view=view.text if view else ""),
                status=401,
            )
        self.throttle.succeeded(*keys)
        token, session = self.sessions.create(user)
        log.info("%s signed in from %s as %s", quote(user.name), address, self.role(session))
        response = web.HTTPSeeOther(console_url(view))
        response.set_cookie(
            self.cookie_name(request), token, httponly=True, samesite="Strict", secure=self.https(request), path="/"
        )
        return response

    async def sign_out(self, request: web.Request) -> web.StreamResponse:
        if not self.same_origin(request):
            raise web.HTTPForbidden(text="this form comes from another site")
        session = self.session(request)
        if session is not None:
            self.sessions.end(session)
            log.info("%s signed out from %s", quote(session.user), self.client(request))
            await self._close_consoles(session, "signed out")
        response = web.HTTPSeeOther("/login?out")
        response.del_cookie(self.cookie_name(request), path="/")
        return response

    def role(self, session: Session) -> str:
        return "operator" if session.operator and not self.config.read_only else "viewer"

    # -- the console ------------------------------------------------------------------------

    async def console_page(self, request: web.Request) -> web.StreamResponse:
        asked = request.query.get("open")
        view = linked_view(asked)
        session = self.session(request)
        if session is None:
            raise web.HTTPSeeOther("/login" + (f"?open={urlquote(view.text, safe='')}" if view else ""))
        self.sessions.touch(session)
        ws_url = ("wss://" if self.https(request) else "ws://") + self.origin(request).split("://", 1)[1] + "/ws"
        if view is not None:
            ws_url += "/" + urlquote(view.text, safe="")
        size = _whole(request.query.get("fontsize"), 16, 8, 40)
        note = f"the link's view {quote(asked)} is not one the console has" if asked and view is None else ""
        page = pages.console_page(
            user=session.user, role=self.role(session), websocket_url=ws_url, font_size=size, note=note
        )
        return _html(page)

    def console_command(self, session: Session, view: OpenView | None = None) -> list[str]:
        """The console of `jobtui`, as this user gets it: acting as them, read-only unless an
        operator, on the view a link named."""
        argv = [self.config.python, "-m", "jobtui.cli.webconsole", *self.config.console_options]
        argv += ["--actor", f"web:{session.user}"]
        if view is not None:
            argv += ["--open", view.text]
        if self.role(session) != "operator":
            argv.append("--read-only")
        return argv

    def console_environment(self, session: Session) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "ROWS", "TEXTUAL")}
        env.update(
            JOBTUI_DSN=self.config.dsn,  # not on the command line, where `ps` would show a password
            TEXTUAL_DRIVER="textual.drivers.web_driver:WebDriver",
            TEXTUAL_COLOR_SYSTEM="truecolor",
            TERM_PROGRAM="jobtui-serve",
            PGAPPNAME=f"jobtui serve {session.user}",  # pg_stat_activity names whose console it is
        )
        return env

    async def console_socket(self, request: web.Request) -> web.StreamResponse:
        session = self.session(request)
        if session is None:
            log.warning("console refused to %s: no live session", self.client(request))
            raise web.HTTPForbidden(text="sign in first")
        if not self.same_origin(request):
            log.warning(
                "console refused to %s from %s: Origin %s is not %s",
                quote(session.user),
                self.client(request),
                quote(request.headers.get("Origin", "")),
                self.origin(request),
            )
            raise web.HTTPForbidden(text="a console opens only from this server's own page")
        self.sessions.touch(session)
        socket = web.WebSocketResponse(heartbeat=30.0, max_msg_size=4 * MAX_INPUT + 1024)
        await socket.prepare(request)
        if len(self.open) >= self.config.max_sessions:
            log.warning("console refused to %s: %d consoles are open", quote(session.user), len(self.open))
            await socket.send_bytes(
                f"\r\njobtui serve: {len(self.open)} consoles are open, the most this server runs at once"
                " (--max-sessions). Close one, then open this one again.\r\n".encode()
            )
            await socket.close(code=CLOSE_FULL, message=b"too many consoles")
            return socket
        self._opened += 1
        label = f"{quote(session.user)} #{self._opened}"
        view = linked_view(request.match_info.get("view"))
        process = ConsoleProcess(
            self.console_command(session, view), self.console_environment(session), send=socket.send_bytes, label=label
        )
        console = OpenConsole(socket, process, session)
        self.open.add(console)
        session.consoles.add(console)
        width = _whole(request.query.get("width"), 80, 1, MAX_CELLS)
        height = _whole(request.query.get("height"), 24, 1, MAX_CELLS)
        runner = asyncio.create_task(self._run_then_close(console, width, height))
        try:
            async for message in socket:
                if message.type != WSMsgType.TEXT:
                    continue
                was_input, reply = await process.from_browser(message.data)
                if was_input:
                    self.sessions.touch(session)
                if reply is not None:
                    await socket.send_str(reply)
        finally:
            await asyncio.shield(self._end(console, runner))
        return socket

    async def _run_then_close(self, console: OpenConsole, width: int, height: int) -> None:
        process = console.process
        try:
            await process.run(width, height)
        finally:
            if not process.started.is_set():
                why = process.why_not or "it ended at once"
                with contextlib.suppress(Exception):
                    await console.socket.send_bytes(f"\r\njobtui serve: the console did not start: {why}\r\n".encode())
            await console.close(1000, "console ended")

    async def _end(self, console: OpenConsole, runner: asyncio.Task[None]) -> None:
        await console.process.stop()
        with contextlib.suppress(Exception):
            await runner
        self.open.discard(console)
        console.session.consoles.discard(console)

    async def _close_consoles(self, session: Session, why: str) -> None:
        await asyncio.gather(*(c.close(CLOSE_SIGNED_OUT, why) for c in list(session.consoles)))

    # -- the server's own upkeep ------------------------------------------------------------

    async def _start_sweeper(self, app: web.Application) -> None:
        await asyncio.to_thread(unknown_user_hash)  # made now, so the first wrong name costs no more
        self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        every = max(0.2, min(SWEEP_EVERY, self.config.idle_timeout / 4))
        while True:
            await asyncio.sleep(every)
            for session in self.sessions.idle():
                log.info("%s signed out: idle for %.0fs", quote(session.user), self.config.idle_timeout)
                await self._close_consoles(session, "signed out: idle")
            try:
                users = await asyncio.to_thread(self.config.users.load)
            except Exception as exc:  # a file being edited by hand: the next sweep reads it again
                log.error("cannot read the users file: %s", line(str(exc)))
                continue
            for session in self.sessions.not_in(users):
                log.info("%s signed out: removed from the users file, or its role changed", quote(session.user))
                await self._close_consoles(session, "signed out: the user changed")

    async def _close_all(self, app: web.Application) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        await asyncio.gather(*(c.close(1001, "the server is stopping") for c in list(self.open)))
        await asyncio.gather(*(c.process.stop() for c in list(self.open)), return_exceptions=True)

    async def _kill_all(self, app: web.Application) -> None:
        for console in list(self.open):
            pid = console.process.pid
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, 9)


def linked_view(text: str | None) -> OpenView | None:
    """The view a link names (`?open=`), or None for none or one the console does not have."""
    if not text:
        return None
    try:
        return parse_view(text[:256])
    except InvalidInput:
        return None


def console_url(view: OpenView | None) -> str:
    return "/" if view is None else f"/?open={urlquote(view.text, safe='')}"


def _html(text: str, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8", headers=headers)


def _text(body: str, content_type: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(text=body, content_type=content_type, charset="utf-8")

    return handler


async def _no_content(request: web.Request) -> web.StreamResponse:
    return web.Response(status=204)


def _whole(text: str | None, default: int, low: int, high: int) -> int:
    try:
        value = int(text) if text is not None else default
    except ValueError:
        return default
    return min(high, max(low, value))


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context of TLS 1.2 or newer, from PEM files."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


async def serve(
    config: ServeConfig, host: str, port: int, context: ssl.SSLContext | None, ready: Callable[[str], None]
) -> None:
    """Serve until SIGINT or SIGTERM; `ready` gets the address, once it listens."""
    import signal

    console = WebConsole(config)
    runner = web.AppRunner(console.app(), access_log=None, handle_signals=False, shutdown_timeout=15.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context)
    await site.start()
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
    url = f"{'https' if context is not None else 'http'}://{shown}:{bound[1]}/"
    ready(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    in_fleet = Registered(config.dsn, config.schema, config.pooler, lambda: len(console.open), stop, url)
    registering = asyncio.create_task(in_fleet.run(), name="jobtui-fleet")
    try:
        await stop.wait()
        log.info("stopping: closing %d console(s)", len(console.open))
    finally:
        registering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await registering
        await in_fleet.leave()
        await runner.cleanup()
