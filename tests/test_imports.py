"""The project's import graph (``pipeline.codegraph``): no cycles in the library, deferred
(function-level) imports included, and one-way layers: stages are wiring over the library, so no
stage imports another stage (``stages.common`` is their shared CLI helper), the library imports
neither ``stages`` nor ``bench``, and no code outside ``tests/`` (library, stages, benchmarks) imports
``tests``: test helpers such as ``tests.tools.tiny_repo`` live there, and only tests use them."""

from __future__ import annotations

from pathlib import Path

from pipeline.codegraph import ROOT, find_cycle, import_graph, imported_names, module_files


def layering_violations(root: Path = ROOT) -> list[str]:
    """``importer -> imported`` (the top two levels of the name) for every import that crosses a layer
    the wrong way. ``bench/`` is scanned only for imports of ``tests`` (a benchmark may use the library,
    ``pipeline``)."""
    bad = []
    for name, path in module_files(root, ("pipeline", "stages", "bench")).items():
        for target in sorted({".".join(t.split(".")[:2]) for t in imported_names(path)}):
            top = target.split(".")[0]
            if top == "tests":
                bad.append(f"{name} -> {target}")
            elif name.split(".")[0] == "bench":
                continue
            elif name.startswith("pipeline") and top in ("stages", "bench"):
                bad.append(f"{name} -> {target}")
            elif (name.startswith("stages.") and top == "stages" and target not in ("stages", "stages.common")
                  and name != "stages.common"):
                bad.append(f"{name} -> {target}")
            elif name.startswith("stages") and top == "bench":
                bad.append(f"{name} -> {target}")
    return bad


def test_find_cycle_sees_a_deferred_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_pipeline_has_no_import_cycle() -> None:
    graph = import_graph(packages=("pipeline",))
    assert "pipeline.choices" in graph["pipeline.config"]  # the graph sees real imports
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_layers_are_one_way() -> None:
    assert layering_violations() == []


def test_a_planted_layer_violation_is_found(tmp_path: Path) -> None:
    for pkg, files in {"pipeline": {"lib.py": "def f():\n    from stages.train import main\n"},
                       "stages": {"common.py": "", "a.py": "from stages.common import x\nimport stages.b\n",
                                  "b.py": "from bench.seeds import run\n"},
                       "bench": {"ok.py": "from pipeline.config import load_params\nimport bench.seeds\n",
                                 "x.py": "from tests.tools.tiny_repo import make_tiny_repo\n"}}.items():
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        for fname, text in files.items():
            (tmp_path / pkg / fname).write_text(text)
    assert layering_violations(tmp_path) == ["pipeline.lib -> stages.train", "stages.a -> stages.b",
                                             "stages.b -> bench.seeds", "bench.x -> tests.tools"]
