"""The HTTP listener on a metrics port (`jobtui worker --metrics-port`, `jobtui scheduler
--metrics-port`, `jobtui metrics`), in threads of its own:

- /metrics: the Prometheus exposition; with a token (`--metrics-token-file`), only for a
  request that carries it as `Authorization: Bearer TOKEN`;
- /healthz: liveness, the process's event loop answers (health.py);
- /readyz: readiness, the database answers through the process's link, the schema fits, the
  process is not draining.

The probes stay open whatever the token, so an orchestrator needs no secret: they say only
whether the process is alive and ready, and why not. Every other path is 404.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from jobtui.kernel.errors import InvalidInput
from jobtui.kernel.safetext import quote
from jobtui.reads.health import Health, Verdict

METRICS_PATH = "/metrics"
LIVE_PATH = "/healthz"
READY_PATH = "/readyz"
# Every address, IPv6 and IPv4 alike where the host has IPv6 (as Prometheus exporters
# listen by default); else every IPv4 address.
EVERY_ADDRESS = None

_TOKEN = re.compile(r"[\x21-\x7e]{16,4096}")


def read_token(path: str) -> str:
    """The bearer token in the file at `path` (surrounding whitespace stripped), or one line
    saying what is wrong with it."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise InvalidInput(f"cannot read the metrics token file {quote(path)} ({why})") from None
    if not _TOKEN.fullmatch(token):
        raise InvalidInput(
            f"the metrics token file {quote(path)} must hold one token of 16 to 4096 printable ASCII characters"
            " without spaces, e.g. from `openssl rand -hex 32`"
        )
    return token


class Listener(ThreadingHTTPServer):
    """The listener: a thread per request, none of which keeps the process alive."""

    daemon_threads = True
    where = ""  # where it listens, for the start-up log line
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        family: socket.AddressFamily,
        registry: CollectorRegistry,
        token: str | None,
        health: Health | None,
    ) -> None:
        self.address_family = family
        self.registry = registry
        self.token = token
        self.health = health
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            # Dual stack: "::" takes IPv4 connections too, as ::ffff:a.b.c.d.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _Handler(BaseHTTPRequestHandler):
    server: Listener
    protocol_version = "HTTP/1.1"
    # A connection that sends nothing for this long is closed: each holds a thread.
    timeout = 30

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == METRICS_PATH:
            self._metrics()
        elif path in (LIVE_PATH, READY_PATH):
            health = self.server.health
            if health is None:
                self._send(404, f"{path} is served by workers and schedulers, not by `jobtui metrics`\n")
                return
            verdict: Verdict = health.live() if path == LIVE_PATH else health.ready()
            self._send(200 if verdict.ok else 503, verdict.text + "\n")
        else:
            self._send(404, f"not found: try {METRICS_PATH}, {LIVE_PATH} or {READY_PATH}\n")

    def _metrics(self) -> None:
        token = self.server.token
        if token is not None:
            given = self.headers.get("Authorization", "")
            scheme, _, credentials = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(credentials.strip().encode(), token.encode()):
                self._send(401, "/metrics needs the bearer token\n", {"WWW-Authenticate": 'Bearer realm="jobtui"'})
                return
        self._send(200, generate_latest(self.server.registry), {"Content-Type": CONTENT_TYPE_LATEST})

    def _send(self, status: int, body: str | bytes, headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        extra = {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        # Scrapes and probes come every few seconds: not for the process's log.
        return


def _family(addr: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET
    except ValueError:  # a host name: its first address decides
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        return infos[0][0]


def start(
    registry: CollectorRegistry,
    port: int,
    addr: str | None = EVERY_ADDRESS,
    *,
    token: str | None = None,
    health: Health | None = None,
    fix: str = "choose another --metrics-port or --metrics-addr",
) -> Listener:
    """Listen on `addr`:`port` (every address when None) in a background thread; returns the
    server (`shutdown()`, `server_close()`, and `where` it listens)."""
    if addr is None:
        tries = [("::", socket.AF_INET6), ("0.0.0.0", socket.AF_INET)] if socket.has_ipv6 else []
        tries = tries or [("0.0.0.0", socket.AF_INET)]
    else:
        try:
            tries = [(addr, _family(addr))]
        except (OSError, UnicodeError) as exc:
            raise InvalidInput(f"cannot serve metrics on {quote(addr)}: not an address of this host ({exc})") from None
    failure: OSError | None = None
    for host, family in tries:
        try:
            server = Listener((host, port), family, registry, token, health)
        except OSError as exc:  # port taken, no permission, address not on this host, no IPv6
            failure = exc
            if addr is None and exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue
            break
        server.where = _where(addr, server)
        threading.Thread(target=server.serve_forever, name="jobtui-endpoints", daemon=True).start()
        return server
    shown = f"{addr}:{port}" if addr is not None else f"every address, port {port}"
    why = (failure.strerror or str(failure)) if failure is not None else "no address to listen on"
    raise InvalidInput(f"cannot serve metrics on {shown} ({why}); {fix}")


def _where(addr: str | None, server: Listener) -> str:
    host, port = str(server.server_address[0]), int(server.server_address[1])
    if addr is None:
        return f"http://*:{port} (every address{', IPv6 and IPv4' if host == '::' else ''})"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def describe(server: Listener) -> str:
    """The start-up log line: where the listener is, and who may read what."""
    url, _, every = server.where.partition(" ")
    access = "bearer token required" if server.token else "open to anyone who can connect"
    note = f"{every[:-1]}; {access})" if every else f"({access})"
    probes = f", probes on {LIVE_PATH} and {READY_PATH}" if server.health is not None else ""
    return f"serving Prometheus metrics on {url}{METRICS_PATH} {note}{probes}"
