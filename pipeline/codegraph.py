"""The repository's own import graph, read from the source (``ast``, nothing imported): which project
modules a stage runs. One graph serves three readers: the import-cycle and layering tests, the test
that every DVC stage lists the code it runs as deps (so an edit re-runs the stages it changes), and
the train stage's checkpoint key (so a resumed run never mixes code versions).

Every ``import`` in a module's body counts, function-level ones included; importing ``a.b.c`` also
runs ``a/__init__.py`` and ``a/b/__init__.py``, so those are part of what it runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages")  # the project's code that stages run (bench/ and tests/ are not)


def module_name(path: Path, root: Path = ROOT) -> str:
    """``pipeline/train/loop.py`` -> ``pipeline.train.loop``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Module name -> its file, for every ``.py`` file of ``packages`` under ``root``."""
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))
            if "__pycache__" not in p.parts}


def imported_names(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports anywhere in its body (``from a import b`` yields
    both ``a`` and ``a.b``: ``b`` may be a submodule)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports. A package's import of its own submodules is an edge
    too: a re-export in ``__init__.py`` runs that submodule (and what it imports) for every importer of
    the package (``pipeline/search/__init__.py`` runs ``blackbox``, ``probmodel``, ...; docs/DESIGN.md
    "Rooms and layers")."""
    files = module_files(root, packages)
    return {name: {t for t in imported_names(path) if t in files and t != name}
            for name, path in files.items()}


def _with_parents(name: str, files: dict[str, Path]) -> set[str]:
    parts = name.split(".")
    return {p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in files}


def closure(module: str, root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """The files (relative to ``root``, sorted) that running ``python -m <module>`` executes from the
    project: the module, everything it imports transitively, and the ``__init__.py`` of every package
    on the way."""
    files = module_files(root, packages)
    if module not in files:
        raise KeyError(f"{module}: no such module under {root} ({', '.join(packages)})")
    graph = import_graph(root, packages)
    seen: set[str] = set()
    todo = [module]
    while todo:
        for name in _with_parents(todo.pop(), files) - seen:
            seen.add(name)
            todo.extend(graph[name])
    return sorted(files[n].relative_to(root) for n in seen)


def covered(path: Path, deps: list[str]) -> bool:
    """Whether a DVC dep (a file, or a directory holding it) covers ``path``."""
    return any(path == Path(d) or Path(d) in path.parents for d in deps)


def missing_code_deps(module: str, deps: list[str], root: Path = ROOT) -> list[Path]:
    """The files ``module`` runs that no entry of ``deps`` covers (an empty file, such as most
    ``__init__.py``, runs nothing and need not be listed: once it holds code, it is missing)."""
    return [p for p in closure(module, root) if not covered(p, deps) and (root / p).stat().st_size > 0]


def unused_code_deps(module: str, deps: list[str], root: Path = ROOT,
                     packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Entries of ``deps`` inside the code packages that cover none of the files ``module`` runs:
    an edit there would re-run the stage for nothing."""
    ran = closure(module, root, packages)
    code = [d for d in deps if Path(d).parts and Path(d).parts[0] in packages]
    return [d for d in code if not any(covered(p, [d]) for p in ran)]


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


def code_deps(module: str, root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The shortest list of DVC deps covering what ``module`` runs: a package directory where the
    module runs every non-empty file of it, else the non-empty files (what dvc.yaml lists;
    ``python -m pipeline.codegraph`` prints it)."""
    ran = {p for p in closure(module, root, packages) if (root / p).stat().st_size > 0}
    everything = {p.relative_to(root) for p in module_files(root, packages).values() if p.stat().st_size > 0}

    def cover(directory: Path) -> list[str]:
        inside = sorted(p for p in everything if directory in p.parents)
        if inside and all(p in ran for p in inside):
            return [directory.as_posix()]
        out = [p.as_posix() for p in inside if p.parent == directory and p in ran]
        for sub in sorted({p.parents[len(p.parents) - len(directory.parts) - 2] for p in inside
                           if p.parent != directory}):
            out.extend(cover(sub))
        return out

    return sorted(d for pkg in packages for d in cover(Path(pkg)))


CODE_BLOCK = re.compile(r"^(\s*)# code: every project file `python -m (stages\.\w+)` runs \(")


def sync_dvc_yaml(text: str, root: Path = ROOT) -> str:
    """``text`` (a dvc.yaml) with each generated ``# code:`` block's list replaced by ``code_deps`` of
    its stage module; every other line (comments, data deps, hand-written blocks) stays as it is."""
    lines, out, i = text.splitlines(keepends=True), [], 0
    while i < len(lines):
        out.append(lines[i])
        found = CODE_BLOCK.match(lines[i])
        i += 1
        if not found:
            continue
        indent = found.group(1)
        while i < len(lines) and re.match(rf"^{indent}- (pipeline|stages)(/|\s*$)", lines[i]):
            i += 1  # the old list
        out.extend(f"{indent}- {dep}\n" for dep in code_deps(found.group(2), root))
    return "".join(out)


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m pipeline.codegraph", description=(
        "Print the code deps (dvc.yaml entries) of stage modules: every project file each runs; "
        "or, with --sync, rewrite dvc.yaml's generated '# code:' lists from the import graph."))
    p.add_argument("modules", nargs="*", help="module names, e.g. stages.train")
    p.add_argument("--sync", type=Path, metavar="DVC_YAML", help="rewrite this dvc.yaml's code lists in place")
    args = p.parse_args(argv)
    if args.sync:
        before = args.sync.read_text()
        after = sync_dvc_yaml(before)
        if after != before:
            args.sync.write_text(after)
        print(f"{args.sync}: code deps {'updated' if after != before else 'already up to date'}")
    for module in args.modules:
        print(f"{module}:")
        for dep in code_deps(module):
            print(f"  - {dep}")


if __name__ == "__main__":
    main()
