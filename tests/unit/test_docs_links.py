"""Every relative link of README.md, docs/ and bench/ leads somewhere: the file exists, and an
anchor (`page.md#a-heading`, `#a-heading`) names a heading of that page as GitHub makes its
anchors (lower case; punctuation but `-` and `_` dropped; spaces to `-`; a repeated heading
gets `-1`, `-2`...)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "bench").rglob("*.md")])
PAGES = [p for p in PAGES if "node_modules" not in p.parts and ".peers-venv" not in p.parts]

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> list[tuple[int, str]]:
    """The lines of `text` outside fenced code blocks, with their numbers."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text.

    >>> slug("Queues, pauses and limits"), slug("stats --json on a backlog"), slug("The operator's commands")
    ('queues-pauses-and-limits', 'stats---json-on-a-backlog', 'the-operators-commands')
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in prose(page.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
        found += [(number, m.group(1)) for m in LINK.finditer(line)]
    return found


def broken(page: Path) -> list[str]:
    out = []
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            out.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{where} (no heading makes #{anchor} in {dest.relative_to(ROOT)})")
    return out


def test_the_pages_are_found() -> None:
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    assert {"README.md", "docs/design.md", "docs/operations.md", "bench/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_leads_somewhere(page: Path) -> None:
    assert not broken(page), "\n".join(broken(page))


def test_a_broken_link_and_a_broken_anchor_are_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## A heading, here\n\n[a](#a-heading-here) [b](#nowhere) [c](gone.md) [d](page.md#top)\n")
    assert [line.split(": ", 1)[1] for line in broken_at(page, tmp_path)] == [
        "#nowhere (no heading makes #nowhere in page.md)",
        "gone.md (no such file)",
    ]


def broken_at(page: Path, root: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, root
    try:
        return broken(page)
    finally:
        ROOT = saved
