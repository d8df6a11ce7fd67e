"""Training one cascade module behind its frozen predecessors, and evaluating one of its paths.

A fixed module trains on its exit's cost-aware loss. A supernet module trains single-path: each
step splits the batch into m chunks and runs chunk j through one architecture a_j, so a step costs
one single-path pass over the batch whatever m and the sampler are (sampler ablations stay fair).
The sampler is either uniform (single-path one-shot) or method B's probability model, whose step
adds ``beta / (MI + eps)`` to the task loss and fits P(i) from the chunks' performance.

Determinism: data order and augmentation come from a ``torch.Generator`` per epoch, architecture
picks from a ``numpy.random.Generator``, both seeded from ``TrainConfig.seed``; the module's initial
weights are the caller's. Same weights, data and config give bitwise-identical weights on CPU.
"""

from __future__ import annotations

import glob
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from pipeline.config import ConfigError, deep_merge, section
from pipeline.device import MEMORY_FORMATS, as_memory_format, autocast, memory_format
from pipeline.io import atomic_path
from pipeline.models.modules import NO_ARCH, SupernetModule, confidence, eval_mode
from pipeline.search.probmodel import (
    PICKS,
    UTILITIES,
    ProbModel,
    model_mi,
    pick_archs,
    supernet_step_loss,
)
from pipeline.search.space import Arch, SearchSpace
from pipeline.train import distributed
from pipeline.train.data import ImageBatches
from pipeline.train.losses import cost_aware_loss

SCHEDULES = ("cosine", "step", "constant")
SAMPLERS = ("uniform", "probmodel")

EpochCallback = Callable[[int, dict[str, Any], nn.Module, "ProbModel | None"], None]


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


# ----------------------------------------------------------------------------------------- prefix


def _device(module: nn.Module) -> torch.device:
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@dataclass(frozen=True, eq=False)
class Prefix:
    """What turns a raw uint8 batch into module k's input: normalisation, then the frozen M1..M(k-1).

    The modules are done training: the prefix puts them in eval mode (BatchNorm uses, never updates,
    its running statistics) with ``requires_grad`` off, and runs them under ``torch.no_grad``.
    """

    stages: tuple[tuple[nn.Module, Arch], ...] = ()
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple((m, a) for m, a in self.stages))
        object.__setattr__(self, "mean", tuple(float(v) for v in np.atleast_1d(self.mean)))
        object.__setattr__(self, "std", tuple(float(v) for v in np.atleast_1d(self.std)))
        for module, _ in self.stages:
            module.eval().requires_grad_(False)

    def __contains__(self, module: nn.Module) -> bool:
        return any(module is m for m, _ in self.stages)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) normalised images -> (B, C_k, H_k, W_k) input of module k."""
        with torch.no_grad():
            for module, arch in self.stages:
                module.eval()  # again: a caller's .train() on a parent must not move BN statistics
                x, _ = module(x, arch)  # (B, C_j, H_j, W_j)
        return x

    def batches(self, images: np.ndarray, labels: np.ndarray, batch_size: int, device: torch.device,
                **augment: Any) -> ImageBatches:
        """Batches normalised the way this prefix expects."""
        return ImageBatches(images, labels, batch_size, mean=self.mean, std=self.std, device=device,
                            **augment)


# ----------------------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class _LossParams:
    """Everything a chunk's loss needs besides the data."""

    cost_of: Callable[[Arch], float]
    cost_max: float
    exit_saving: float
    lam: float
    mu: float
    label_smoothing: float
    lambda_c: float
    costs: dict[Arch, float] = field(default_factory=dict)  # cost_of may run a model: price each arch once
    extremes: tuple[Arch, Arch] = (NO_ARCH, NO_ARCH)  # (largest, smallest) path of a supernet
    kd: float = 0.0  # weight of distillation from soft targets
    kd_temperature: float = 1.0

    def cost(self, arch: Arch) -> float:
        if arch not in self.costs:
            self.costs[arch] = float(self.cost_of(arch))
        return self.costs[arch]


