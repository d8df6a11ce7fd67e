"""The house's size rules (docs/DESIGN.md 'Stages and workflows'): a stage only parses, calls the library
and writes, so no file in ``stages/`` is over ``MAX_STAGE_LINES`` lines; and no function in ``pipeline/``
or ``stages/`` is over ``MAX_FUNCTION_LINES`` lines (its ``def`` line to its last, docstring included)."""

from __future__ import annotations

import ast
from pathlib import Path

from pipeline.codegraph import ROOT

MAX_STAGE_LINES = 80
MAX_FUNCTION_LINES = 60


def long_functions(root: Path, packages: tuple[str, ...] = ("pipeline", "stages"),
                   limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (N lines)`` for every function or method over ``limit`` lines."""
    found = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def long_stages(root: Path, limit: int = MAX_STAGE_LINES) -> list[str]:
    """``path (N lines)`` for every file of ``stages/`` over ``limit`` lines."""
    sizes = {path: len(path.read_text(encoding="utf-8").splitlines())
             for path in sorted((root / "stages").glob("*.py"))}
    return [f"{path.relative_to(root)} ({n} lines)" for path, n in sizes.items() if n > limit]


def test_no_function_in_the_library_or_the_stages_is_over_60_lines() -> None:
    assert long_functions(ROOT) == []


def test_no_stage_file_is_over_80_lines() -> None:
    assert long_stages(ROOT) == []


def test_the_rules_catch_a_long_function_and_a_long_stage(tmp_path: Path) -> None:
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "stages").mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(60))
    (tmp_path / "pipeline" / "big.py").write_text(f"class A:\n    def method(self):\n{body}\n")
    (tmp_path / "pipeline" / "small.py").write_text("def f():\n" + "\n".join(f"    y{i} = {i}" for i in range(59)))
    (tmp_path / "stages" / "long.py").write_text("\n" * 81)
    (tmp_path / "stages" / "short.py").write_text("\n" * 80)
    assert long_functions(tmp_path) == ["pipeline/big.py:2 method (61 lines)"]
    assert long_stages(tmp_path) == ["stages/long.py (81 lines)"]
