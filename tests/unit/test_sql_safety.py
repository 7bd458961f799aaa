"""Nothing interpolates input into SQL: every query that jobtui's code executes is a literal,
a psycopg.sql composition (identifiers quoted by psycopg), or a named statement of
jobtui/kernel/sql/ (`statements(schema)[name]`); values always travel as bound parameters.

The check reads the source (AST) of every module of the package: the query argument of each
execute / executemany / copy / stream call must be one of those forms. f-strings, %-formatting,
`+` concatenation and str.format are reported, with file and line, and so is anything the check
cannot trace to a safe form, unless it is in REVIEWED with the reason it is safe.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "jobtui"
QUERY_METHODS = {"execute", "executemany", "copy", "stream"}
COMPOSITION_TYPES = ("SQL", "Composed", "Composable")  # annotations of parameters holding a query
SAFE_PARTS = {"Identifier", "Literal", "Placeholder"}  # psycopg.sql parts that quote what they hold

# Queries the check cannot trace, each read by a person: (file, query source) -> why it is safe.
REVIEWED = {
    ("migrate.py", "migration.text(schema).encode()"): (
        "a migration file shipped in the package; the only substitution is the schema name, "
        "validated by check_schema_name and double-quoted"
    ),
    ("migrate.py", "build.plain(schema).encode()"): (
        "the same index build with CONCURRENTLY taken out (IndexBuild.plain), for a small table"
    ),
    ("migrate.py", "build.text(schema).encode()"): (
        "an index build of a migration file shipped in the package (migrate._builds parsed it); the only"
        " substitution is the schema name, validated by check_schema_name and double-quoted"
    ),
}

Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Module


@dataclass(frozen=True)
class Offender:
    path: str
    line: int
    query: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.query}  <- {self.why}"


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _is_literal(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and isinstance(expr.value, (str, bytes))


class Scanner:
    def __init__(self, tree: ast.Module) -> None:
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def scope(self, node: ast.AST) -> Scope:
        while not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            node = self.parents[node]
        return node

    def assigned(self, name: str, scope: Scope) -> list[ast.expr] | None:
        """What `name` may hold in `scope`: the values assigned to it; None when it is a
        parameter annotated as a psycopg.sql composition (typed: mypy checks the callers)."""
        if not isinstance(scope, ast.Module):
            for arg in [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]:
                if arg.arg == name:
                    annotation = ast.unparse(arg.annotation) if arg.annotation else ""
                    return None if any(t in annotation for t in COMPOSITION_TYPES) else []
        values: list[ast.expr] = []
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                values.append(node.value)
        return values

    def unsafe(self, expr: ast.expr, scope: Scope, depth: int = 0) -> str | None:
        """None when `expr` is a safe query; otherwise why it is not (or may not be)."""
        if depth > 6:
            return "cannot trace where it comes from"
        if _is_literal(expr):
            return None
        if isinstance(expr, ast.JoinedStr):
            return "an f-string"
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
            return "a %-formatted string"
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return "a + concatenation"
        if isinstance(expr, ast.Name):
            values = self.assigned(expr.id, scope)
            if values is None:
                return None
            if not values:
                return f"{expr.id!r} is not traced to a safe query in its function"
            for value in values:
                why = self.unsafe(value, scope, depth + 1)
                if why:
                    return f"{expr.id!r} holds {why}"
            return None
        if isinstance(expr, ast.Subscript):
            return self.unsafe_statements(expr.value, scope, depth + 1)
        if isinstance(expr, ast.Call):
            return self.unsafe_call(expr, scope, depth)
        return f"a {type(expr).__name__} expression"

    def unsafe_statements(self, expr: ast.expr, scope: Scope, depth: int) -> str | None:
        """None when `expr` is `statements(...)` (or a name bound only to it)."""
        if isinstance(expr, ast.Call) and _name(expr.func) == "statements":
            return None
        if isinstance(expr, ast.Name):
            values = self.assigned(expr.id, scope) or []
            if values and all(self.unsafe_statements(v, scope, depth + 1) is None for v in values):
                return None
        return "a lookup in something other than statements(...)"

    def unsafe_call(self, call: ast.Call, scope: Scope, depth: int) -> str | None:
        func, name = call.func, _name(call.func)
        if name == "SQL":
            if len(call.args) == 1 and not call.keywords and _is_literal(call.args[0]):
                return None
            return "sql.SQL() of something other than a literal"
        if name in ("format", "join") and isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Constant):
                return f"str.{name}() of a string"
            why = self.unsafe(func.value, scope, depth + 1)
            if why:
                return why
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                why = self.unsafe_part(arg, scope, depth + 1)
                if why:
                    return why
            return None
        if name == "encode" and isinstance(func, ast.Attribute):
            return self.unsafe(func.value, scope, depth + 1)
        return f"built by {ast.unparse(func)}()"

    def unsafe_part(self, expr: ast.expr, scope: Scope, depth: int) -> str | None:
        """None when `expr` may be formatted into a composition: a quoting part, or a safe query."""
        if isinstance(expr, ast.Call) and _name(expr.func) in SAFE_PARTS:
            return None
        if isinstance(expr, ast.Name):
            values = self.assigned(expr.id, scope)
            if values is None:
                return None
            if values and all(self.unsafe_part(v, scope, depth + 1) is None for v in values):
                return None
        if isinstance(expr, (ast.List, ast.Tuple)):
            return next((w for e in expr.elts if (w := self.unsafe_part(e, scope, depth + 1))), None)
        if isinstance(expr, ast.GeneratorExp | ast.ListComp):
            return self.unsafe_part(expr.elt, scope, depth + 1)
        if _is_literal(expr):
            return "a plain string formatted into a composition (wrap it in sql.SQL or sql.Identifier)"
        return self.unsafe(expr, scope, depth)


def scan(source: str, path: str) -> list[Offender]:
    """The execute-like calls of `source` whose query is not shown to be safe."""
    tree = ast.parse(source)
    scanner = Scanner(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _name(node.func) in QUERY_METHODS):
            continue
        query = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "query"), None)
        if query is None or (Path(path).name, ast.unparse(query)) in REVIEWED:
            continue
        why = scanner.unsafe(query, scanner.scope(node))
        if why:
            found.append(Offender(path, node.lineno, ast.unparse(query), why))
    return found


def test_no_query_in_jobtui_is_built_from_strings() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 10
    offenders = [o for m in modules for o in scan(m.read_text(encoding="utf-8"), str(m.relative_to(PACKAGE.parent)))]
    assert not offenders, "queries built from strings:\n" + "\n".join(map(str, offenders))


def test_the_reviewed_exceptions_still_exist() -> None:
    for path, query in REVIEWED:
        assert query in (PACKAGE / "kernel" / path).read_text(encoding="utf-8"), (path, query)


UNSAFE = """
def f(conn, cur, user, schema, table):
    conn.execute(f"SELECT * FROM job WHERE type = '{user}'")
    cur.execute("SELECT * FROM job WHERE type = '%s'" % user)
    conn.execute("SELECT * FROM " + table)
    conn.execute("DELETE FROM {}.job".format(schema))
    query = f"DROP TABLE {table}"
    conn.execute(query)
    cur.executemany(query=("INSERT INTO t VALUES (" + user + ")"), params_seq=[])
    conn.execute(sql.SQL(f"SELECT {user}"))
    conn.execute(sql.SQL("SELECT {}").format(user))
    conn.execute(sql.SQL("SELECT {}").format(sql.SQL(user)))
    conn.execute(make_query(user))
    conn.execute(somewhere[user])
    cur.copy("COPY " + table + " FROM STDIN")