@dataclass
class _Chunk:
    loss: torch.Tensor  # () task loss, differentiable
    ce: torch.Tensor  # () plain cross-entropy, differentiable (perf uses it)
    correct: torch.Tensor  # () count, detached
    bce: float
    logits: torch.Tensor  # (b, K), detached


def soft_target_loss(student: torch.Tensor, soft: torch.Tensor, temperature: float) -> torch.Tensor:
    """Hinton et al.'s distillation term: temperature^2 * KL(soft || softmax(student / temperature)),
    mean over the batch; ``soft`` (b, K) are a teacher's probabilities made at the same temperature."""
    log_q = F.log_softmax(student / temperature, dim=-1)  # (b, K)
    kl = (soft * (soft.clamp_min(1e-12).log() - log_q)).sum(dim=-1)  # (b,)
    return temperature**2 * kl.mean()


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """:func:`soft_target_loss` from a teacher's logits (b, K) at temperature 1, KL(softmax(teacher) ||
    softmax(student)); the teacher is not trained by it (in-place distillation from the largest path)."""
    return soft_target_loss(student, torch.softmax(teacher.detach(), dim=-1), 1.0)


def _chunk_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor, arch: Arch, p: _LossParams,
                teacher: torch.Tensor | None = None, distill: float = 0.0,
                soft: torch.Tensor | None = None) -> _Chunk:
    """Cost-aware loss of one chunk through one path (plus label smoothing, if any, in-place
    distillation from ``teacher`` logits (b, K) with weight ``distill``, and distillation from the
    soft targets ``soft`` (b, K) with weight ``p.kd``)."""
    _, logits = module(x, arch)  # (b, K)
    cost = p.cost(arch)
    loss, parts = cost_aware_loss(logits, y, cost, p.cost_max, p.exit_saving, p.lam, p.mu)
    ce = F.cross_entropy(logits, y)
    if p.label_smoothing > 0:
        # Smoothed CE = (1 - e) CE + e * mean_k(-log p_k); add the difference, with the same cost weight.
        uniform_ce = -F.log_softmax(logits, dim=-1).mean(dim=-1).mean()
        weight = 1.0 + p.lam * (1.0 - min(max(cost / p.cost_max, 0.0), 1.0))
        loss = loss + p.label_smoothing * weight * (uniform_ce - ce)
    if teacher is not None and distill > 0:
        loss = loss + distill * distillation_loss(logits, teacher)
    if soft is not None and p.kd > 0:
        loss = loss + p.kd * soft_target_loss(logits, soft, p.kd_temperature)
    correct = (logits.argmax(dim=-1) == y).sum().detach()
    return _Chunk(loss, ce, correct, parts["bce"], logits.detach())


def _pick(cfg: TrainConfig, model: ProbModel, rng: np.random.Generator) -> list[Arch]:
    return pick_archs(model, cfg.m, rng, cfg.pick if cfg.sampler == "probmodel" else "plain", cfg.pool_factor)


@dataclass
class _StepOut:
    loss: torch.Tensor
    chunks: list[_Chunk]
    info: dict[str, Any]  # per-iteration record (supernets), floats and the most likely key
    model: ProbModel | None  # P(i), detached (probmodel sampler)


def extreme_archs(space: SearchSpace, cost_of: Callable[[Arch], float]) -> tuple[Arch, Arch]:
    """The most and the least expensive path of ``space`` under an additive ``cost_of``: per layer,
    the op that costs most (least) with every other layer held at its first choice."""
    base = {d.label: d.choices[0] for d in space.decisions}
    largest, smallest = {}, {}
    for d in space.decisions:
        priced = [(cost_of(space.make({**base, d.label: op})), i, op) for i, op in enumerate(d.choices)]
        largest[d.label] = max(priced, key=lambda t: (t[0], -t[1]))[2]
        smallest[d.label] = min(priced)[2]
    return space.make(largest), space.make(smallest)


