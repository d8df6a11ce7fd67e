"""The project's import graph (``pipeline.codegraph``): no cycles in the library, deferred
(function-level) imports included, and one-way layers: stages are wiring over the library, so no
stage imports another stage (``stages.common`` is their shared CLI helper), the library imports
neither ``stages`` nor ``bench``, and no code outside ``tests/`` (library, stages, benchmarks) imports
``tests``: test helpers such as ``tests.tools.tiny_repo`` live there, and only tests use them.

Inside the library, the rooms of ``pipeline/`` (its sub-packages and its few top-level modules) stand
in the layers of ``LAYERS`` (docs/DESIGN.md, "Rooms and layers"): a room imports only rooms of lower
layers, never one of its own layer or above; and the house stays small enough to read: at most
``MAX_TOP_FILES`` files at ``pipeline/``'s top, no library file (``pipeline/``, ``stages/``) over
``MAX_LINES`` lines."""

from __future__ import annotations

from pathlib import Path

from pipeline.codegraph import ROOT, find_cycle, import_graph, imported_names, module_files

# pipeline/'s rooms, lowest layer first; the rooms of one layer are independent of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("params", "io"),  # the params schema and typed configs; atomic files, splits, JSON
    ("device", "report", "data", "search"),  # where torch runs; plots, progress; datasets; spaces, method B
    ("models",),  # ops, modules, cascade, cost, profile, store, the modules' config
    ("train",),  # one module's training, the plain-CNN baselines
    ("routing",),  # candidates, predictor, selection, engine, calibration, the packaged cascade
    ("evaluation", "registry", "architect"),  # the test-split comparison; MLflow runs, the registered model;
    # module shapes searched on an elastic cascade
    ("workflows",),  # one workflow per DVC stage, what its stage calls
    ("serving",),  # cascade serve/export: engines, ONNX, the guards
    ("exit_codes",),  # one exit status per kind of error
    ("cli", "check_params", "profiles", "codegraph"),  # what a person runs
)
MAX_TOP_FILES = 8  # .py files at pipeline/'s top, __init__.py included
MAX_LINES = 450  # per library file (pipeline/, stages/)


