"""``pipeline.codegraph`` on a small repository written to ``tmp_path`` (tests/test_imports.py and
tests/test_dvc_deps.py check the real one): module names, the files of each package (caches left out),
the names a file imports (function-level imports included, relative ones not), the graph (a package's
re-exported submodules are edges: they run), ``closure`` (parents' ``__init__`` included, an unknown module named),
``covered``, the missing and unused deps of a stage, ``find_cycle`` on its edge cases, ``code_deps``
(a directory when the stage runs all of it), ``sync_dvc_yaml`` and the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import codegraph
from pipeline.codegraph import (
    closure,
    code_deps,
    covered,
    find_cycle,
    import_graph,
    imported_names,
    missing_code_deps,
    module_files,
    module_name,
    sync_dvc_yaml,
    unused_code_deps,
)

FILES = {
    "pipeline/__init__.py": "",
    "pipeline/io.py": "import json\n",
    "pipeline/util.py": "from pipeline.io import read\n",
    "pipeline/unused.py": "X = 1\n",
    "pipeline/models/__init__.py": "from pipeline.models import nets\n",  # a re-export runs nets
    "pipeline/models/nets.py": "def build():\n    import pipeline.util\n",  # deferred import
    "pipeline/models/extra.py": "",  # empty: runs nothing
    "pipeline/__pycache__/io.cpython-311.py": "import nowhere\n",
    "stages/__init__.py": "",
    "stages/train.py": "from pipeline.models.nets import build\nfrom . import helper\n",
    "stages/helper.py": "",
    "bench/b.py": "import pipeline.unused\n",  # not one of the code packages
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_module_name(tmp_path: Path) -> None:
    assert module_name(tmp_path / "pipeline/train/loop.py", tmp_path) == "pipeline.train.loop"
    assert module_name(tmp_path / "pipeline/train/__init__.py", tmp_path) == "pipeline.train"
    assert module_name(Path("stages/a.py"), Path(".")) == "stages.a"


def test_module_files_are_the_packages_sources_without_caches(repo: Path) -> None:
    files = module_files(repo)
    assert sorted(files) == ["pipeline", "pipeline.io", "pipeline.models", "pipeline.models.extra",
                             "pipeline.models.nets", "pipeline.unused", "pipeline.util", "stages",
                             "stages.helper", "stages.train"]
    assert files["pipeline.models"] == repo / "pipeline/models/__init__.py"
    assert "bench.b" in module_files(repo, ("bench",))


def test_imported_names_reads_every_absolute_import(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("import os, a.b as ab\nfrom c.d import e, f\nfrom . import g\nfrom .h import i\n"
                    "def late():\n    from j import k\n    if True:\n        import l.m\n")
    assert imported_names(path) == {"os", "a.b", "c.d", "c.d.e", "c.d.f", "j", "j.k", "l.m"}


def test_imported_names_of_a_broken_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("def f(:\n")
    with pytest.raises(SyntaxError) as info:
        imported_names(path)
    assert info.value.filename == str(path)


def test_import_graph_keeps_project_edges_only(repo: Path) -> None:
    graph = import_graph(repo)
    assert graph["pipeline.util"] == {"pipeline.io"}  # `read` is no module; json is not the project's
    assert graph["pipeline.models"] == {"pipeline.models.nets"}  # a re-export runs its submodule
    assert graph["pipeline.models.nets"] == {"pipeline.util"}
    assert graph["stages.train"] == {"pipeline.models.nets"}  # the relative import is not read
    assert graph["pipeline.io"] == set()


def test_an_edit_in_a_re_exported_submodule_reaches_the_stages_of_the_package(repo: Path) -> None:
    """A submodule that only the package's ``__init__`` imports (a re-export) runs for every stage that
    imports anything of the package: it is in the stage's closure, so its deps list must hold it."""
    (repo / "pipeline" / "models" / "__init__.py").write_text(
        "from pipeline.models import nets\nfrom pipeline.models.search import run\n")
    (repo / "pipeline" / "models" / "search.py").write_text("import pipeline.unused\ndef run():\n    pass\n")
    ran = closure("stages.train", repo)
    assert Path("pipeline/models/search.py") in ran and Path("pipeline/unused.py") in ran
    assert missing_code_deps("stages.train", ["pipeline/models/nets.py", "pipeline/models/__init__.py",
                                              "pipeline/util.py", "pipeline/io.py", "stages"], repo) == \
        [Path("pipeline/models/search.py"), Path("pipeline/unused.py")]


