"""The tree's layout in figures: lines per place and package, and the import graph's cycles.

    python scripts/layout.py                 # the four places: library, app, experiments, benchmarks
    python scripts/layout.py --graph         # also every internal import, one line each

It reads the source (no imports run): an import inside a function counts like one at the top,
since a cycle through a deferred import is still a cycle a reader has to untangle.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLACES = {"library": "dataecho", "application": "dataecho/app", "experiments": "experiments",
          "benchmarks": "benchmarks"}  # fmt: skip


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the four places, by dotted name."""
    found = {}
    for top in ("dataecho", "experiments", "benchmarks"):
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def place(name: str) -> str:
    """Which of the four places a module belongs to."""
    if name == "dataecho.app" or name.startswith("dataecho.app."):
        return "application"
    return {"dataecho": "library"}.get(name.split(".")[0], name.split(".")[0])


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Internal imports: module -> the modules of the tree it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package[: len(package) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                # ``from pkg import submodule`` imports the submodule, not pkg's other names.
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            else:
                continue
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="print every internal import")
    args = parser.parse_args(argv)
    mods = modules()
    graph = imports(mods)
    lines: dict[str, int] = defaultdict(int)
    packages: dict[str, int] = defaultdict(int)
    for name, path in mods.items():
        n = len(path.read_text().splitlines())
        lines[place(name)] += n
        depth = 3 if place(name) == "application" else 2
        packages[".".join(name.split(".")[:depth])] += n
    print("lines per place:")
    for where in PLACES:
        print(f"  {lines[where]:6d}  {where:12s} {PLACES[where]}/")
    print("lines per package or module:")
    for name in sorted(packages):
        print(f"  {packages[name]:6d}  {name}")
    crossings = sorted((a, b) for a, bs in graph.items() for b in bs if place(a) != place(b))
    ways = sorted({(place(a), place(b)) for a, b in crossings})
    print(f"imports between places: {', '.join(f'{a} -> {b}' for a, b in ways) or 'none'}")
    found = cycles(graph)
    total = sum(len(targets) for targets in graph.values())
    print(f"modules: {len(mods)}; internal imports: {total}; import cycles: {len(found)}")
    for component in found:
        print("  cycle: " + " <-> ".join(component))
    if args.graph:
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f"  {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
