"""What the train stage feeds a module besides its images (pipeline.train.inputs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.io import Split, write_json
from pipeline.models.cascade import feature_shapes
from pipeline.models.modules import build_module
from pipeline.models.profile import CostModel
from pipeline.models.store import ModuleInfo
from pipeline.params.config import ConfigError
from pipeline.train.inputs import (
    curriculum,
    distillation_targets,
    initial_module,
    module_info,
    module_stats,
    normalisation_stats,
)
from tests.train.test_loop import SPEC, cfg


def test_normalisation_stats_per_channel_rounded_to_4_decimals() -> None:
    images = np.zeros((2, 2, 1, 2), dtype=np.uint8)  # (N, C, H, W)
    images[0, 0] = [[0, 255]]
    images[1, 0] = [[255, 0]]
    images[:, 1] = 1  # 1/255 = 0.0039215...
    mean, std = normalisation_stats(images)
    assert mean == (0.5, float(np.float32(0.0039))) and std == (0.5, 0.0)  # rounded in float32, as written
    assert isinstance(mean, tuple) and all(type(v) is float for v in mean + std)


def test_later_modules_inherit_m1s_statistics(tmp_path: Path) -> None:
    info = ModuleInfo(1, SPEC.modules[0], 1, 4, (1, 12, 12), (0.25,), (0.125,))
    (tmp_path / "m1" / "train").mkdir(parents=True)
    write_json(tmp_path / "m1" / "train" / "module.json", info.to_json())
    images = np.full((3, 1, 2, 2), 255, dtype=np.uint8)
    assert module_stats(2, images, tmp_path) == ((0.25,), (0.125,))
    assert module_stats(1, images, tmp_path / "missing") == ((1.0,), (0.0,))  # m1 measures, reads nothing


def test_curriculum_keeps_repeats_and_order(tmp_path: Path) -> None:
    train = Split("train", np.arange(4)[:, None, None, None].astype(np.uint8), np.array([0, 1, 2, 3]),
                  np.array(["a", "b", "c", "d"]))
    (tmp_path / "m1.txt").write_text("c\na\nc\n")
    index, subset = curriculum(train, tmp_path / "m1.txt")
    assert index.tolist() == [2, 0, 2]
    assert subset.ids.tolist() == ["c", "a", "c"] and subset.labels.tolist() == [2, 0, 2]


def test_module_info_takes_the_profiled_input_shape() -> None:
    costs = CostModel({"modules": [{"input_shape": [1, 12, 12]}, {"input_shape": [8, 12, 12]}]})
    info = module_info(2, SPEC.modules[1], costs, 4, (0.2,), (0.3,))
    assert (info.k, info.in_channels, info.num_classes, info.input_shape) == (2, 8, 4, (8, 12, 12))
    assert (info.mean, info.std) == ((0.2,), (0.3,))


def test_initial_module_is_seeded_by_seed_plus_k() -> None:
    shape = feature_shapes(SPEC)[1]
    info = ModuleInfo(2, SPEC.modules[1], shape[0], SPEC.num_classes, tuple(shape), (0.2,), (0.3,))
    torch.manual_seed(123)
    module = initial_module(info, seed=5)
    torch.manual_seed(7)  # seed + k
    reference = build_module(info.spec, info.in_channels, info.num_classes)
    other = initial_module(info, seed=6)
    for name, value in reference.state_dict().items():
        assert torch.equal(module.state_dict()[name], value), name
    assert any(not torch.equal(other.state_dict()[n], v) for n, v in reference.state_dict().items())


def test_distillation_targets_need_a_teacher_only_with_kd(tmp_path: Path) -> None:
    images, index = np.zeros((2, 1, 4, 4), dtype=np.uint8), np.array([0, 1])
    assert distillation_targets(cfg(kd=0.0), "m1", None, images, index, (0.2,), (0.3,)) is None
    assert distillation_targets(cfg(kd=0.0), "m1", tmp_path / "absent", images, index, (0.2,), (0.3,)) is None
    with pytest.raises(ConfigError, match="train.kd = 0.5 for m2 needs --teacher"):
        distillation_targets(cfg(kd=0.5), "m2", None, images, index, (0.2,), (0.3,))
