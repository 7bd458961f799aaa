"""The package's own files: `jobtui --version` from the installed metadata, py.typed and the
license shipped. (.ci/package_smoke.sh builds, checks, installs and runs the wheel itself.)"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import jobtui

ROOT = Path(__file__).resolve().parents[2]


def test_version_comes_from_the_installed_metadata() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jobtui.cli", "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0 and result.stdout == f"jobtui {version('jobtui')}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert version("jobtui") == project["version"]


def test_typed_and_licensed() -> None:
    assert (Path(jobtui.__file__).parent / "py.typed").exists()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and "MIT License" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")