"""

SAFE = """
def f(conn, cur, user, schema, name, query: sql.Composable):
    conn.execute("SELECT * FROM job WHERE type = %s", (user,))
    conn.execute(b"SELECT 1")
    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("SELECT {} FROM t").format(sql.Literal(user)))
    conn.execute(sql.SQL(", ").join(sql.Identifier(c) for c in ["a", "b"]))
    cur.execute(statements(schema)[name], {"user": user})
    stmts = statements(schema)
    cur.execute(stmts["claim"], {})
    with cur.copy(stmts["copy_jobs"]) as copy:
        pass
    ident = sql.Identifier(schema)
    composed = sql.SQL("VACUUM {}.job").format(ident)
    conn.execute(composed)
    conn.execute(query, (1,))
    conn.execute("SELECT 1".encode())
"""


def test_the_check_finds_every_kind_of_interpolation() -> None:
    found = scan(UNSAFE, "example.py")
    assert [o.line for o in found] == [3, 4, 5, 6, *range(8, 16)]  # line 7 assigns, it does not execute
    reasons = [o.why for o in found]
    assert reasons[:4] == ["an f-string", "a %-formatted string", "a + concatenation", "str.format() of a string"]
    assert "'query' holds an f-string" in reasons


def test_the_check_accepts_the_safe_forms() -> None:
    assert scan(SAFE, "example.py") == []