def room_of(module: str) -> str | None:
    """``pipeline.train.loop`` -> ``train``, ``pipeline.io`` -> ``io``; the package itself -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def rooms(root: Path = ROOT) -> set[str]:
    """Every room of ``root/pipeline``: each sub-package and each top-level module but ``__init__``."""
    lib = root / "pipeline"
    return ({p.name for p in lib.iterdir() if (p / "__init__.py").is_file()}
            | {p.stem for p in lib.glob("*.py") if p.stem != "__init__"})


def room_violations(root: Path = ROOT, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """``importer -> imported (why)`` for every import of the library that runs up a layer or sideways
    within one (deferred and TYPE_CHECKING imports count: they are imports all the same), plus every
    room that ``layers`` does not place (a new room must say where it stands)."""
    level = {room: i for i, layer in enumerate(layers) for room in layer}
    bad = [f"room {room!r} stands in no layer" for room in sorted(rooms(root) - set(level))]
    for name, targets in sorted(import_graph(root, ("pipeline",)).items()):
        src = room_of(name)
        by_room: dict[str, list[str]] = {}
        for target in sorted(targets):
            by_room.setdefault(room_of(target) or "", []).append(target)
        for dst, names in sorted(by_room.items()):
            if src not in level or dst not in level or src == dst:
                continue
            if level[dst] > level[src]:
                bad.append(f"{name} -> {', '.join(names)} ({src} imports {dst}, a higher layer)")
            elif level[dst] == level[src]:
                bad.append(f"{name} -> {', '.join(names)} ({src} and {dst} share a layer)")
    return bad


def bound_violations(root: Path = ROOT, max_top: int = MAX_TOP_FILES, max_lines: int = MAX_LINES) -> list[str]:
    """What breaks the house's bounds: too many files at ``pipeline/``'s top, a library file too long."""
    top = sorted(p.name for p in (root / "pipeline").glob("*.py"))
    bad = [f"pipeline/ holds {len(top)} files at its top (at most {max_top}): {', '.join(top)}"] * (len(top) > max_top)
    for pkg in ("pipeline", "stages"):
        for path in sorted((root / pkg).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > max_lines and "__pycache__" not in path.parts:
                bad.append(f"{path.relative_to(root).as_posix()}: {lines} lines (at most {max_lines})")
    return bad


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
    assert "pipeline.params.choices" in graph["pipeline.params.config"]  # the graph sees real imports
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_layers_are_one_way() -> None:
    assert layering_violations() == []


def test_a_planted_layer_violation_is_found(tmp_path: Path) -> None:
    for pkg, files in {"pipeline": {"lib.py": "def f():\n    from stages.train import main\n"},
                       "stages": {"common.py": "", "a.py": "from stages.common import x\nimport stages.b\n",
                                  "b.py": "from bench.seeds import run\n"},
                       "bench": {"ok.py": "from pipeline.params.config import load_params\nimport bench.seeds\n",
                                 "x.py": "from tests.tools.tiny_repo import make_tiny_repo\n"}}.items():
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        for fname, text in files.items():
            (tmp_path / pkg / fname).write_text(text)
    assert layering_violations(tmp_path) == ["pipeline.lib -> stages.train", "stages.a -> stages.b",
                                             "stages.b -> bench.seeds", "bench.x -> tests.tools"]


def test_rooms_stand_in_one_way_layers() -> None:
    placed = [room for layer in LAYERS for room in layer]
    assert len(placed) == len(set(placed)) and set(placed) <= rooms(), "LAYERS names a room twice or one not there"
    assert room_violations() == []


def test_a_planted_room_violation_is_found(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "io.py": "",
        "models/__init__.py": "",
        "models/nets.py": "def build():\n    from pipeline.train.loop import fit\n",  # deferred, up two layers
        "train/__init__.py": "",
        "train/loop.py": "from pipeline.models.nets import build\nimport pipeline.io\n",  # down: fine
        "data/__init__.py": "",
        "data/sources.py": "from pipeline.search import space\n",  # sideways, within a layer
        "search/__init__.py": "",
        "search/space.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pipeline.serving.x\n",
        "serving/__init__.py": "",
        "serving/x.py": "from pipeline.models import nets\n",
        "kitchen/__init__.py": "",
        "kitchen/sink.py": "import pipeline.io\n",  # a room with no layer
    }
    for name, text in files.items():
        (tmp_path / "pipeline" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pipeline" / name).write_text(text)
    assert room_violations(tmp_path) == [
        "room 'kitchen' stands in no layer",
        "pipeline.data.sources -> pipeline.search, pipeline.search.space (data and search share a layer)",
        "pipeline.models.nets -> pipeline.train.loop (models imports train, a higher layer)",
        "pipeline.search.space -> pipeline.serving.x (search imports serving, a higher layer)",
    ]


def test_the_house_keeps_its_bounds() -> None:
    assert bound_violations() == []


def test_planted_bound_violations_are_found(tmp_path: Path) -> None:
    (tmp_path / "pipeline" / "room").mkdir(parents=True)
    (tmp_path / "stages").mkdir()
    for i in range(MAX_TOP_FILES):
        (tmp_path / "pipeline" / f"m{i}.py").write_text("")
    (tmp_path / "pipeline" / "room" / "long.py").write_text("x = 1\n" * MAX_LINES)
    assert bound_violations(tmp_path) == []  # at the bounds: fine
    (tmp_path / "pipeline" / "__init__.py").write_text("")
    (tmp_path / "stages" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert bound_violations(tmp_path) == [
        f"pipeline/ holds 9 files at its top (at most 8): __init__.py, {', '.join(f'm{i}.py' for i in range(8))}",
        f"stages/long.py: {MAX_LINES + 1} lines (at most {MAX_LINES})",
    ]