def _sandwich(module: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
              p: _LossParams, soft: torch.Tensor | None = None) -> tuple[torch.Tensor | None, list[_Chunk]]:
    """Sandwich rule: the largest and the smallest path on the whole batch (the smallest distilled
    from the largest). Returns the teacher's logits (B, K) and the two chunks (empty when off)."""
    if not cfg.sandwich:
        return None, []
    largest, smallest = p.extremes
    top = _chunk_loss(module, x, y, largest, p, soft=soft)
    bottom = _chunk_loss(module, x, y, smallest, p, top.logits, cfg.distill, soft)
    return top.logits, [top, bottom]


def _supernet_step(module: nn.Module, x: torch.Tensor, y: torch.Tensor, archs: Sequence[Arch],
                   prev: ProbModel | None, cfg: TrainConfig, p: _LossParams,
                   soft: torch.Tensor | None = None) -> _StepOut:
    """Chunk j of the batch through arch j; method B's loss and P(i) when ``prev`` is given; the
    sandwich paths (if on) add their losses to the weights' loss but never feed the MLE."""
    n = min(len(archs), x.shape[0])
    archs = list(archs[:n])
    teacher, extra = _sandwich(module, x, y, cfg, p, soft)
    teachers = [None] * n if teacher is None else list(teacher.tensor_split(n))
    softs = [None] * n if soft is None else list(soft.tensor_split(n))
    chunks = [_chunk_loss(module, xj, yj, a, p, tj, cfg.distill, sj)
              for xj, yj, a, tj, sj in zip(x.tensor_split(n), y.tensor_split(n), archs, teachers, softs,
                                           strict=True)]
    task = torch.stack([c.loss for c in chunks])  # (m,)
    sandwich_loss = sum((c.loss for c in extra), torch.zeros((), device=x.device))
    cost = torch.tensor([p.cost(a) / p.cost_max for a in archs], dtype=torch.float64, device=x.device)
    ce = torch.stack([c.ce for c in chunks]).double()  # (m,) differentiable
    if cfg.paired_perf and teacher is not None:  # the same images through the largest path: removes
        # the chunks' difficulty from the comparison of the m paths (a control variate; detached)
        ce = ce - torch.stack([F.cross_entropy(tj, yj) for tj, yj in zip(teachers, y.tensor_split(n),
                                                                          strict=True)]).double().detach()
    perf = distributed.straight_through_mean(-ce - p.lambda_c * cost)  # (m,) differentiable; the ranks'
    # mean value (one process: itself), so that P(i) is the same on every rank
    best, mean = torch.stack([perf.detach().max(), perf.detach().mean()]).tolist()
    info: dict[str, Any] = {"best_perf": best, "mean_perf": mean}
    if prev is None:
        return _StepOut(task.mean() + sandwich_loss, chunks, info, None)
    loss, new, step_info = supernet_step_loss(task, perf, prev, archs, temperature=cfg.temperature,
                                              smoothing=cfg.smoothing, step=cfg.step, beta=cfg.beta,
                                              eps=cfg.mi_eps, utility=cfg.utility)
    mi = step_info["mi"]
    if mi is None and not prev.is_uniform():  # beta == 0: still log how much P(i-1), P(i) agree
        value = model_mi(prev, new)
        mi = None if value is None else float(value)
    info.update(entropy=step_info["entropy"], mi=math.nan if mi is None else mi,
                mi_loss=math.nan if step_info["mi_loss"] is None else step_info["mi_loss"],
                task_loss=step_info["task_loss"], most_likely=new.most_likely().key())
    return _StepOut(loss + sandwich_loss, chunks, info, new)


def _forward_step(module: nn.Module, h: torch.Tensor, y: torch.Tensor, model: ProbModel | None,
                  cfg: TrainConfig, p: _LossParams, rng: np.random.Generator,
                  soft: torch.Tensor | None = None) -> _StepOut:
    """Loss of one step: the whole batch through a fixed module, or chunks through picked paths."""
    if not isinstance(module, SupernetModule):
        chunk = _chunk_loss(module, h, y, NO_ARCH, p, soft=soft)
        return _StepOut(chunk.loss, [chunk], {}, None)
    archs = _pick(cfg, model if model is not None else ProbModel.uniform(module.space), rng)
    return _supernet_step(module, h, y, archs, model, cfg, p, soft)


# ----------------------------------------------------------------------------------------- training


