"""The layers of `jobtui/` are its folders, ranked from the bottom up by the table under
"Layers" in docs/design.md: every module lies in one of those folders, every import points
to its own layer or one below it, and no modules import each other in a cycle. The map is
the folders themselves, so it cannot drift from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jobtui"
DESIGN = ROOT / "docs" / "design.md"


def ranked_folders(design: str) -> dict[str, int]:
    """{folder: rank} from the first cell of each row of design.md's layer table, bottom first;
    folders named in one row share a rank."""
    section = design.split("### Layers", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {folder: rank for rank, row in enumerate(rows) for folder in re.findall(r"`(\w+)/`", row.split("|")[1])}


RANK = ranked_folders(DESIGN.read_text())
SOURCES = sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """The folder, and so the layer, a module lies in: `jobtui.worker.reaper` -> `worker`."""
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
                # `from jobtui.core import otel` imports a module; `from jobtui.kernel.db import run` a name of one
                submodules = {f"{target}.{a.name}" for a in node.names if is_module(f"{target}.{a.name}")}
                found.update(submodules if len(submodules) == len(node.names) else {target})
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("jobtui"))
    return found


def test_the_design_ranks_every_folder_of_the_package() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(RANK), (
        f"folders of jobtui/ not in docs/design.md's layer table: {sorted(folders - set(RANK))};"
        f" named there but not in jobtui/: {sorted(set(RANK) - folders)}"
    )


def test_every_module_lies_in_a_layer_folder() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"move these into the folder of their layer (docs/design.md, 'Layers'): {loose}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_imports_point_down(path: Path) -> None:
    me = layer(module_name(path))
    if me == "":
        return  # the package's __init__ re-exports the public API from every layer below the edges
    upward = sorted(t for t in imports(path, top_level_only=False) if layer(t) and RANK[layer(t)] > RANK[me])
    assert not upward, f"{module_name(path)} ({me}/) imports from a higher layer: {upward}"


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
