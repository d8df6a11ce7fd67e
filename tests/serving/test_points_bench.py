"""bench/points_on_test.py on a calibrated tiny model: every point the model carries, run by the engine at
its thresholds on a split it was not fitted on, beside its held-out figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import points_on_test
from pipeline.io import Split, save_split
from pipeline.routing.package import load_cascade
from pipeline.serving.engines import load_engine
from tests.routing.test_package import uint8_images


def test_every_point_is_read_on_test_beside_its_held_out_figures(points_model: Path, tmp_path: Path) -> None:
    images = uint8_images(400, seed=77)
    labels = np.random.default_rng(0).integers(0, 2, len(images))
    save_split(tmp_path / "test.npz", Split("test", images, labels, np.array([f"t{i}" for i in range(len(images))])))
    out = tmp_path / "points.json"
    assert points_on_test.main(["--model", str(points_model), "--data", str(tmp_path), "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    points = load_cascade(points_model).meta.operating_points
    assert [r["point"] for r in rows] == [p.name for p in points]
    engine = load_engine(points_model, "torch")
    for row, point in zip(rows, points, strict=True):
        answers = engine.recognize(images, thresholds=point.thresholds)
        assert row["test_mean_macs"] == pytest.approx(np.mean([a["macs"] for a in answers]))
        assert row["test_accuracy"] == pytest.approx(np.mean([a["class_index"] for a in answers] == labels))
        assert row["held_out_mean_macs"] == point.mean_macs


def test_a_model_without_points_is_refused_by_name(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="carries no operating points"):
        points_on_test.main(["--model", str(tiny_model), "--data", str(tmp_path)])