class _StepNet(nn.Module):
    """One training step's forward as a module (what DistributedDataParallel wraps: one forward
    call per backward, however many paths the step runs)."""

    def __init__(self, module: nn.Module, cfg: TrainConfig, params: _LossParams, rng: np.random.Generator):
        super().__init__()
        self.module = module
        self.cfg, self.params, self.rng = cfg, params, rng

    def forward(self, h: torch.Tensor, y: torch.Tensor, model: ProbModel | None,
                soft: torch.Tensor | None = None) -> _StepOut:
        return _forward_step(self.module, h, y, model, self.cfg, self.params, self.rng, soft)



@dataclass
class TrainResult:
    """Per-epoch history, per-iteration records (probmodel sampler) and P(N) (or None)."""

    history: list[dict[str, Any]]
    iterations: list[dict[str, Any]]
    prob_model: ProbModel | None


def _optimizer(module: nn.Module, cfg: TrainConfig) -> torch.optim.SGD:
    """Nesterov SGD; no weight decay on BatchNorm and biases (1-d), which it would only shrink."""
    params = [q for q in module.parameters() if q.requires_grad]
    decay = [q for q in params if q.ndim > 1]
    no_decay = [q for q in params if q.ndim <= 1]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.SGD([g for g in groups if g["params"]], lr=cfg.lr, momentum=cfg.momentum,
                           nesterov=cfg.momentum > 0)


@dataclass(frozen=True)
class _StepStats:
    """What an epoch summary needs from one step, detached so that no graph outlives its step."""

    loss: float
    ce: tuple[float, ...]  # per chunk
    correct: int
    bce: tuple[float, ...]  # per chunk
    info: dict[str, Any]

    @classmethod
    def of(cls, out: _StepOut) -> _StepStats:
        n = len(out.chunks)
        parts = [out.loss.detach().reshape(1), *(c.ce.detach().reshape(1) for c in out.chunks),
                 *(c.correct.reshape(1) for c in out.chunks)]
        values = torch.cat([t.to(torch.float64) for t in parts])  # (1 + 2n,)
        bce = torch.tensor([c.bce for c in out.chunks], dtype=torch.float64, device=values.device)  # (n,)
        w = distributed.world()
        if w.distributed:  # the global batch's figures: ranks hold equally many rows of every chunk
            total = distributed.all_sum(torch.cat([values, bce]))
            values, bce = total[:1 + 2 * n], total[1 + 2 * n:] / w.size
            values[:1 + n] /= w.size
        v, b = values.tolist(), bce.tolist()  # one device sync each
        return cls(v[0], tuple(v[1:1 + n]), int(round(sum(v[1 + n:]))), tuple(b), out.info)


def _epoch_summary(steps: list[_StepStats], seen: int, seconds: float, lr: float) -> dict[str, Any]:
    record: dict[str, Any] = {
        "loss": float(np.mean([s.loss for s in steps])),
        "ce": float(np.mean([ce for s in steps for ce in s.ce])),
        "bce": float(np.mean([b for s in steps for b in s.bce])),
        "train_acc": sum(s.correct for s in steps) / max(seen, 1),
        "lr": lr,
        "seconds": seconds,
        "images_per_s": seen / max(seconds, 1e-9),
    }
    infos = [s.info for s in steps if s.info]
    if infos:
        record["best_perf"] = float(np.mean([i["best_perf"] for i in infos]))
        record["mean_perf"] = float(np.mean([i["mean_perf"] for i in infos]))
    return record


