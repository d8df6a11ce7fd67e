"""What the ``train`` stage feeds module k besides its images: the normalisation statistics (measured on
the training images for m1, inherited from m1 by every later module), the module's record, and the
distillation teacher's soft targets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline.io import Split, curriculum_index, read_json
from pipeline.models.modules import ModuleSpec, build_module
from pipeline.models.profile import CostModel
from pipeline.models.store import ModuleInfo
from pipeline.params.config import ConfigError
from pipeline.train.baselines import load_baselines, teacher_probabilities
from pipeline.train.config import TrainConfig

Stats = tuple[tuple[float, ...], tuple[float, ...]]


def curriculum(train: Split, ids_file: Path) -> tuple[np.ndarray, Split]:
    """The rows of ``train`` a module trains on (its curriculum id list, one id a line, repeats kept)
    and those rows as a split."""
    index = curriculum_index(train.ids, ids_file.read_text().splitlines())
    return index, train.subset(index)


def normalisation_stats(images: np.ndarray) -> Stats:
    """Per-channel mean and std of uint8 images (N, C, H, W) scaled to [0, 1], rounded to 4 decimals."""
    pixels = images.astype(np.float32) / 255.0
    mean = tuple(pixels.mean(axis=(0, 2, 3)).round(4).tolist())
    std = tuple(pixels.std(axis=(0, 2, 3)).round(4).tolist())
    return mean, std


def inherited_stats(models: Path) -> Stats:
    """The statistics m1 was trained with (its ``train/module.json``): every later module keeps them."""
    first = ModuleInfo.from_json(read_json(models / "m1" / "train" / "module.json"))
    return first.mean, first.std


def module_stats(k: int, train_images: np.ndarray, models: Path) -> Stats:
    """Module k's normalisation: measured on the training images for k == 1, else m1's."""
    return normalisation_stats(train_images) if k == 1 else inherited_stats(models)


def module_info(k: int, spec: ModuleSpec, costs: CostModel, num_classes: int, mean: tuple[float, ...],
                std: tuple[float, ...]) -> ModuleInfo:
    """Module k's record: its input shape (C, H, W) as the cost model profiled it."""
    in_shape = tuple(costs.table["modules"][k - 1]["input_shape"])
    return ModuleInfo(k, spec, in_shape[0], num_classes, in_shape, mean, std)


def initial_module(info: ModuleInfo, seed: int) -> nn.Module:
    """Module k untrained, its initial weights drawn after ``torch.manual_seed(seed + k)`` (global state:
    fine in a stage process)."""
    torch.manual_seed(seed + info.k)
    return build_module(info.spec, info.in_channels, info.num_classes)


def distillation_targets(cfg: TrainConfig, name: str, teacher: Path | None, images: np.ndarray,
                         index: np.ndarray, mean: tuple[float, ...],
                         std: tuple[float, ...]) -> tuple[np.ndarray, str] | None:
    """With ``cfg.kd > 0``: the teacher's flip-averaged probabilities, computed once per training image,
    then the curriculum's rows ``index``, and the line that names the teacher (the plain CNN of the
    baselines directory ``teacher`` more accurate on held-out images, :meth:`Baselines.teacher`);
    None with ``kd == 0`` (the teacher is not read)."""
    if not cfg.kd > 0:
        return None
    if teacher is None:
        raise ConfigError(f"train.kd = {cfg.kd} for {name} needs --teacher (the baselines directory: "
                          "its more accurate plain CNN is the teacher); set kd to 0 or pass --teacher")
    chosen, net, why = load_baselines(teacher).teacher()
    soft = teacher_probabilities(net, images, mean, std, cfg.kd_temperature)[index]
    return soft, f"train@{name}: distilled from {chosen} ({why})"
