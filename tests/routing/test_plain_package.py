"""A plain CNN shipped alone in the cascade's model format (pipeline.routing.packaging.plain_packaged)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.models.modules import ModuleSpec, PlainCNN, build_module
from pipeline.routing.engine import Stage, run_cascade
from pipeline.routing.package import CascadeMeta, load_cascade
from pipeline.routing.packaging import plain_packaged, save_cascade
from pipeline.routing.recognize import preprocess
from pipeline.train.baselines import plain_macs, plain_outputs

META = CascadeMeta(classes=("a", "b", "c"), image_shape=(3, 12, 12), mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))


def trained_looking(width: int = 4, seed: int = 0) -> PlainCNN:
    torch.manual_seed(seed)
    net = PlainCNN(width, 3, 3)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
        net.fc.weight *= 10
    return net.eval()


def test_a_plain_cnn_round_trips_and_answers_as_itself(tmp_path: Path) -> None:
    net = trained_looking()
    images = np.random.default_rng(1).integers(0, 256, (40, 3, 12, 12), dtype=np.uint8)
    macs = plain_macs(net, META.image_shape)
    stages, meta = plain_packaged(net, macs, META, {"routing": "plain_small"})
    directory = save_cascade(tmp_path / "model", stages, meta)
    manifest = json.loads((directory / "cascade.json").read_text())
    assert [m["spec"]["kind"] for m in manifest["modules"]] == ["plain"]
    assert manifest["modules"][0]["candidate_macs"] == [macs]
    loaded = load_cascade(directory)
    assert isinstance(loaded.stages[0].module, PlainCNN) and loaded.meta.info["routing"] == "plain_small"
    out = run_cascade(loaded.stages, preprocess(images, loaded.meta), confidence_kind="maxprob")
    logits, _ = plain_outputs(net, images, META.mean, META.std)
    assert torch.equal(out.pred, logits.argmax(dim=-1))
    assert out.macs.tolist() == [macs] * len(images) and out.exit_index.tolist() == [0] * len(images)


def test_a_plain_module_can_only_be_last(tmp_path: Path) -> None:
    plain = Stage(trained_looking(), (PlainCNN(4, 3, 3).default_arch(),), (100,), 0.5)
    fixed = build_module(ModuleSpec("fixed", 4), 3, 3).eval()
    after = Stage(fixed, (fixed.default_arch(),), (50,), float("inf"))
    with pytest.raises(ValueError, match="module 1 is a plain CNN"):
        save_cascade(tmp_path / "model", [plain, after], META)
    assert not (tmp_path / "model").exists()


def test_a_plain_spec_takes_only_its_width() -> None:
    assert build_module(ModuleSpec("plain", 6), 1, 4).width == 6
    with pytest.raises(ValueError, match="kind 'plain' takes only its width"):
        ModuleSpec("plain", 6, stride=2)
    with pytest.raises(ValueError, match="kind 'plain' takes only its width"):
        ModuleSpec("plain", 6, ops=("conv3", "dw3"), default_op="conv3")
