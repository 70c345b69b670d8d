"""The import graph of the toolkit and the engine, read from the source with `ast` (nothing is imported).

Every import counts, wherever it stands (module top, function body, `if TYPE_CHECKING`): a lazy
import still ties two packages together. The toolkit's packages form the layers below, each
importing only layers before it; no two modules of the toolkit import each other round a cycle; the
engine never imports the toolkit.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator, KeysView
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. "llmdeploy" is the package itself (its version; its stage names are bound lazily,
# by name, from `api`). Packages sharing a tuple are one layer and must not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("llmdeploy",),
    ("errors",),
    ("catalog",),
    ("recipe",),
    ("memory",),
    ("engines",),
    ("planner",),
    ("render",),
    ("smoke", "bench"),
    ("apply",),
    ("targets",),
    ("cli",),
    ("api", "__main__"),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path, folder: Path, package: str) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _graph(folder_name: str, package: str) -> dict[str, dict[str, int]]:
    """module -> {imported module of any package: first line}, for every module under the folder.
    `from package import submodule` is an edge to the submodule only (the package's own
    `__init__` runs first for any import below it, which ties nothing together)."""
    folder = ROOT / folder_name
    trees = {
        _module_name(p, folder, package): (p, ast.parse(p.read_text(), str(p)))
        for p in sorted(folder.rglob("*.py"))
    }
    graph: dict[str, dict[str, int]] = {}
    for module, (path, tree) in trees.items():
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            for target in _targets(node, module, path.name == "__init__.py", trees.keys()):
                edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def _targets(node: ast.AST, module: str, is_package: bool, modules: KeysView[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            parts = module.split(".")
            base = parts[: len(parts) - node.level + (1 if is_package else 0)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        submodules = [f"{source}.{alias.name}" for alias in node.names]
        yield from (name for name in submodules if name in modules)
        if not all(name in modules for name in submodules):
            yield source


def _toolkit() -> dict[str, dict[str, int]]:
    graph = _graph("llmdeploy", "llmdeploy")
    return {m: {t: line for t, line in edges.items() if t in graph} for m, edges in graph.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _where(module: str, line: int) -> str:
    path = module.replace(".", "/")
    return f"{path}/__init__.py:{line}" if (ROOT / path).is_dir() else f"{path}.py:{line}"


def test_every_toolkit_package_has_a_layer() -> None:
    packages = {_package(m) for m in _toolkit()}
    assert packages <= set(RANK), f"add these packages to LAYERS: {sorted(packages - set(RANK))}"


def test_toolkit_packages_import_only_lower_layers() -> None:
    bad = [
        f"{_where(module, line)}: {_package(module)} -> {_package(target)} ({module} imports {target})"
        for module, edges in _toolkit().items()
        for target, line in edges.items()
        if _package(module) != _package(target)
        and RANK.get(_package(target), -1) >= RANK.get(_package(module), len(LAYERS))
    ]
    assert not bad, "back-edges against the layer order:\n" + "\n".join(bad)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as its nodes in order (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def _show(cycle: list[str], edges: dict[str, dict[str, int]]) -> str:
    return "\n".join(f"{_where(a, edges[a][b])}: {a} -> {b}" for a, b in itertools.pairwise(cycle))


def test_no_package_cycle_in_the_toolkit() -> None:
    toolkit = _toolkit()
    packages: dict[str, set[str]] = {}
    witness: dict[tuple[str, str], tuple[str, str]] = {}
    for module, edges in toolkit.items():
        for target in edges:
            a, b = _package(module), _package(target)
            if a != b:
                packages.setdefault(a, set()).add(b)
                witness.setdefault((a, b), (module, target))
    cycle = _cycle(packages)
    if cycle is not None:
        lines = []
        for a, b in itertools.pairwise(cycle):
            module, target = witness[(a, b)]
            lines.append(f"{a} -> {b}: {_where(module, toolkit[module][target])} imports {target}")
        pytest.fail("package cycle:\n" + "\n".join(lines))


def test_no_module_cycle_in_the_toolkit() -> None:
    toolkit = _toolkit()
    cycle = _cycle({m: set(edges) - {m} for m, edges in toolkit.items()})
    assert cycle is None, "module cycle:\n" + _show(cycle or [], toolkit)


def test_no_cycle_between_the_engines_subpackages() -> None:
    """Subpackages of the engine (folders under engine/) never import each other round a cycle; its
    flat top-level modules count as the root, which every subpackage may use."""
    graph = _graph("engine", "llmdeploy_engine")

    def sub(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and (ROOT / "engine" / parts[1]).is_dir() else "(root)"

    packages: dict[str, set[str]] = {}
    witness: dict[tuple[str, str], str] = {}
    for module, edges in graph.items():
        for target, line in edges.items():
            a, b = sub(module), sub(target)
            if target in graph and a != b and "(root)" not in (a, b):
                packages.setdefault(a, set()).add(b)
                witness.setdefault((a, b), f"{module} imports {target} (line {line})")
    cycle = _cycle(packages)
    assert cycle is None, "engine package cycle:\n" + "\n".join(
        witness[(a, b)] for a, b in itertools.pairwise(cycle or [])
    )


def _engine_imports_of_the_toolkit() -> list[str]:
    return [
        f"engine: {module} imports {target} (line {line})"
        for module, edges in _graph("engine", "llmdeploy_engine").items()
        for target, line in edges.items()
        if target in _graph("llmdeploy", "llmdeploy")
    ]


def test_the_engine_never_imports_the_toolkit() -> None:
    found = _engine_imports_of_the_toolkit()
    assert not found, "the engine imports the toolkit (pydantic, PyYAML come with it):\n" + "\n".join(found)
