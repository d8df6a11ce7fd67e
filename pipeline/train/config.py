"""The training recipe's typed config (``TrainConfig``, one per module: the common ``train`` section
with the module's ``modules.mK.train`` overrides) and its learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from pipeline.params.config import ConfigError, deep_merge, section
from pipeline.params.settings import schema_default, section_problems
from pipeline.search.picks import PICKS

SCHEDULES = ("cosine", "step", "constant")
SAMPLERS = ("uniform", "probmodel")



# ----------------------------------------------------------------------------------------- config


def _default(key: str) -> Any:
    return schema_default("train", key)  # each default written once: pipeline.params.schema.TRAIN


@dataclass(frozen=True)
class TrainConfig:
    """How one module trains; the method-B fields (``sampler`` on) matter for supernets only."""

    epochs: int
    batch_size: int
    lr: float
    min_steps: int = _default("min_steps")  # epochs are raised until training takes at least this many optimiser steps
    # the floor instead, where grade found the data hard (pipeline.data.difficulty.is_hard)
    min_steps_hard: int = _default("min_steps_hard")
    momentum: float = _default("momentum")
    weight_decay: float = _default("weight_decay")
    schedule: str = _default("schedule")
    warmup_epochs: float = _default("warmup_epochs")
    crop_padding: int = _default("crop_padding")
    flip: bool = _default("flip")
    erase: float = _default("erase")  # random erasing: probability per training image (0 = off)
    lam: float = _default("lam")
    mu: float = _default("mu")
    seed: int = _default("seed")
    label_smoothing: float = _default("label_smoothing")
    sampler: str = _default("sampler")
    m: int = _default("m")  # subnets per step (the batch is split into m chunks)
    pick: str = _default("pick")  # method B's m subnets per step: entropy (Latin hypercube) | greedy | plain
    pool_factor: int = _default("pool_factor")
    temperature: float = _default("temperature")
    smoothing: float = _default("smoothing")
    step: float = _default("step")  # MLE mixing step of P(i) with P(i-1)
    beta: float = _default("beta")
    mi_eps: float = _default("mi_eps")
    lambda_c: float = _default("lambda_c")  # cost weight in perf
    sandwich: bool = _default("sandwich")  # supernets: also train the largest and the smallest path on every batch
    # supernets with sandwich: weight of in-place distillation from the largest path
    distill: float = _default("distill")
    utility: str = _default("utility")  # MLE weights from perf: rank (scale-free) | elite | softmax (raw perf / T)
    # with sandwich: a path's perf is its CE minus the largest path's (same images)
    paired_perf: bool = _default("paired_perf")
    # weight of distillation from soft targets (a teacher's probabilities per image); 0 = off
    kd: float = _default("kd")
    # the student's logits are divided by it (the soft targets were made at it)
    kd_temperature: float = _default("kd_temperature")
    grad_clip: float = _default("grad_clip")  # clip the gradients' global norm to this before each step; 0 = off
    processes: int = _default("processes")  # data-parallel ranks (the stage relaunches itself under torchrun when > 1)

    def __post_init__(self) -> None:
        for problem in section_problems({f.name: getattr(self, f.name) for f in fields(self)}, "train",
                                        "TrainConfig"):
            raise ValueError(problem)  # the schema's check (pipeline.params.schema.TRAIN), the first problem

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        """Build from plain params; unknown keys are an error, not ignored."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if "entropy_selection" in unknown:
            raise ValueError(f"TrainConfig: entropy_selection was replaced by pick, one of {PICKS} "
                             "(true = greedy, the old pool rule; false = plain)")
        if unknown:
            raise ValueError(f"TrainConfig: unknown keys {unknown}")
        return cls(**d)


def module_train_config(params: Mapping[str, Any], name: str, seed: int) -> TrainConfig:
    """Module ``name``'s config: the params' ``train`` section with ``modules.<name>.train`` laid over
    it, ``seed`` unless set; a bad value raises ConfigError naming both sections."""
    merged = deep_merge(section(params, "train"), params["modules"][name].get("train") or {})
    merged.setdefault("seed", seed)
    try:
        return TrainConfig.from_dict(merged)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"params: train / modules.{name}.train: {exc}") from None


def epochs_for(epochs: int, min_steps: int, images: int, batch_size: int) -> int:
    """``epochs``, raised where ``epochs`` passes over ``images`` would take fewer than ``min_steps``
    optimiser steps (an epoch is ``images // batch_size`` steps, at least one: the last partial batch is
    dropped). On a small folder 8 epochs are a few hundred steps, too few for the larger models to learn
    (docs/RESULTS.md, "Why nothing learns the scenes"); on Fashion-MNIST's 60,000 images it changes nothing."""
    per_epoch = max(1, images // batch_size)
    return max(epochs, math.ceil(min_steps / per_epoch))


def step_floor(min_steps: int, min_steps_hard: int, hard: bool) -> int:
    """The step floor of a run: ``min_steps``, or ``min_steps_hard`` where it is larger and the data is hard
    (on the scenes folder module 1 read 58% on calib at 600 steps and 81% at 1,200, still underfitting its
    training images; docs/RESULTS.md "Hard data trains longer")."""
    return max(min_steps, min_steps_hard) if hard else min_steps


def sized_to(cfg: TrainConfig, images: int, hard: bool = False) -> TrainConfig:
    """``cfg`` with its epochs raised to its step floor (``step_floor``) over ``images`` images."""
    floor = step_floor(cfg.min_steps, cfg.min_steps_hard, hard)
    return replace(cfg, epochs=epochs_for(cfg.epochs, floor, images, cfg.batch_size))


def epochs_note(name: str, epochs: int, raised: int, min_steps: int, images: int, batch_size: int,
                hard: bool = False) -> str:
    """The line a stage prints when its step floor raised its epochs."""
    floor = f"min_steps_hard {min_steps:,} (grade found the data hard)" if hard else f"min_steps {min_steps:,}"
    return (f"{name}: {epochs} epochs of {images:,} images are {epochs * max(1, images // batch_size):,} steps "
            f"at batch {batch_size}, under {floor}: training {raised} epochs")


def learning_rate(cfg: TrainConfig, iteration: int, iters_per_epoch: int) -> float:
    """LR of one step: linear warmup, then cosine to 0, x0.1 at 50% and 75%, or constant."""
    warmup = round(cfg.warmup_epochs * iters_per_epoch)
    if iteration < warmup:
        return cfg.lr * (iteration + 1) / warmup
    total = cfg.epochs * iters_per_epoch
    progress = (iteration - warmup) / max(total - warmup, 1)  # [0, 1)
    if cfg.schedule == "cosine":
        return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    if cfg.schedule == "step":
        return cfg.lr * 0.1 ** ((progress >= 0.5) + (progress >= 0.75))
    return cfg.lr
