"""Stages read params only through the typed configs (``XConfig.from_params(params)``): never
``params.get(...)``, ``params[...]`` or a raw section, and never the schema's readers themselves, so a
default cannot be restated in a stage (docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.tools.tiny_repo import ROOT

READERS = ("from_params", "module_train_config")  # what the params mapping may be handed to
SCHEMA_READERS = {"section", "settings", "top_level", "load_params", "load_checked_params", "params_problems"}
# ingest still reads data.max_pixels from the raw section; DataConfig.max_pixels is its typed replacement,
# taken up when ingest's own change (counting the files it skips) lands.
PENDING: set[str] = set()


def raw_reads(source: str) -> list[str]:
    """Each place ``source`` reads params other than through a typed config, as ``line: what``."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    held = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "params_of"
            for target in node.targets if isinstance(target, ast.Name)}
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline.params"):
            bad += [f"{node.lineno}: imports {a.name}" for a in node.names if a.name in SCHEMA_READERS]
        if not (isinstance(node, ast.Name) and node.id in held and isinstance(node.ctx, ast.Load)):
            continue
        call = parents[node]
        func = getattr(call, "func", None)
        name = getattr(func, "attr", None) or getattr(func, "id", None)
        if not (isinstance(call, ast.Call) and node in call.args and name in READERS):
            bad.append(f"{node.lineno}: {ast.unparse(parents[node])}")
    return bad


@pytest.mark.parametrize("path", sorted((ROOT / "stages").glob("*.py")), ids=lambda p: p.name)
def test_a_stage_reads_params_through_typed_configs_only(path: Path) -> None:
    if path.name in PENDING or path.name == "common.py":  # common.py loads and checks the file for all
        pytest.skip(f"{path.name}: loads the params file for every stage" if path.name == "common.py"
                    else f"{path.name}: its typed replacement waits on another change")
    assert raw_reads(path.read_text()) == [], f"{path.name} reads params around the typed configs"


@pytest.mark.parametrize("line", ['params.get("seed", 0)', 'params["calibrate"]["grid"]',
                                  'dict(params)', 'section(params, "select")',
                                  'BaselineConfig.from_dict(params.get("baselines"))'])
def test_the_check_finds_a_raw_read(line: str) -> None:
    source = f"from stages.common import params_of\n\ndef main(args):\n    params = params_of(args)\n    x = {line}\n"
    assert raw_reads(source), line


def test_the_check_lets_typed_configs_and_the_module_recipe_through() -> None:
    source = ("from pipeline.params.config import CalibrateConfig\n\ndef main(args):\n    params = params_of(args)\n"
              "    cfg = CalibrateConfig.from_params(params)\n    train = module_train_config(params, 'm1', 0)\n")
    assert raw_reads(source) == []
    assert raw_reads("from pipeline.params.settings import settings\n") == ["1: imports settings"]


def test_ingest_has_its_typed_replacement_ready() -> None:
    from pipeline.params.config import DataConfig

    assert "max_pixels" in {f for f in DataConfig.__dataclass_fields__}
