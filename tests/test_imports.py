"""The library's import graph has no cycles, deferred (function-level) imports included: a cycle
hidden behind an import inside a function still couples the two modules both ways."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "pipeline"


def module_name(path: Path, pkg: Path = PKG) -> str:
    parts = path.relative_to(pkg.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the ``pipeline`` modules it imports anywhere in its body (a package's import of its
    own submodules is not an edge: that is how packages re-export)."""
    names = {module_name(p, pkg): p for p in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {t for t in targets if t in names and t != name and not t.startswith(name + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same module, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_find_cycle_sees_a_deferred_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_pipeline_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "pipeline.choices" in graph["pipeline.config"]  # the graph sees real imports
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)
