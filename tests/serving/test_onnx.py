"""The ONNX export and the ONNX Runtime engine answer as the torch engine does (pipeline.serving)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import recognize_arrays
from pipeline.serving.engines import load_engine
from pipeline.serving.onnx_engine import OnnxCascade
from pipeline.serving.onnx_export import MANIFEST, export_model_dir
from tests.routing.test_package import uint8_images


def _same(a: list[dict], b: list[dict]) -> None:
    assert [(r["class_index"], r["exit"], r["subnets"], r["macs"]) for r in a] == \
           [(r["class_index"], r["exit"], r["subnets"], r["macs"]) for r in b]
    assert max(abs(r["confidence"] - s["confidence"]) for r, s in zip(a, b, strict=True)) < 1e-5


@pytest.mark.parametrize("fixture", ["tiny_model", "tiny_ensemble_model"])
def test_onnx_engine_answers_as_torch_with_routes_and_exits(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    model = request.getfixturevalue(fixture)
    exported = export_model_dir(model, tmp_path / "onnx")
    manifest = json.loads((exported / MANIFEST).read_text())
    assert len(manifest["stages"]) == 3 and len(manifest["stages"][1]["paths"]) == 2  # a routed supernet
    assert manifest["stages"][1]["predictor"] is not None
    images = uint8_images(400, seed=5)
    torch_rows = recognize_arrays(load_cascade(model), images)
    onnx_rows = OnnxCascade(exported).recognize(images)
    _same(torch_rows, onnx_rows)
    assert len({r["exit"] for r in onnx_rows}) >= 2  # the test images really leave at different exits
    assert len({tuple(r["subnets"]) for r in onnx_rows}) >= 3  # and take different routes


def test_static_path_answers_at_the_last_exit_in_both_engines(tiny_model: Path, tmp_path: Path) -> None:
    images = uint8_images(100, seed=6)
    torch_engine = load_engine(tiny_model, "torch")
    onnx_engine = load_engine(tiny_model, "onnx", onnx_dir=tmp_path / "onnx")
    static_torch = torch_engine.recognize(images, exits=False)
    static_onnx = onnx_engine.recognize(images, exits=False)
    _same(static_torch, static_onnx)
    assert {r["exit"] for r in static_onnx} == {3}
    early = onnx_engine.recognize(images)
    assert sum(r["macs"] for r in early) < sum(r["macs"] for r in static_onnx)  # the exits save


def test_a_tampered_export_is_refused_naming_the_file(tiny_model: Path, tmp_path: Path) -> None:
    exported = export_model_dir(tiny_model, tmp_path / "onnx")
    victim = exported / "module2_path1.onnx"
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(ValueError, match="module2_path1.onnx"):
        OnnxCascade(exported)
    (exported / MANIFEST).write_text("{}")
    with pytest.raises(ValueError, match="not a cascade-onnx manifest"):
        OnnxCascade(exported)


def test_torch_engine_refuses_an_onnx_export(tiny_model: Path, tmp_path: Path) -> None:
    exported = export_model_dir(tiny_model, tmp_path / "onnx")
    with pytest.raises(ValueError, match="--engine onnx"):
        load_engine(exported, "torch")
    with pytest.raises(ValueError, match="engine must be one of"):
        load_engine(tiny_model, "tensorrt")
    assert load_engine(exported, "onnx").recognize(np.zeros((1, 1, 16, 16), np.uint8))[0]["exit"] >= 1


@pytest.mark.parametrize("kind", ["maxprob", "margin"])
def test_numpy_confidence_matches_the_torch_one(kind: str) -> None:
    import torch

    from pipeline.models.modules import confidence as torch_confidence
    from pipeline.serving.onnx_engine import confidence

    logits = np.random.default_rng(0).normal(size=(200, 7)).astype(np.float32) * 3
    expected = torch_confidence(torch.from_numpy(logits), kind).numpy()
    np.testing.assert_allclose(confidence(logits, kind), expected, rtol=0, atol=1e-6)


def test_a_pool_whose_output_does_not_divide_its_input_exports_exactly(tmp_path: Path) -> None:
    """The default model's exit heads pool 14x14 to 4x4, which ONNX's exporter cannot express as an
    adaptive pool: it is exported as two averaging matrix products and agrees with torch's pool."""
    import onnxruntime as ort
    import torch
    from torch import nn

    from pipeline.serving.onnx_export import _export

    net = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.AdaptiveAvgPool2d(4), nn.Flatten())
    x = torch.randn(5, 2, 14, 14)
    _export(net, x[:2], tmp_path / "pool.onnx", ["out"])
    session = ort.InferenceSession(str(tmp_path / "pool.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = net(x).numpy()
    np.testing.assert_allclose(session.run(None, {"input": x.numpy()})[0], expected, atol=1e-5)
    assert isinstance(net[1], nn.AdaptiveAvgPool2d)  # the model itself is left as it was