def train_module(
    module: nn.Module,
    prefix: Prefix,
    images: np.ndarray,
    labels: np.ndarray,
    cfg: TrainConfig,
    *,
    cost_of: Callable[[Arch], float],
    cost_max: float,
    exit_saving: float,
    on_epoch: EpochCallback | None = None,
    progress: bool = True,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    precision: str = "fp32",
    layout: str = "channels_last",
    soft_targets: np.ndarray | None = None,
) -> TrainResult:
    """Train ``module`` in place on images (N, C, H, W) uint8 seen through the frozen ``prefix``.

    ``on_epoch(epoch, record, module, prob_model)`` runs after each epoch (1-based), e.g. to
    log; ``prob_model`` is P after that epoch, or None without the probmodel sampler.

    With ``checkpoint_dir``, the full training state is saved there after every epoch (before
    ``on_epoch``; atomically; only the newest kept), and a call that finds a complete checkpoint of
    the same config there resumes after its epoch: the result is bitwise-identical to an
    uninterrupted run (see :func:`save_training_state`). The caller owns the directory (keys it by
    the inputs, deletes it after success).

    Inside a torch.distributed process group (``torchrun``), each rank trains on its share of every
    global batch under DistributedDataParallel (:mod:`pipeline.train.distributed`); only rank 0 saves
    checkpoints and shows progress, and every rank returns the same weights and P(N).
    ``precision="bf16"`` runs the forward passes under CUDA bf16 autocast (fp32: unchanged).
    ``layout`` is the memory format of the weights and batches while training (one of
    ``MEMORY_FORMATS``; see :func:`pipeline.device.memory_format`): ``channels_last`` is faster on
    CPUs and GPUs alike; the module comes back in the standard layout either way.
    ``soft_targets`` (N, K), a teacher's probabilities per image at ``cfg.kd_temperature``, add the
    distillation term with weight ``cfg.kd`` to every path's loss (ignored when ``cfg.kd`` is 0).
    """
    if layout not in MEMORY_FORMATS:
        raise ValueError(f"layout must be one of {MEMORY_FORMATS}, got {layout!r}")
    with memory_format([module, *(m for m, _ in prefix.stages)], layout):
        return _train_module(module, prefix, images, labels, cfg, cost_of=cost_of, cost_max=cost_max,
                             exit_saving=exit_saving, on_epoch=on_epoch, progress=progress,
                             checkpoint_dir=checkpoint_dir, precision=precision, layout=layout,
                             soft_targets=soft_targets)


