"""The module import graph of a source tree, from every import statement, and its cycles.

``module_graph`` reads each ``.py`` file under the given top-level packages with
``ast`` and records an edge for every ``import`` and ``from ... import`` it holds,
at any depth (inside functions, ``if TYPE_CHECKING:`` blocks and ``try`` blocks
too): a lazy import still ties two modules together. ``import a.b`` and
``from a import b`` are an edge to the module ``a.b`` when it exists; a name that is
not a submodule (``from pkg import name``) is an edge to the package's
``__init__``. Relative imports are resolved against the importing module.
Imports of modules outside the tree (the standard library, third-party packages)
are kept as edges too, so a caller can check what a room reaches for; ``cycles``
only ever finds cycles among the tree's own modules.
"""

from __future__ import annotations

import ast
from pathlib import Path


def _module_name(root: Path, file: Path) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = (_resolve_relative(module, is_package, node.level, node.module) if node.level
                      else node.module or "")
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
    return found


def module_graph(root: Path, packages: list[str]) -> dict[str, set[str]]:
    """Every module of ``packages`` -> the modules its import statements name.

    A package is a folder under ``root`` ("core") or a path to one whose last part is its name
    ("library/rlmfamily": a distribution of its own, with its own project file)."""
    files: dict[str, Path] = {}
    for package in packages:
        folder = root / package
        for file in sorted(folder.rglob("*.py")):
            files[_module_name(folder.parent, file)] = file
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, file in files.items():
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        graph[module] = _imports(tree, module, file.name == "__init__.py", known)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module that imports itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def connect(start: str) -> None:
        nonlocal counter
        # Iterative, so a deep chain of imports cannot exhaust the recursion limit.
        work: list[tuple[str, list[str]]] = [(start, sorted(graph.get(start, ()) & graph.keys()))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            if targets:
                target = targets.pop()
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, sorted(graph.get(target, ()) & graph.keys())))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)
