"""Every runtime statement lives in the files of jobtui/kernel/sql/, run through one layer (db.py).

String literals anywhere else in jobtui/ that read as SQL are a defect, except the migration
bootstrap (migrate.py creates the schema and the migration table before any named statement
can be read) and examples in docstrings.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "jobtui"
ALLOWED = {"migrate.py"}
SQL = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|SET|RESET|LISTEN|UNLISTEN|NOTIFY|CREATE|DROP|ALTER|TRUNCATE|COPY|"
    r"BEGIN|COMMIT|ROLLBACK|VACUUM|ANALYZE|GRANT|REVOKE|LOCK|EXPLAIN|PREPARE|DEALLOCATE)\b"
)  # upper case, as this project writes SQL: "delete a schedule" in a help text is English


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes (module, class and function docstrings)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def sql_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        if SQL.match(node.value) and len(node.value.split()) > 1:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value.strip()[:60]!r}")
    return found


def test_no_sql_outside_the_sql_folder() -> None:
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path.name not in ALLOWED for hit in sql_literals(path)]
    assert found == [], "SQL outside jobtui/kernel/sql/:\n" + "\n".join(found)


def test_the_check_finds_sql_where_it_is() -> None:
    # It would fail on the bootstrap it exempts: the check can see SQL.
    assert sql_literals(PACKAGE / "kernel" / "migrate.py")
