"""The training recipe's typed config (``TrainConfig``, one per module: the common ``train`` section
with the module's ``modules.mK.train`` overrides) and its learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from pipeline.config import ConfigError, deep_merge, section
from pipeline.search.picks import PICKS
from pipeline.search.probmodel import UTILITIES

SCHEDULES = ("cosine", "step", "constant")
SAMPLERS = ("uniform", "probmodel")



# ----------------------------------------------------------------------------------------- config


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class TrainConfig:
    """How one module trains; the method-B fields (``sampler`` on) matter for supernets only."""

    epochs: int
    batch_size: int
    lr: float
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
    utility: str = "rank"  # MLE weights from perf: rank (scale-free) | elite | softmax (raw perf / T, the original)
    paired_perf: bool = True  # with sandwich: perf of a path is its CE minus the largest path's CE on the same images
    kd: float = 0.0  # weight of distillation from soft targets (a teacher's probabilities per image); 0 = off
    kd_temperature: float = 1.0  # the student's logits are divided by it (the soft targets were made at it)
    grad_clip: float = 0.0  # clip the gradients' global norm to this before each step; 0 = off
    processes: int = 1  # data-parallel ranks (the stage relaunches itself under torchrun when > 1)

    def __post_init__(self) -> None:
        for problem in _config_problems(self):
            raise ValueError(problem)

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


def _config_problems(c: TrainConfig) -> Iterator[str]:
    """Messages naming the offending field, ``TrainConfig.<field> ...``, in field order."""
    checks: list[tuple[str, bool, str]] = [
        ("epochs", _is_int(c.epochs) and c.epochs >= 1, "an int >= 1"),
        ("batch_size", _is_int(c.batch_size) and c.batch_size >= 1, "an int >= 1"),
        ("lr", _is_number(c.lr) and c.lr > 0, "a number > 0"),
        ("momentum", _is_number(c.momentum) and 0 <= c.momentum < 1, "in [0, 1)"),
        ("weight_decay", _is_number(c.weight_decay) and c.weight_decay >= 0, "a number >= 0"),
        ("schedule", c.schedule in SCHEDULES, f"one of {SCHEDULES}"),
        ("warmup_epochs", _is_number(c.warmup_epochs) and 0 <= c.warmup_epochs < c.epochs,
         "a number in [0, epochs)"),
        ("crop_padding", _is_int(c.crop_padding) and c.crop_padding >= 0, "an int >= 0"),
        ("flip", isinstance(c.flip, bool), "a bool"),
        ("erase", _is_number(c.erase) and 0 <= c.erase <= 1, "a probability in [0, 1]"),
        ("lam", _is_number(c.lam) and c.lam >= 0, "a number >= 0"),
        ("mu", _is_number(c.mu) and c.mu >= 0, "a number >= 0"),
        ("seed", _is_int(c.seed) and c.seed >= 0, "an int >= 0"),
        ("label_smoothing", _is_number(c.label_smoothing) and 0 <= c.label_smoothing < 1, "in [0, 1)"),
        ("sampler", c.sampler in SAMPLERS, f"one of {SAMPLERS}"),
        ("m", _is_int(c.m) and 1 <= c.m <= c.batch_size, "an int in [1, batch_size]"),
        ("pick", c.pick in PICKS, f"one of {PICKS}"),
        ("pool_factor", _is_int(c.pool_factor) and c.pool_factor >= 1, "an int >= 1"),
        ("temperature", _is_number(c.temperature) and c.temperature > 0, "a number > 0"),
        ("smoothing", _is_number(c.smoothing) and c.smoothing >= 0, "a number >= 0"),
        ("step", _is_number(c.step) and 0 < c.step <= 1, "in (0, 1]"),
        ("beta", _is_number(c.beta) and c.beta >= 0, "a number >= 0"),
        ("mi_eps", _is_number(c.mi_eps) and c.mi_eps > 0, "a number > 0"),
        ("lambda_c", _is_number(c.lambda_c) and c.lambda_c >= 0, "a number >= 0"),
        ("sandwich", isinstance(c.sandwich, bool), "a bool"),
        ("distill", _is_number(c.distill) and c.distill >= 0 and (c.distill == 0 or c.sandwich is True),
         "a number >= 0, and 0 unless sandwich is on (the largest path is the teacher)"),
        ("utility", c.utility in UTILITIES, f"one of {UTILITIES}"),
        ("paired_perf", isinstance(c.paired_perf, bool), "a bool"),
        ("kd", _is_number(c.kd) and c.kd >= 0, "a number >= 0"),
        ("kd_temperature", _is_number(c.kd_temperature) and c.kd_temperature > 0, "a number > 0"),
        ("grad_clip", _is_number(c.grad_clip) and c.grad_clip >= 0, "a number >= 0 (0: off)"),
        ("processes", _is_int(c.processes) and c.processes >= 1, "an int >= 1"),
    ]
    for name, ok, wanted in checks:
        if not ok:
            yield f"TrainConfig.{name} must be {wanted}, got {getattr(c, name)!r}"


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