def test_closure_is_what_running_a_module_executes(repo: Path) -> None:
    assert closure("stages.train", repo) == sorted(Path(p) for p in (
        "stages/__init__.py", "stages/train.py", "pipeline/__init__.py", "pipeline/models/__init__.py",
        "pipeline/models/nets.py", "pipeline/util.py", "pipeline/io.py"))
    assert closure("pipeline.io", repo) == [Path("pipeline/__init__.py"), Path("pipeline/io.py")]
    with pytest.raises(KeyError, match=f"stages.nope: no such module under {repo}"):
        closure("stages.nope", repo)


def test_covered_by_a_file_or_a_directory_above_it() -> None:
    path = Path("pipeline/models/nets.py")
    assert covered(path, ["pipeline/models/nets.py"]) and covered(path, ["pipeline"])
    assert covered(path, ["other", "pipeline/models"])
    assert not covered(path, ["pipeline/mod", "pipeline/models/nets", "stages"])
    assert not covered(path, [])


def test_missing_and_unused_deps_of_a_stage(repo: Path) -> None:
    deps = ["stages/train.py", "pipeline/models", "pipeline/unused.py", "stages/helper.py", "data/raw"]
    assert missing_code_deps("stages.train", deps, repo) == [Path("pipeline/io.py"), Path("pipeline/util.py")]
    # data deps and code the stage runs are fine; an empty __init__ need not be listed
    assert unused_code_deps("stages.train", deps, repo) == ["pipeline/unused.py", "stages/helper.py"]
    assert missing_code_deps("stages.train", code_deps("stages.train", repo), repo) == []


def test_find_cycle_edge_cases() -> None:
    assert find_cycle({}) is None
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"d"}, "d": {"c"}}) == ["c", "d", "c"]
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None  # a diamond
    cycle = find_cycle({"x": {"y"}, "y": {"z"}, "z": {"y"}})
    assert cycle == ["y", "z", "y"]  # the path into the cycle (x) is not part of it


def test_code_deps_collapse_a_directory_the_module_runs_in_full(repo: Path) -> None:
    # pipeline/models: __init__ and nets run, extra.py is empty: the whole directory; likewise stages/
    # (train.py is its only non-empty file); empty files (pipeline/__init__.py) are never listed
    assert code_deps("stages.train", repo) == ["pipeline/io.py", "pipeline/models", "pipeline/util.py",
                                               "stages"]
    (repo / "pipeline/models/extra.py").write_text("Y = 2\n")  # now it holds code the stage never runs
    assert "pipeline/models" not in code_deps("stages.train", repo)
    assert {"pipeline/models/__init__.py", "pipeline/models/nets.py"} <= set(code_deps("stages.train", repo))
    assert code_deps("pipeline.unused", repo, ("pipeline",)) == ["pipeline/unused.py"]
    (repo / "pipeline/__init__.py").write_text("VERSION = 1\n")
    assert code_deps("pipeline.unused", repo, ("pipeline",)) == ["pipeline/__init__.py", "pipeline/unused.py"]


def test_sync_dvc_yaml_rewrites_generated_blocks_only(repo: Path) -> None:
    text = ("stages:\n"
            "  train:\n"
            "    cmd: python -m stages.train\n"
            "    deps:\n"
            "      # code: every project file `python -m stages.train` runs (generated)\n"
            "      - pipeline/old.py\n"
            "      - stages\n"
            "      - data/raw\n"
            "      # hand-written\n"
            "      - pipeline/unused.py\n")
    synced = sync_dvc_yaml(text, repo)
    assert synced == text.replace("      - pipeline/old.py\n      - stages\n", "".join(
        f"      - {d}\n" for d in code_deps("stages.train", repo)))
    assert sync_dvc_yaml(synced, repo) == synced  # idempotent
    assert sync_dvc_yaml("stages: {}\n", repo) == "stages: {}\n"


def test_main_prints_code_deps_and_syncs_in_place(repo: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # main reads the real repository (ROOT): point it at the small one
    monkeypatch.setattr(codegraph, "code_deps", lambda module, root=repo: code_deps(module, root))
    monkeypatch.setattr(codegraph, "sync_dvc_yaml", lambda text: sync_dvc_yaml(text, repo))
    dvc = tmp_path / "dvc.yaml"
    dvc.write_text("    deps:\n"
                   "    # code: every project file `python -m stages.train` runs (x)\n"
                   "    - pipeline\n")
    codegraph.main(["--sync", str(dvc), "pipeline.io"])
    out = capsys.readouterr().out
    assert out == f"{dvc}: code deps updated\npipeline.io:\n  - pipeline/io.py\n"
    assert "    - pipeline/models\n" in dvc.read_text() and "    - pipeline\n" not in dvc.read_text()
    before = dvc.read_text()
    codegraph.main(["--sync", str(dvc)])
    assert capsys.readouterr().out == f"{dvc}: code deps already up to date\n" and dvc.read_text() == before