def _train_module(module: nn.Module, prefix: Prefix, images: np.ndarray, labels: np.ndarray, cfg: TrainConfig,
                  *, cost_of: Callable[[Arch], float], cost_max: float, exit_saving: float,
                  on_epoch: EpochCallback | None, progress: bool, checkpoint_dir: str | os.PathLike[str] | None,
                  precision: str, layout: str, soft_targets: np.ndarray | None = None) -> TrainResult:
    """:func:`train_module` with the module and prefix already in ``layout``."""
    if module in prefix:
        raise ValueError("the module being trained is part of its own frozen prefix")
    if cost_max <= 0:
        raise ValueError(f"cost_max must be > 0, got {cost_max}")
    if not any(q.requires_grad for q in module.parameters()):
        raise ValueError("the module has no trainable parameters (a Prefix freezes the modules it holds)")
    supernet = isinstance(module, SupernetModule)
    device = _device(module)
    autocast(device, precision)  # a bad precision fails before any training
    w = distributed.world()
    rows = distributed.rank_rows(cfg.batch_size, min(cfg.m, cfg.batch_size) if supernet else 1, w).to(device)
    soft_t, labels_t, carried = None, None, labels
    if cfg.kd > 0:
        # With soft targets the batches carry each image's row index (the same shuffle and augmentation
        # draws as the labels would: only the gathered values differ); labels and targets are looked up.
        soft_t = _soft_targets(soft_targets, labels, device)  # (N, K)
        labels_t = torch.as_tensor(np.asarray(labels, dtype=np.int64), device=device)  # (N,)
        carried = np.arange(len(labels), dtype=np.int64)
    data = prefix.batches(images, carried, cfg.batch_size, device, shuffle=True, crop_padding=cfg.crop_padding,
                          flip=cfg.flip, erase=cfg.erase, drop_last=True, seed=cfg.seed)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1]))  # arch picks: own stream
    extremes = extreme_archs(module.space, cost_of) if supernet else (NO_ARCH, NO_ARCH)
    params = _LossParams(cost_of, cost_max, exit_saving, cfg.lam, cfg.mu, cfg.label_smoothing, cfg.lambda_c,
                         extremes=extremes, kd=cfg.kd, kd_temperature=cfg.kd_temperature)
    model = ProbModel.uniform(module.space) if supernet and cfg.sampler == "probmodel" else None
    optimizer = _optimizer(module, cfg)
    step_net = distributed.wrap(_StepNet(module, cfg, params, rng), device, find_unused=supernet)
    history: list[dict[str, Any]] = []
    iterations: list[dict[str, Any]] = []
    first = 1
    if checkpoint_dir is not None:
        restored = restore_training_state(checkpoint_dir, module, optimizer, cfg, rng)
        if restored is not None:
            first = restored["epoch"] + 1
            history, iterations = restored["history"], restored["iterations"]
            if restored["prob_model"] is not None:
                model = ProbModel(module.space, tuple(restored["prob_model"]))
    module.train()
    for epoch in range(first, cfg.epochs + 1):
        start, steps = time.perf_counter(), []
        bar = tqdm(data.epoch(epoch), total=len(data), desc=f"epoch {epoch}/{cfg.epochs}",
                   disable=not progress or not w.main, leave=False)
        epoch_lr = learning_rate(cfg, (epoch - 1) * len(data), len(data))
        for i, (x, y) in enumerate(bar):
            lr = learning_rate(cfg, (epoch - 1) * len(data) + i, len(data))
            for group in optimizer.param_groups:
                group["lr"] = lr
            if w.distributed:
                x, y = x[rows], y[rows]  # (B / ranks, C, H, W): this rank's share of every chunk
            soft = None
            if soft_t is not None and labels_t is not None:  # y holds row indices
                soft, y = soft_t[y.to(device)], labels_t[y.to(device)]  # (B, K), (B,)
            x = as_memory_format(x, layout)  # (B, C, H, W), strides of the layout
            with autocast(device, precision):
                h = prefix(x)  # (B, C_k, H_k, W_k)
                out = step_net(h, y, model, soft)
            optimizer.zero_grad(set_to_none=True)  # unpicked ops keep grad None: no decay, no momentum
            out.loss.backward()
            optimizer.step()
            if out.model is not None:
                model = out.model
                iterations.append({"epoch": epoch, "iteration": len(iterations) + 1, **out.info})
            steps.append(_StepStats.of(out))
            bar.set_postfix(loss=f"{steps[-1].loss:.3f}", refresh=False)
        bar.close()
        seconds = time.perf_counter() - start
        record = {"epoch": epoch, **_epoch_summary(steps, data.num_images, seconds, epoch_lr)}
        if supernet:
            record.update(_model_summary(model or ProbModel.uniform(module.space), steps))
        history.append(record)
        distributed.sync_buffers(module)  # the epoch ends with rank 0's BatchNorm statistics everywhere
        if checkpoint_dir is not None and w.main:
            save_training_state(checkpoint_dir, epoch, module, optimizer, cfg, rng, model, history,
                                iterations)
        distributed.barrier()  # no rank runs ahead of rank 0's checkpoint
        if on_epoch is not None:
            on_epoch(epoch, record, module, model)
    module.eval()
    return TrainResult(history, iterations, model)


def _soft_targets(soft: np.ndarray | None, labels: np.ndarray, device: torch.device) -> torch.Tensor:
    """Soft targets (N, K) as a float32 tensor on ``device``, after checking they are probabilities."""
    if soft is None:
        raise ValueError("cfg.kd > 0 needs soft_targets (a teacher's probabilities per training image)")
    soft = np.asarray(soft, dtype=np.float32)
    if soft.ndim != 2 or soft.shape[0] != len(labels):
        raise ValueError(f"soft_targets must be (N, K) with N = {len(labels)} images, got {soft.shape}")
    if not np.isfinite(soft).all() or (soft < 0).any() or not np.allclose(soft.sum(axis=1), 1.0, atol=1e-3):
        raise ValueError("soft_targets must be finite probabilities: rows >= 0 summing to 1")
    return torch.from_numpy(soft).to(device)


