"""The training recipe's typed config (``TrainConfig``, one per module: the common ``train`` section
with the module's ``modules.mK.train`` overrides) and its learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from pipeline.params.config import ConfigError, deep_merge, section
from pipeline.params.settings import section_problems
from pipeline.search.picks import PICKS

SCHEDULES = ("cosine", "step", "constant")
SAMPLERS = ("uniform", "probmodel")



# ----------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TrainConfig:
    """How one module trains; the method-B fields (``sampler`` on) matter for supernets only."""

    epochs: int
    batch_size: int
    lr: float
    min_steps: int = 0  # epochs are raised until training takes at least this many optimiser steps
    min_steps_hard: int = 0  # the floor instead, where grade found the data hard (pipeline.data.difficulty.is_hard)
    momentum: float = 0.9
    weight_decay: float = 5e-4
    schedule: str = "cosine"
    warmup_epochs: float = 0.0
    crop_padding: int = 0
    flip: bool = False
    erase: float = 0.0  # random erasing: probability per training image (0 = off)
    lam: float = 0.0
    mu: float = 0.0
    seed: int = 0
    label_smoothing: float = 0.0
    sampler: str = "probmodel"
    m: int = 4  # subnets per step (the batch is split into m chunks)
    pick: str = "entropy"  # method B's m subnets per step: entropy (Latin hypercube) | greedy | plain
    pool_factor: int = 8
    temperature: float = 0.1
    smoothing: float = 0.05
    step: float = 0.1  # MLE mixing step of P(i) with P(i-1)
    beta: float = 0.01
    mi_eps: float = 1e-3
    lambda_c: float = 0.1  # cost weight in perf
    sandwich: bool = False  # supernets: also train the largest and the smallest path on every batch
    distill: float = 0.0  # supernets with sandwich: weight of in-place distillation from the largest path
    utility: str = "rank"  # MLE weights from perf: rank (scale-free) | elite | softmax (raw perf / T)
    paired_perf: bool = True  # with sandwich: a path's perf is its CE minus the largest path's (same images)
    kd: float = 0.0  # weight of distillation from soft targets (a teacher's probabilities per image); 0 = off
    kd_hard: float | None = None  # kd instead where grade found the data hard; None = kd
    kd_temperature: float = 1.0  # the student's logits are divided by it (the soft targets were made at it)
    tries_hard: int = 1  # hard data: trained this many times (seed, seed + 1, ...), the best by training accuracy kept
    grad_clip: float = 0.0  # clip the gradients' global norm to this before each step; 0 = off
    processes: int = 1  # data-parallel ranks (the stage relaunches itself under torchrun when > 1)

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


def kd_on(cfg: TrainConfig, hard: bool) -> float:
    """Distillation's weight for this data: ``kd_hard`` on hard data where it is set, else ``kd``. On the
    scenes folder distillation from a 1,200-step ``plain_large`` (97% held out) stalled module 1: 37.5% /
    46.4% on calib over two initialisations at kd 1, 84.9% / 64.1% at kd 0; through the user's command, three
    seeds, the cascade 91.5 / 82.7 / 94.2% at kd 0 against 65.2 / 87.1 / 68.5% (docs/RESULTS.md "No
    distillation on hard data")."""
    return cfg.kd_hard if hard and cfg.kd_hard is not None else cfg.kd


def tries_on(cfg: TrainConfig, hard: bool) -> list[TrainConfig]:
    """The configs a module trains from on this data: ``cfg`` alone, or on hard data ``cfg.tries_hard`` of
    them with train seeds ``cfg.seed``, ``+ 1``, ... (the training seed draws the shuffling and augmentation;
    the initial weights stay the run's). On the scenes folder module 1 stalled with 2 of 15 training seeds
    (51.0% and 59.4% on calib, against 74.5-88.0%), both on one run's data, and the final training accuracy
    told the stalled ones (<= 72%) from the others (>= 79%) (docs/RESULTS.md "No distillation on hard data")."""
    n = cfg.tries_hard if hard else 1
    return [replace(cfg, seed=cfg.seed + t) for t in range(n)]


def best_try(train_accuracies: list[float]) -> int:
    """The try to keep: the highest final training accuracy, the earliest on a tie."""
    if not train_accuracies:
        raise ValueError("best_try needs at least one try")
    return max(range(len(train_accuracies)), key=lambda t: (train_accuracies[t], -t))


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
