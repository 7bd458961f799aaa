"""Every statement jobtui/ names exists in jobtui/kernel/sql/, and every statement there is used.

A name is checked where the code writes it out: the first argument of `Call("name", ...)` and
the key of `statements(schema)["name"]` (or of a variable holding `statements(...)`). A
statement counts as used when its name is a string anywhere in jobtui/ (some are passed around
before a `Call` is made of them), or matches an f-string given to `Call` (`bulk_{action}_batch`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from jobtui.kernel.db import parse_statements, query_names

PACKAGE = Path(__file__).resolve().parents[2] / "jobtui"


def _called(node: ast.AST, name: str) -> bool:
    """Whether `node` is a call of a function or method named `name`."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == name) or (isinstance(func, ast.Attribute) and func.attr == name)


def named_statements(source: str) -> list[tuple[int, str]]:
    """(line, name) of each statement name the source writes out in a Call or a statements lookup."""
    tree = ast.parse(source)
    holders = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _called(node.value, "statements")
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if _called(node, "Call") and isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((node.lineno, first.value))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
            holder = node.value
            if isinstance(key, str) and (
                _called(holder, "statements") or (isinstance(holder, ast.Name) and holder.id in holders)
            ):
                found.append((node.lineno, key))
    return found


def used_names(source: str) -> tuple[set[str], list[re.Pattern[str]]]:
    """The strings of the source, and the patterns of the f-strings it gives to `Call`."""
    tree = ast.parse(source)
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    patterns = []
    for node in ast.walk(tree):
        if not (_called(node, "Call") and isinstance(node, ast.Call) and node.args):
            continue
        first = node.args[0]
        if isinstance(first, ast.JoinedStr):
            parts = [re.escape(str(part.value)) if isinstance(part, ast.Constant) else r"\w+" for part in first.values]
            patterns.append(re.compile("".join(parts)))
    return strings, patterns


def sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_statement_named_in_the_code_exists() -> None:
    known = set(query_names())
    missing = [
        f"{path}:{line}: {name!r}"
        for path, text in sources().items()
        for line, name in named_statements(text)
        if name not in known
    ]
    assert missing == [], "statements named but defined in no file of jobtui/kernel/sql/:\n" + "\n".join(missing)


def test_every_statement_is_used() -> None:
    strings: set[str] = set()
    patterns: list[re.Pattern[str]] = []
    for text in sources().values():
        found, made = used_names(text)
        strings |= found
        patterns += made
    unused = [n for n in query_names() if n not in strings and not any(p.fullmatch(n) for p in patterns)]
    assert unused == [], "statements of jobtui/kernel/sql/ that nothing in jobtui/ uses: " + ", ".join(unused)


def test_the_checks_find_a_misspelt_name() -> None:
    source = (
        "stmts = statements(schema)\n"
        'run(conn, Call("db_nwo", {}, decode))\n'
        'cur.execute(stmts["claim_sesion"])\n'
        'cur.execute(statements()["listen"])\n'
        'Call(f"bulk_{action}_batch", params, decode)\n'
    )
    assert named_statements(source) == [(2, "db_nwo"), (3, "claim_sesion"), (4, "listen")]
    strings, patterns = used_names(source)
    assert "listen" in strings and "db_now" not in strings
    assert [p.fullmatch("bulk_requeue_batch") is not None for p in patterns] == [True]


def test_a_name_defined_in_two_files_is_an_error() -> None:
    files = {"sql/a.sql": "-- name: one\nSELECT 1;\n", "sql/b.sql": "-- x\n\n-- name: one\nSELECT 2;\n"}
    with pytest.raises(RuntimeError, match=r"sql/b\.sql defines statement 'one', which sql/a\.sql defines already"):
        parse_statements(files)
    assert parse_statements({**files, "sql/b.sql": "-- name: two\nSELECT 2;\n"}) == {
        "one": "SELECT 1;",
        "two": "SELECT 2;",
    }
