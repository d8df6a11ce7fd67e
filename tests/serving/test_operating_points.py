"""The model's operating points where it is served: printed by `cascade info`, carried by the ONNX export,
and answered at per call by both engines (pipeline.serving.engines, pipeline.routing.engine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.routing.operating_points import within
from pipeline.routing.package import LoadedCascade, load_cascade
from pipeline.routing.packaging import with_thresholds
from pipeline.routing.recognize import recognize_arrays
from pipeline.serving.engines import load_engine
from pipeline.serving.onnx_export import export_model_dir
from tests.routing.test_package import uint8_images


@pytest.fixture(scope="module")
def test_split() -> np.ndarray:
    return uint8_images(3000, seed=77)  # the held-out points were fitted on seed 5


def test_info_prints_the_points(points_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    points = load_cascade(points_model).meta.operating_points
    assert main(["info", "--model", str(points_model)]) == 0
    text = capsys.readouterr().out
    for p in points:
        assert f"  {p.name}: accuracy {p.accuracy:.4f} at {p.mean_macs:,.0f} MACs" in text
    assert main(["info", "--model", str(points_model), "--json"]) == 0
    assert [p["name"] for p in json.loads(capsys.readouterr().out)["operating_points"]] == [p.name for p in points]


def test_the_onnx_export_carries_the_points(points_model: Path, tmp_path: Path) -> None:
    engine = load_engine(export_model_dir(points_model, tmp_path / "onnx"), "onnx")
    assert engine.points == load_cascade(points_model).meta.operating_points
    assert load_engine(points_model, "torch").points == engine.points


def test_a_model_without_points_serves_its_own_thresholds(tiny_model: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--model", str(tiny_model)]) == 0
    assert "operating points: none recorded" in capsys.readouterr().out
    (point,) = load_engine(tiny_model, "torch").points
    assert point.name == "accurate" and point.mean_macs is None
    assert list(point.thresholds) == [s.threshold for s in load_cascade(tiny_model).stages[:-1]]


@pytest.mark.parametrize("kind", ["torch", "onnx"])
def test_each_point_answers_as_a_model_with_its_thresholds(points_model: Path, kind: str, tmp_path: Path) -> None:
    engine = load_engine(points_model, kind, onnx_dir=tmp_path / "onnx")
    loaded = load_cascade(points_model)
    images = uint8_images(200, seed=3)
    for point in engine.points:
        want = recognize_arrays(LoadedCascade(with_thresholds(loaded.stages, list(point.thresholds)), loaded.meta),
                                images)
        got = engine.recognize(images, thresholds=point.thresholds)
        assert [(r["exit"], r["macs"], r["class_index"]) for r in got] == \
            [(r["exit"], r["macs"], r["class_index"]) for r in want]


def test_a_ceiling_is_met_on_an_unseen_split(points_model: Path, test_split: np.ndarray) -> None:
    """docs/DESIGN.md 'Serving': a ceiling bounds the chosen point's held-out mean MACs; on images it was not
    fitted on, the point's mean MACs stay within 5% of that figure and at most the ceiling asked for."""
    engine = load_engine(points_model, "torch")
    costs = [p.mean_macs for p in engine.points]
    ceilings = [c * 1.06 for c in costs] + [(a + b) / 2 for a, b in zip(costs, costs[1:], strict=False)]
    for ceiling in ceilings:
        point = within(engine.points, ceiling)
        macs = float(np.mean([r["macs"] for r in engine.recognize(test_split, thresholds=point.thresholds)]))
        assert point.mean_macs <= ceiling
        assert abs(macs - point.mean_macs) <= 0.05 * point.mean_macs, point.name
        assert macs <= ceiling
