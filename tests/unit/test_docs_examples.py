"""docs/integrations.md shows each example of examples/ as the file is (the suite runs the
files themselves), and shows no example that is not a file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- example: (examples/[\w/.]+) -->\n```python\n(.*?)```\n", re.S)


def test_the_docs_show_the_examples_as_they_are() -> None:
    shown = BLOCK.findall((ROOT / "docs" / "integrations.md").read_text())
    assert len(shown) >= 7
    for path, text in shown:
        assert (ROOT / path).read_text() == text, f"docs/integrations.md shows an outdated {path}"


def test_every_example_script_is_shown() -> None:
    shown = {path for path, _ in BLOCK.findall((ROOT / "docs" / "integrations.md").read_text())}
    scripts = {str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.py")}
    assert scripts <= shown
