"""HTTP probes of a worker's or scheduler's metrics port, as an orchestrator asks them.

status, text = get(port, "/readyz")          # (503, "not ready: ...")
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(
    port: int, path: str, *, host: str = "127.0.0.1", token: str | None = None, timeout: float = 5
) -> tuple[int, str]:
    """(status, body) of GET http://host:port/path; (0, why) when nothing answers."""
    shown = f"[{host}]" if ":" in host else host
    request = urllib.request.Request(f"http://{shown}:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError as exc:
        return 0, str(getattr(exc, "reason", exc))


def connects(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect((host, port))
        except OSError:
            return False
        return True
