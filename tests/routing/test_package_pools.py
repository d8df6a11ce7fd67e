"""A module 1 that max-pools (``spec.pools``) through the model directory: its feature shapes, MACs and
answers survive save and load and the ONNX export, and the next module is built at the pooled side."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes
from pipeline.models.cost import count_macs
from pipeline.models.modules import ModuleSpec
from pipeline.routing.engine import build_stage, run_cascade
from pipeline.routing.package import load_cascade
from pipeline.routing.packaging import save_cascade
from pipeline.routing.recognize import preprocess, recognize_arrays
from pipeline.search.space import Arch
from tests.routing.test_package import META, uint8_images

POOLED = CascadeSpec(in_channels=1, num_classes=4, image_size=16, modules=(
    ModuleSpec("fixed", 8, 1, 3, pools=2),  # exit 1 at 4x4
    ModuleSpec("fixed", 16, 2, 1),  # 2x2
))


def test_a_pooled_module_1_round_trips_through_the_model_directory(tmp_path: Path) -> None:
    modules = build_modules(POOLED, seed=0).eval()
    shapes = feature_shapes(POOLED)
    assert shapes[1] == (8, 4, 4) and shapes[2] == (16, 2, 2)
    thresholds = (0.5, 1.01)
    stages = [build_stage(m, shapes[k], (Arch(),), thresholds[k]) for k, m in enumerate(modules)]
    assert stages[0].candidate_macs[0] == count_macs(modules[0], shapes[0]) > 0
    directory = save_cascade(tmp_path / "model", stages, dataclasses.replace(META, info={}))
    loaded = load_cascade(directory)
    x = preprocess(uint8_images(64, seed=3), META)
    expected, got = run_cascade(stages, x), run_cascade(loaded.stages, x)
    for name in ("pred", "exit_index", "macs"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    assert loaded.stages[0].module.spec.pools == 2
    from pipeline.serving.onnx_engine import OnnxCascade  # the ONNX export pools as torch does
    from pipeline.serving.onnx_export import export_model_dir

    images = uint8_images(64, seed=4)
    onnx_rows = OnnxCascade(export_model_dir(directory, tmp_path / "onnx")).recognize(images)
    torch_rows = recognize_arrays(loaded, images)
    assert [(r["class_index"], r["exit"]) for r in onnx_rows] == [(r["class_index"], r["exit"]) for r in torch_rows]