def _model_summary(model: ProbModel, steps: list[_StepStats]) -> dict[str, Any]:
    """Epoch-end entropy of P; mean finite MI over the epoch (NaN if none); P's most likely arch.

    Under the uniform sampler P stays uniform: entropy is log |space| and there is no most likely arch.
    """
    mis = [s.info["mi"] for s in steps if math.isfinite(s.info.get("mi", math.nan))]
    record: dict[str, Any] = {"entropy": model.entropy(), "mi": float(np.mean(mis)) if mis else math.nan}
    if not model.is_uniform():
        record["most_likely"] = model.most_likely().key()
    return record


# ----------------------------------------------------------------------------------------- evaluation


def module_outputs(module: nn.Module, prefix: Prefix, images: np.ndarray, arch: Arch, batch_size: int,
                   *, features: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exit logits (N, K) of one path on CPU, and its feature maps (N, C, H, W) only if asked (big)."""
    device = _device(module)
    data = prefix.batches(images, np.zeros(len(images), dtype=np.int64), batch_size, device)
    logits, maps = [], []
    with eval_mode(module), torch.no_grad():
        for x, _ in data:
            h, z = module(prefix(x), arch)  # (B, C, H, W), (B, K)
            logits.append(z.cpu())
            if features:
                maps.append(h.cpu())
    return torch.cat(logits), (torch.cat(maps) if features else None)


def recalibrate_batchnorm(module: nn.Module, prefix: Prefix, images: np.ndarray, arch: Arch,
                          batch_size: int = 256) -> None:
    """Re-estimate the running statistics of the BatchNorm layers that ``arch`` runs, from ``images``
    seen through ``prefix`` (plain averages over the batches, no momentum); weights stay as they are.

    A supernet's shared BatchNorm statistics average over every path trained; a single path's own
    statistics fit it better. Only the layers the path runs are touched (a forward of ``arch`` never
    reaches the others)."""
    device = _device(module)
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m, m.momentum) for m in norms]
    touched = []
    hooks = [m.register_forward_pre_hook(lambda m, _inputs: touched.append(m)) for m in norms]
    try:
        with eval_mode(module), torch.no_grad():
            # First pass: which BatchNorms does this path run? Reset only those.
            probe, _ = next(iter(prefix.batches(images[:2], np.zeros(2, dtype=np.int64), 2, device)))
            module(prefix(probe), arch)
    finally:
        for hook in hooks:
            hook.remove()
    used = {id(m): m for m in touched}.values()
    for m in used:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average: every batch counts the same
    data = prefix.batches(images, np.zeros(len(images), dtype=np.int64), batch_size, device)
    flags = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        for m in used:
            m.train()
        with torch.no_grad():
            for x, _ in data:
                module(prefix(x), arch)
    finally:
        for m, training in flags:
            m.training = training
        for m, momentum in saved:
            m.momentum = momentum


def evaluate_path(module: nn.Module, prefix: Prefix, images: np.ndarray, labels: np.ndarray, arch: Arch,
                  batch_size: int) -> dict[str, float]:
    """Accuracy, mean CE and mean confidence of one path's exit, without augmentation."""
    logits, _ = module_outputs(module, prefix, images, arch, batch_size)  # (N, K)
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))  # (N,)
    return {
        "acc": float((logits.argmax(dim=-1) == y).double().mean()),
        "ce": float(F.cross_entropy(logits.double(), y)),
        "conf_mean": float(confidence(logits).double().mean()),
    }


# ----------------------------------------------------------------------------------------- checkpoints


