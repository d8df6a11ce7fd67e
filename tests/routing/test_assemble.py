"""``pipeline.routing.assemble``: trained modules, selections and predictors on disk (``models/mK``) as
engine stages. ``load_stage`` under each routing (``selected``, ``predictor``, ``testset``, ``default``)
and before any selection exists, ``load_prefix`` (plain modules and predictor-routed ones as the next
module's frozen prefix) and ``load_stages`` (every module, thresholds defaulting to +inf)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pipeline.io import write_json
from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes
from pipeline.models.cost import fixed_macs, op_mac_table
from pipeline.models.modules import NO_ARCH, ModuleSpec
from pipeline.models.profile import CostModel
from pipeline.models.store import ModuleInfo, save_module
from pipeline.routing.assemble import ROUTINGS, load_prefix, load_stage, load_stages
from pipeline.routing.engine import RoutedModule
from pipeline.routing.predictor import Predictor
from pipeline.search.space import Arch

SPEC = CascadeSpec(
    in_channels=1,
    num_classes=3,
    image_size=8,
    modules=(
        ModuleSpec("fixed", 4, 1, 1, head="gap"),
        ModuleSpec("supernet", 4, 2, 2, ("conv3", "dw3", "skip"), "conv3", head="gap"),
        ModuleSpec("supernet", 4, 1, 1, ("conv3", "skip"), "conv3", head="gap"),
    ),
)
MEAN, STD = (0.5,), (0.25,)
CHEAP = Arch((("op@l1", "skip"), ("op@l2", "skip")))
MIXED = Arch((("op@l1", "dw3"), ("op@l2", "skip")))
M3_STATIC = Arch((("op@l1", "skip"),))


def costs() -> CostModel:
    modules, shapes = build_modules(SPEC, seed=0), feature_shapes(SPEC)
    return CostModel({"modules": [{"fixed_macs": fixed_macs(m, s), "op_macs": op_mac_table(m, s),
                                   "default_arch": m.default_arch().key()}
                                  for m, s in zip(modules, shapes, strict=False)]})


def predictor_selection(mode: str = "predictor", scoring: str = "label") -> dict:
    p = {"in_channels": 4, "num_candidates": 2, "hidden": 3, "pool": 1, "macs": 77}
    if scoring != "label":
        p.update(scoring=scoring, offsets=[0.0, 0.25])
    return {"module": 2, "mode": mode, "candidates": [CHEAP.key(), MIXED.key()], "static": MIXED.key(),
            "predictor": p}


def write_models(root: Path, m2: dict | None = None, m3: dict | None = None) -> Path:
    """models/m1..m3/train (seed-0 weights, m2's BatchNorm statistics moved), m2's and m3's selections."""
    modules, shapes = build_modules(SPEC, seed=0), feature_shapes(SPEC)
    with torch.no_grad():
        for m in modules[1].modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.fill_(0.3)
    for k, (module, spec) in enumerate(zip(modules, SPEC.modules, strict=True), start=1):
        (root / f"m{k}" / "train").mkdir(parents=True)
        save_module(root / f"m{k}" / "train", module, ModuleInfo(k, spec, shapes[k - 1][0], 3, shapes[k - 1],
                                                                 MEAN, STD))
    m2 = predictor_selection() if m2 is None else m2
    (root / "m2" / "select").mkdir()
    write_json(root / "m2" / "select" / "selection.json", m2)
    if m2["predictor"] is not None:
        p = m2["predictor"]
        predictor = Predictor(4, 2, hidden=3, seed=5, scoring=p.get("scoring", "label"),
                              offsets=p.get("offsets"))
        torch.save(predictor.state_dict(), root / "m2" / "select" / "predictor.pt")
    m3 = {"module": 3, "mode": "testset", "candidates": [M3_STATIC.key()], "static": M3_STATIC.key(),
          "predictor": None} if m3 is None else m3
    (root / "m3" / "select").mkdir()
    write_json(root / "m3" / "select" / "selection.json", m3)
    return root


def test_an_unknown_routing_is_refused_naming_the_choices(tmp_path: Path) -> None:
    assert ROUTINGS == ("selected", "predictor", "testset", "default")
    with pytest.raises(ValueError, match=r"routing must be one of \('selected', .*'default'\), got 'static'"):
        load_stage(tmp_path / "nowhere", 1, costs(), routing="static")


def test_before_selection_a_module_runs_its_default_path(tmp_path: Path) -> None:
    models = write_models(tmp_path)
    cm = costs()
    stage, info = load_stage(models, 1, cm, threshold=0.7)  # m1 has no select directory
    assert info.k == 1 and stage.candidates == (NO_ARCH,) and stage.predictor is None
    assert stage.candidate_macs == (cm.macs(1, NO_ARCH),) and stage.threshold == 0.7
    assert not stage.module.training
    (models / "m3" / "select" / "selection.json").unlink()
    stage, _ = load_stage(models, 3, cm)
    default = Arch((("op@l1", "conv3"),))
    assert stage.candidates == (default,) and stage.candidate_macs == (cm.macs(3, default),)
    assert stage.threshold == math.inf


@pytest.mark.parametrize("routing", ["selected", "predictor", "testset"])
def test_a_static_selection_runs_its_choice_under_every_routing_but_default(tmp_path: Path,
                                                                           routing: str) -> None:
    models, cm = write_models(tmp_path), costs()
    stage, _ = load_stage(models, 3, cm, routing)
    assert stage.candidates == (M3_STATIC,) and stage.predictor is None
    assert stage.candidate_macs == (cm.macs(3, M3_STATIC),) and cm.macs(3, M3_STATIC) < cm.max_macs(3)
    stage, _ = load_stage(models, 3, cm, "default")
    assert stage.candidates == (Arch((("op@l1", "conv3"),)),)


def test_a_predictor_selection_routes_per_image(tmp_path: Path) -> None:
    models, cm = write_models(tmp_path), costs()
    stage, info = load_stage(models, 2, cm, threshold=0.6)
    assert info.k == 2 and stage.candidates == (CHEAP, MIXED) and stage.threshold == 0.6
    assert stage.candidate_macs == (cm.macs(2, CHEAP), cm.macs(2, MIXED))
    assert stage.predictor is not None and not stage.predictor.training and stage.predictor_macs == 77
    saved = torch.load(models / "m2" / "select" / "predictor.pt", weights_only=True)
    for key, value in stage.predictor.state_dict().items():
        assert torch.equal(value, saved[key]), key
    assert stage.predictor.scoring == "label"


@pytest.mark.parametrize(("mode", "routing", "routed"), [
    ("predictor", "selected", True),
    ("predictor", "predictor", True),
    ("predictor", "testset", False),
    ("testset", "selected", False),  # the predictor did not pay: the static choice serves
    ("testset", "predictor", True),  # ... but stays for ablations
    ("predictor", "default", False),
])
def test_routing_picks_the_predictor_or_the_static_choice(tmp_path: Path, mode: str, routing: str,
                                                          routed: bool) -> None:
    models = write_models(tmp_path, m2=predictor_selection(mode))
    stage, _ = load_stage(models, 2, costs(), routing)
    assert (stage.predictor is not None) is routed
    expected = (CHEAP, MIXED) if routed else ((Arch((("op@l1", "conv3"), ("op@l2", "conv3"))),)
                                              if routing == "default" else (MIXED,))
    assert stage.candidates == expected


def test_a_cost_priced_predictor_keeps_its_scoring_and_offsets(tmp_path: Path) -> None:
    models = write_models(tmp_path, m2=predictor_selection(scoring="p_right"))
    stage, _ = load_stage(models, 2, costs())
    assert stage.predictor.scoring == "p_right"
    assert stage.predictor.offsets.tolist() == [0.0, 0.25]


def test_the_prefix_is_each_earlier_module_through_its_selection(tmp_path: Path) -> None:
    models, cm = write_models(tmp_path), costs()
    assert load_prefix(models, 1, cm, MEAN, STD).stages == ()
    prefix = load_prefix(models, 3, cm, (0.1,), (0.2,))
    assert prefix.mean == (0.1,) and prefix.std == (0.2,) and len(prefix.stages) == 2
    (first, arch1), (second, arch2) = prefix.stages
    assert arch1 == NO_ARCH and not isinstance(first, RoutedModule)
    assert isinstance(second, RoutedModule) and arch2 == CHEAP
    assert second.stage.candidates == (CHEAP, MIXED) and second.predictor is second.stage.predictor
    assert not any(p.requires_grad for p in second.parameters()) and not second.training
    x = torch.randn(6, 1, 8, 8)
    stage1, _ = load_stage(models, 1, cm)
    stage2, _ = load_stage(models, 2, cm)
    with torch.no_grad():
        h, _ = stage1.module(x, NO_ARCH)
        choice = stage2.predictor.choose(h)
        expected = torch.cat([stage2.module(h[i:i + 1], stage2.candidates[int(c)])[0]
                              for i, c in enumerate(choice)])
    assert torch.allclose(prefix(x), expected, atol=1e-5)
    # a static m2 is a plain module on its static path
    static_m2 = predictor_selection("testset") | {"predictor": None}
    static = load_prefix(write_models(tmp_path / "static", m2=static_m2), 3, cm, MEAN, STD)
    assert static.stages[1][1] == MIXED and not isinstance(static.stages[1][0], RoutedModule)


@pytest.mark.parametrize(("thresholds", "expected"), [
    (None, [math.inf, math.inf, math.inf]),
    ([0.5], [0.5, math.inf, math.inf]),
    ([0.5, 0.8], [0.5, 0.8, math.inf]),
    ([0.5, 0.8, 0.9], [0.5, 0.8, 0.9]),
])
def test_load_stages_gives_every_module_with_its_threshold(tmp_path: Path, thresholds: list[float] | None,
                                                           expected: list[float]) -> None:
    stages, infos = load_stages(write_models(tmp_path), costs(), thresholds)
    assert [s.threshold for s in stages] == expected
    assert [i.k for i in infos] == [1, 2, 3]
    assert [s.predictor is not None for s in stages] == [False, True, False]


def test_load_stages_passes_the_routing_on(tmp_path: Path) -> None:
    stages, _ = load_stages(write_models(tmp_path), costs(), routing="default")
    assert [s.predictor for s in stages] == [None, None, None]
    assert [s.candidates[0].key() for s in stages] == ["", "op@l1=conv3|op@l2=conv3", "op@l1=conv3"]
