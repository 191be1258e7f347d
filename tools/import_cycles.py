"""Find import cycles in a package, counting every import statement in its source.

Reads the source with :mod:`ast` (nothing is imported or executed), so an import
inside a function, under ``if TYPE_CHECKING:``, in a ``try`` or a class body counts
like one at the top of the module: each one is a dependency somebody has to
reason about, and a cycle hidden in a function is still a cycle in the design.

The graph has one node per module of the package (``pkg/a/b.py`` is ``pkg.a.b``,
``pkg/a/__init__.py`` is ``pkg.a``) and an edge for each import of another module
of the package:

* ``import pkg.a.b`` and ``import pkg.a.b as c``: an edge to ``pkg.a.b``;
* ``from pkg.a import b``: to ``pkg.a.b`` when that is a module, else to ``pkg.a``
  (``b`` is a name defined in ``pkg/a/__init__.py``);
* relative imports (``from . import x``, ``from ..a import b``) resolve against
  the importing module's package first, then follow the rule above.

Importing ``pkg.a.b`` also runs ``pkg/a/__init__.py``; like import-linter, the
graph does not count that as an edge (else a package re-exporting its modules
would be in a cycle with each of them). Imports by computed name
(``importlib.import_module(f"...")``) are not seen.

A cycle is a strongly connected component of more than one module, or a module
that imports itself; each is reported with the import lines that form it.
``tests/unit/project/test_import_cycles.py`` runs this over ``trio_broker`` in CI. By hand::

    .venv/bin/python tools/import_cycles.py [PACKAGE_DIR]   # default: trio_broker
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One edge of the graph: ``importer`` imports ``imported`` at ``path:line``."""

    importer: str
    imported: str
    path: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}  ({self.importer} -> {self.imported})"


def modules(package_dir: Path) -> dict[str, Path]:
    """Every module of the package under ``package_dir`` by dotted name."""
    root = package_dir.parent
    found: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if all(part.isidentifier() for part in parts):
            found[".".join(parts)] = path
    return found


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement may refer to, candidates first."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:
        # A package's own __init__ is the anchor of its relative imports.
        package = importer if is_package else importer.rpartition(".")[0]
        parts = package.split(".")
        drop = node.level - 1
        if drop >= len(parts):
            return  # beyond the top-level package: not ours
        base = ".".join(parts[: len(parts) - drop])
        base = f"{base}.{node.module}" if node.module else base
    else:
        assert node.module is not None
        base = node.module
    for alias in node.names:
        # `from base import name`: name may be a submodule of base, or a name in it.
        yield f"{base}.{alias.name}" if alias.name != "*" else base
        yield base


def imports(package_dir: Path) -> list[Import]:
    """Every import, anywhere in a module's source, of a module of the package."""
    known = modules(package_dir)
    root = package_dir.parent
    edges: list[Import] = []
    for name, path in known.items():
        source = path.read_text()
        lines = source.splitlines()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            text = lines[node.lineno - 1].strip()
            seen: set[str] = set()
            candidates = list(_targets(node, name, is_package))
            if isinstance(node, ast.ImportFrom):
                # Pairs of (submodule, base): the submodule if it exists, else the base.
                chosen = [
                    sub if sub in known else base
                    for sub, base in zip(candidates[::2], candidates[1::2], strict=True)
                ]
            else:
                chosen = candidates
            for target in chosen:
                if target in known and target not in seen:
                    seen.add(target)
                    edges.append(Import(name, target, path.relative_to(root), node.lineno, text))
    return edges


def _components(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(sorted(graph[start]))))
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
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
                found.append(sorted(component))
    return found


def cycles(package_dir: Path) -> list[list[Import]]:
    """The import cycles of the package, each as the imports between its modules."""
    edges = imports(package_dir)
    nodes = sorted(modules(package_dir))
    graph: dict[str, set[str]] = {node: set() for node in nodes}
    for edge in edges:
        graph[edge.importer].add(edge.imported)
    result: list[list[Import]] = []
    for component in sorted(_components(nodes, graph)):
        members = set(component)
        if len(members) == 1 and component[0] not in graph[component[0]]:
            continue
        result.append(
            [edge for edge in edges if edge.importer in members and edge.imported in members]
        )
    return result


def report(found: list[list[Import]]) -> str:
    """The cycles, one paragraph each, for a person to read."""
    paragraphs = []
    for n, cycle in enumerate(found, 1):
        names = sorted({edge.importer for edge in cycle})
        head = f"cycle {n}: {' <-> '.join(names)}"
        paragraphs.append("\n".join([head, *(f"  {edge}" for edge in cycle)]))
    return "\n\n".join(paragraphs)


def main(argv: list[str]) -> int:
    package_dir = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent.parent / "trio_broker"
    found = cycles(package_dir)
    if found:
        print(report(found))
        print(f"\n{len(found)} import cycle(s) in {package_dir}")
        return 1
    print(f"no import cycle in {package_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
