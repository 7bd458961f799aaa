"""A TCP proxy in front of the PostgreSQL server that a test can take down, the way a
network or a connection pooler fails:

* `cut()` resets every connection through it and refuses new ones until `restore()` (the
  server restarting, a proxy dying);
* `freeze()` stops moving bytes either way, leaving every connection open, and accepts new
  connections without answering them, until `thaw()` delivers what waited (a partition: the
  packets of a statement sent meanwhile arrive when it heals).

    with Proxy(server_dsn) as proxy:
        dsn = proxy.dsn(test_dsn)      # the same database, reached through the proxy
        proxy.cut(); ...; proxy.restore()
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo


def server_address(server_dsn: str) -> tuple[int, Any]:
    """The socket family and address of the server a DSN names (a Unix socket's directory,
    or a host)."""
    params = conninfo_to_dict(server_dsn)
    host = str(params.get("host") or "/var/run/postgresql")
    port = int(params.get("port") or 5432)
    if host.startswith("/"):
        return (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
    return (socket.AF_INET, (host, port))


class Proxy:
    def __init__(self, server_dsn: str, host: str = "127.0.0.1") -> None:
        """A proxy listening on `host` (an address of this machine) for the server of `server_dsn`."""
        self._target = server_address(server_dsn)
        self.host = host
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()

    # -- control ---------------------------------------------------------------------------

    def dsn(self, dsn: str) -> str:
        """`dsn` with its host and port replaced by the proxy's."""
        params = conninfo_to_dict(dsn)
        params.pop("hostaddr", None)
        return make_conninfo("", **{**params, "host": self.host, "port": str(self.port)})

    def cut(self) -> None:
        """Reset every connection and refuse new ones."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        if listener is not None:
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                # SO_LINGER 0: a reset, as a host that is gone answers.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with contextlib.suppress(OSError):
                # Wakes the pump blocked in recv() on it: a close alone leaves the connection
                # open until that call returns, and the server's session with it.
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def restore(self) -> None:
        """Accept connections again (on the same port)."""
        self._listen()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self.cut()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forwarding ------------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="proxy-accept", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut or closed
            threading.Thread(target=self._connect, args=(client,), name="proxy-conn", daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._flowing.wait()  # frozen: the client waits for an answer, as over a partition
        upstream = socket.socket(self._target[0], socket.SOCK_STREAM)
        try:
            upstream.connect(self._target[1])
        except OSError:
            client.close()
            return
        with self._lock:
            if self._listener is None or self._closed:
                client.close()
                upstream.close()
                return
            self._sockets |= {client, upstream}
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), name="proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
