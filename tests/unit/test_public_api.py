"""The public API the README and docs/getting-started.md show exists, and the core never
imports the console."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import jobtui
import jobtui.clients.aclient
import jobtui.clients.client

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"


def names_used(page: Path) -> set[str]:
    """`jobtui.X` and `jobtui.x(` as the page writes them."""
    return set(re.findall(r"\bjobtui\.([A-Z]\w*|[a-z_]+(?=\())", page.read_text(encoding="utf-8")))


def test_every_name_the_readme_uses_is_exported() -> None:
    names = names_used(README)
    assert {"Jobs", "Job", "Client", "AsyncClient", "NewJob", "Permanent", "Retry"} <= names
    missing = sorted(n for n in names if not hasattr(jobtui, n))
    assert missing == []


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        (jobtui, "Queue", jobtui.Client),
        (jobtui, "AsyncQueue", jobtui.AsyncClient),
        (jobtui.clients.client, "Queue", jobtui.Client),
        (jobtui.clients.aclient, "AsyncQueue", jobtui.AsyncClient),
    ],
)
def test_the_old_client_names_still_work_and_warn(module: object, old: str, new: type) -> None:
    # The clients' names of 0.2.0 are the same classes for one release: isinstance holds.
    with pytest.warns(DeprecationWarning, match=rf"\.{old} is deprecated.*use .*\.{new.__name__}$"):
        alias = getattr(module, old)
    assert alias is new
    assert old not in getattr(module, "__all__", ())


def test_the_old_client_names_import_and_type_check() -> None:
    with pytest.warns(DeprecationWarning, match="use jobtui.Client"):
        from jobtui import Queue
    with Queue("postgresql://localhost/app") as client:  # no connection before the first call
        assert isinstance(client, jobtui.Client)
    with pytest.raises(AttributeError, match="no attribute 'Queues'"):
        jobtui.Queues  # type: ignore[attr-defined]  # noqa: B018


def test_every_name_getting_started_uses_is_exported() -> None:
    names = names_used(GETTING_STARTED)
    assert {"Worker", "LeaseLost", "BackoffPolicy", "check_schema", "migrate_schema"} <= names
    missing = sorted(n for n in names if not hasattr(jobtui, n))
    assert missing == []


def loaded(imports: str, which: str) -> str:
    """The modules, of those the expression `which` (of `m`) picks, that `import IMPORTS`
    loads in a fresh interpreter, as a printed sorted list."""
    code = f"import sys, {imports}; print(sorted(m for m in sys.modules if {which}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_the_core_does_not_import_the_console() -> None:
    core = "jobtui, jobtui.worker, jobtui.core.scheduler, jobtui.reads.metrics, jobtui.cli"
    assert loaded(core, "m == 'textual' or m.startswith('textual.')") == "[]"


def test_the_web_server_runs_consoles_and_does_not_import_one() -> None:
    # `jobtui serve` serves the console as processes of their own; the server never loads Textual.
    server = "jobtui.cli.serve, jobtui.web.server"
    assert loaded(server, "m.startswith(('textual', 'jobtui.tui')) and m != 'textual_serve'") == "[]"
