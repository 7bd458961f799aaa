"""The import graph of `jobtui/` follows docs/design.md, "Layers": every import points to the
same layer or one below it, and no modules import each other in a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "jobtui"

# From the bottom up, as docs/design.md lists them; a module not named here is a defect.
LAYERS: dict[str, tuple[str, ...]] = {
    "pure": (
        "domain",
        "errors",
        "backoff",
        "cronslots",
        "durations",
        "sizes",
        "donehistory",
        "safetext",
        "explain",
        "logformat",
        "rates",
        "forecast",
    ),
    "kernel": ("db", "link", "embedded"),
    "core": (
        "checks",
        "adapters",
        "queue",
        "audit",
        "actions",
        "bulk",
        "queues",
        "overview",
        "flows",
        "timers",
        "client",
        "aclient",
        "registry",
        "typed",
        "middleware",
        "otel",
        "scheduler",
        "maintenance",
        "backlog",
        "metrics",
        "joblists",
        "jobfilter",
        "jobquery",
        "migrate",
        "privileges",
        "health",
        "uninstall",
    ),
    "runtime": ("worker",),
    "edges": (
        "cli",
        "cli_args",
        "cli_run",
        "cli_ops",
        "cli_queues",
        "cli_search",
        "cli_bulk",
        "cli_serve",
        "cli_admin",
        "prometheus",
        "endpoints",
        "sdnotify",
        "demo",
        "sizing",
        "testing",
        "tui",
        "web",
    ),
}
RANK = {name: rank for rank, names in enumerate(LAYERS.values()) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The layer entry a module belongs to: `jobtui.worker.reaper` -> `worker`."""
    return module.split(".")[1] if "." in module else ""


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports(path: Path, *, top_level_only: bool) -> set[str]:
    """The jobtui modules `path` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("jobtui"):
                # `from . import metrics` imports a module; `from .db import run` a name of one
                submodules = {f"{target}.{a.name}" for a in node.names if is_module(f"{target}.{a.name}")}
                found.update(submodules if len(submodules) == len(node.names) else {target})
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("jobtui"))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    missing = {unit(module_name(p)) for p in SOURCES if module_name(p) != "jobtui"} - set(RANK)
    assert not missing, f"add these to LAYERS and to docs/design.md: {sorted(missing)}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_imports_point_down(path: Path) -> None:
    me = unit(module_name(path))
    if me == "":
        return  # the package's __init__ re-exports the public API from every layer below the edges
    upward = sorted(t for t in imports(path, top_level_only=False) if unit(t) and RANK[unit(t)] > RANK[me])
    assert not upward, f"{module_name(path)} ({me}) imports from a higher layer: {upward}"


def test_no_import_cycles() -> None:
    graph = {module_name(p): {t for t in imports(p, top_level_only=True) if t != module_name(p)} for p in SOURCES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
