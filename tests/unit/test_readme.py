"""The README stays a five-minute read: at most 1,000 words, every topic past that in docs/.

Words are counted as `wc -w` counts them: every run of characters between whitespace, in
prose, code blocks, tables and link targets alike.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_WORDS = 1000


def test_the_readme_has_at_most_1000_words() -> None:
    words = len(README.read_text(encoding="utf-8").split())
    assert words <= MAX_WORDS, f"README.md has {words} words; move the detail into docs/"


def test_every_docs_link_of_the_readme_is_a_file() -> None:
    targets = re.findall(r"\]\((docs/[^)#\s]+)", README.read_text(encoding="utf-8"))
    assert "docs/getting-started.md" in targets and "docs/console.md" in targets
    missing = sorted({t for t in targets if not (ROOT / t).is_file()})
    assert missing == []


def test_the_first_job_runs_every_step() -> None:
    """DSN, migrate, a handler, a worker, an enqueue and the console, in that order."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Your first job on your own PostgreSQL", 1)[1].split("\n## ", 1)[0]
    steps = ["export JOBTUI_DSN=", "jobtui migrate", "@jobs.handler(", "jobtui worker --app", "jobtui enqueue"]
    steps.append("`jobtui` opens the console")
    places = [section.find(step) for step in steps]
    assert -1 not in places, dict(zip(steps, places, strict=True))
    assert places == sorted(places)
