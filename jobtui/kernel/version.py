"""The version of jobtui that runs here, as its package was installed. Standard library only."""

from __future__ import annotations

from functools import cache


@cache
def installed_version() -> str:
    """The installed distribution's version (what `pip` installed); `unknown` for a source
    tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jobtui")
    except PackageNotFoundError:
        return "unknown"