def save_checkpoint(path: str | os.PathLike[str], module: nn.Module,
                    optimizer_state: dict[str, Any] | None = None, epoch: int = 0,
                    prob_model: ProbModel | None = None) -> None:
    """Weights, optional optimizer state, epoch and P (as plain dicts), written atomically."""
    payload = {
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
        "optimizer": optimizer_state,
        "epoch": int(epoch),
        "prob_model": None if prob_model is None else prob_model.as_dict(),
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The whole payload of :func:`save_checkpoint` (tensors and plain data only: weights_only)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def load_module_state(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Just the weights, for ``module.load_state_dict``."""
    return load_checkpoint(path)["state_dict"]


# ----------------------------------------------------------------------------------------- resume

TIMING_KEYS = ("seconds", "images_per_s")  # per-epoch wall-clock fields: MLflow/metrics only, never outputs


def history_frame_records(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The epoch records without their timings (:data:`TIMING_KEYS`): what ``history.csv`` holds,
    so that two identical runs write byte-identical files."""
    return [{k: v for k, v in record.items() if k not in TIMING_KEYS} for record in history]


_STATE_NAME = "epoch_{:04d}.pt"


def _config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}


def save_training_state(directory: str | os.PathLike[str], epoch: int, module: nn.Module,
                        optimizer: torch.optim.Optimizer, cfg: TrainConfig, rng: np.random.Generator,
                        prob_model: ProbModel | None, history: list[dict[str, Any]],
                        iterations: list[dict[str, Any]]) -> Path:
    """Everything that decides the rest of training after ``epoch``: weights (with BatchNorm
    statistics), optimizer (momentum buffers, param-group LRs), P(i) as its exact float64 table,
    the arch-pick numpy generator, torch's (CPU and CUDA), numpy's legacy and python's global RNGs,
    the history so far and the config it belongs to. The LR schedule and the data order are pure
    functions of (config, epoch, step), so the epoch fixes them. Written to a temporary file, then
    ``os.replace``: a kill leaves either the previous checkpoint or the new one, never half of one.
    Older checkpoints are then removed."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": 1,
        "epoch": int(epoch),
        "config": _config_dict(cfg),
        "state_dict": {k: v.detach().cpu().clone() for k, v in module.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "prob_model": None if prob_model is None else [p.detach().cpu().clone() for p in prob_model.table],
        "rng": {
            "arch_picks": repr(rng.bit_generator.state),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy_global": _numpy_global_state(),
            "python": repr(random.getstate()),
        },
        "history": history,
        "iterations": iterations,
    }
    final = directory / _STATE_NAME.format(epoch)
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    torch.save(payload, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    for old in directory.glob("epoch_*.pt"):
        if old != final:
            old.unlink(missing_ok=True)
    return final


def _numpy_global_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return {"name": name, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}


def _numpy_global_from(d: Mapping[str, Any]) -> tuple[Any, ...]:
    return (d["name"], d["keys"].numpy().astype(np.uint32), d["pos"], d["has_gauss"], d["gauss"])


def _literal(text: str) -> Any:
    import ast

    return ast.literal_eval(text)


def restore_training_state(directory: str | os.PathLike[str], module: nn.Module,
                           optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                           rng: np.random.Generator) -> dict[str, Any] | None:
    """Load the newest readable checkpoint of ``cfg`` in ``directory`` into ``module``, ``optimizer``,
    ``rng`` and the global RNGs; returns its ``epoch``, ``history``, ``iterations`` and ``prob_model``
    (the list of P's tensors, or None), or None when there is none (fresh start). Unreadable or
    foreign checkpoints (another config, a half-written temp file) are skipped with a warning."""
    directory = Path(directory)
    for stale in directory.glob(".epoch_*.tmp"):
        stale.unlink(missing_ok=True)
    candidates = sorted(glob.glob(str(directory / "epoch_*.pt")), reverse=True)
    for path in candidates:
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
            if payload.get("config") != _config_dict(cfg) or not 1 <= payload["epoch"] <= cfg.epochs:
                raise ValueError("written for another config")
            module.load_state_dict(payload["state_dict"])
            optimizer.load_state_dict(payload["optimizer"])
            states = payload["rng"]
            arch_state = _literal(states["arch_picks"])
            numpy_state = _numpy_global_from(states["numpy_global"])
            python_state = _literal(states["python"])
        except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint: fall back to an older one
            warnings.warn(f"ignoring checkpoint {path}: {exc}", stacklevel=2)
            continue
        rng.bit_generator.state = arch_state
        torch.set_rng_state(states["torch"])
        if states["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])
        np.random.set_state(numpy_state)
        random.setstate(python_state)
        return {"epoch": int(payload["epoch"]), "history": list(payload["history"]),
                "iterations": list(payload["iterations"]), "prob_model": payload["prob_model"]}
    return None
