"""The training recipe's typed config (``TrainConfig``, one per module: the common ``train`` section
with the module's ``modules.mK.train`` overrides) and its learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from pipeline.params.choices import PICKS, SAMPLERS, SCHEDULES  # noqa: F401 (re-exported)
from pipeline.params.config import ConfigError, deep_merge, section
from pipeline.params.settings import schema_config

# ----------------------------------------------------------------------------------------- config


@schema_config("train", checked=True)
class TrainConfig:
    """How one module trains: the ``train`` section's keys (pipeline.params.schema.TRAIN, where each is
    documented), with a module's ``modules.mK.train`` overrides; the method-B keys (``sampler`` on) matter
    for supernets only. Built from keywords and checked by the schema (a bad value: ParamsError)."""

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
