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


# Ownership and naming. Each file of sql/ has exactly one module that owns it, named alike
# (`claims.sql` -> `claims.py`): the only module that writes out the names of its statements.
# Everyone else calls that module's functions; the commands of cli/ own no file at all.
SQL_FOLDER = PACKAGE / "kernel" / "sql"
OWNERS = {
    "actions": "core/actions.py",
    "audit": "core/audit.py",
    "bench": "core/bench.py",
    "bulk": "core/bulk.py",
    "claims": "core/claims.py",
    "db": "kernel/db.py",
    "console": "reads/console.py",
    "deadletters": "reads/deadletters.py",
    "fleet": "reads/fleet.py",
    "flows": "reads/flows.py",
    "history": "core/history.py",
    "jobfilter": "kernel/jobfilter.py",
    "joblists": "reads/joblists.py",
    "jobquery": "reads/jobquery.py",
    "jobs": "core/jobs.py",
    "maintenance": "core/maintenance.py",
    "members": "core/members.py",
    "metrics": "reads/metrics.py",
    "migrate": "kernel/migrate.py",
    "overview": "reads/overview.py",
    "payloadindex": "core/payloadindex.py",
    "privileges": "core/privileges.py",
    "queues": "core/queues.py",
    "scheduler": "core/scheduler.py",
    "server": "kernel/server.py",
    "uninstall": "core/uninstall.py",
    "why": "reads/why.py",
}
# TIMED's keys list the statements the timer guard measures: a registry of names, not calls.
REGISTRY = ("reads/timers.py", "TIMED")
# The naming rule: a file declares its noun once (`-- noun: claim`), and each of its named
# blocks (statements, and the fragments they share) is that noun, then what it does:
# `claim_take`, `claim_heartbeat`, `job_enqueue_keyed`. Nouns differ from file to file, so a
# name says which file, and so which module, it belongs to.
NOUN_LINE = re.compile(r"^-- noun: (\w+)\s*$", re.MULTILINE)
BLOCK_LINE = re.compile(r"^-- (?:name|fragment): (\w+)\s*$", re.MULTILINE)


def sql_files() -> dict[str, str]:
    """The text of each file of sql/, by its stem."""
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(SQL_FOLDER.glob("*.sql"))}


def file_of_statement() -> dict[str, str]:
    """Each statement's name -> the stem of the file that defines it."""
    return {name: stem for stem, text in sql_files().items() for name in parse_statements({stem: text})}


def registry_keys(tree: ast.AST) -> set[int]:
    """The ids of the key nodes of the registry's dict (see REGISTRY)."""
    return {
        id(key)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id == REGISTRY[1]
        for key in node.value.keys
        if key is not None
    }


def named_in(path: str, source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each string literal of `source` that is one of `names`."""
    tree = ast.parse(source)
    skip = registry_keys(tree) if path == REGISTRY[0] else set()
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
        if id(node) not in skip
    )


def misplaced(path: str, source: str, files: dict[str, str]) -> list[str]:
    """Where `source` (the module at `path` under jobtui/) names a statement it does not own."""
    return [
        f"{path}:{line}: {name!r} is a statement of sql/{files[name]}.sql: call {OWNERS.get(files[name], 'its owner')}"
        for line, name in named_in(path, source, set(files))
        if OWNERS.get(files[name]) != path
    ]


def test_every_sql_file_has_one_owner_named_alike() -> None:
    stems = set(sql_files())
    assert stems == set(OWNERS), (
        f"files without an owner: {sorted(stems - set(OWNERS))}; gone: {sorted(set(OWNERS) - stems)}"
    )
    for stem, owner in OWNERS.items():
        assert Path(owner).stem == stem, f"sql/{stem}.sql's owner is named {owner}"
        assert (PACKAGE / owner).is_file(), f"sql/{stem}.sql's owner {owner} does not exist"
        assert not owner.startswith("cli/"), f"a command owns sql/{stem}.sql: commands call core and reads"


def test_statements_are_named_only_by_their_owner() -> None:
    files = file_of_statement()
    found = [hit for path, text in sources().items() for hit in misplaced(path, text, files)]
    assert found == [], "statements named outside the module that owns their file:\n" + "\n".join(found)


def test_every_name_is_its_files_noun_then_what_it_does() -> None:
    nouns: dict[str, str] = {}
    bad = []
    for stem, text in sql_files().items():
        declared = NOUN_LINE.findall(text)
        assert len(declared) == 1, f"sql/{stem}.sql declares {len(declared)} nouns (`-- noun: NOUN`): one, please"
        noun = declared[0]
        assert noun not in nouns, f"sql/{stem}.sql and sql/{nouns[noun]}.sql declare the same noun {noun!r}"
        nouns[noun] = stem
        rule = re.compile(rf"{noun}(_[a-z0-9]+)+")
        bad += [f"sql/{stem}.sql: {name}" for name in BLOCK_LINE.findall(text) if not rule.fullmatch(name)]
    assert bad == [], "names that are not their file's noun then what they do:\n" + "\n".join(bad)


def test_the_ownership_check_finds_a_stranger() -> None:
    files = {"claim_take": "claims", "fleet_list": "fleet"}
    source = 'run(conn, Call("claim_take", {}, d))\nx = "fleet_list"\nTIMED = {"claim_take": "worker"}\n'
    assert misplaced("core/claims.py", source, files) == [
        "core/claims.py:2: 'fleet_list' is a statement of sql/fleet.sql: call reads/fleet.py"
    ]
    assert [hit.split(":")[1] for hit in misplaced("cli/run.py", source, files)] == ["1", "2", "3"]
    assert [hit.split(":")[1] for hit in misplaced("reads/timers.py", source, files)] == ["1", "2"]
