"""The package's own files: `jobtui --version` from the installed metadata, py.typed and the
license shipped. (.ci/package_smoke.sh builds, checks, installs and runs the wheel itself.)"""

from __future__ import annotations

import re
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


def test_the_changelog_has_a_section_per_release_with_its_upgrade_notes() -> None:
    """The newest section is this version; each release after the first says how to upgrade
    from the one before it; no changes wait in an unnamed section."""
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\d+\.\d+\.\d+)(?: \((\d{4}-\d{2}-\d{2})\))?$", text, re.M)
    headings = re.findall(r"^## .*$", text, re.M)
    assert len(releases) == len(headings), headings
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert releases[0][0] == project["version"]
    assert ("0.2.0", "2026-12-01") in releases
    versions = [v for v, _ in releases]
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for section, older in zip(sections, versions[1:], strict=False):
        assert f"### Upgrading from {older}\n" in section, f"## {section.splitlines()[0]} has no upgrade notes"
