"""One training step of a module: the chunk losses (cost-aware, soft targets, in-place distillation),
the sandwich rule, method B's supernet step and the fixed module's step."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.models.modules import NO_ARCH, SupernetModule
from pipeline.search.picks import pick_archs
from pipeline.search.probmodel import ProbModel, model_mi, supernet_step_loss
from pipeline.search.space import Arch, SearchSpace
from pipeline.train import distributed
from pipeline.train.config import TrainConfig
from pipeline.train.losses import cost_aware_loss


@dataclass(frozen=True)
class LossParams:
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


def _chunk_loss(module: nn.Module, x: torch.Tensor, y: torch.Tensor, arch: Arch, p: LossParams,
                teacher: torch.Tensor | None = None, distill: float = 0.0,
                soft: torch.Tensor | None = None) -> _Chunk:
    """Cost-aware loss of one chunk through one path (plus label smoothing, if any, in-place
    distillation from ``teacher`` logits (b, K) with weight ``distill``, and distillation from the
    soft targets ``soft`` (b, K) with weight ``p.kd``)."""
    _, logits = module(x, arch)  # (b, K)
    logits = logits.float()  # the loss in float32 also under bf16 autocast (a no-op in fp32 runs)
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
class StepOut:
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
              p: LossParams, soft: torch.Tensor | None = None) -> tuple[torch.Tensor | None, list[_Chunk]]:
    """Sandwich rule: the largest and the smallest path on the whole batch (the smallest distilled
    from the largest). Returns the teacher's logits (B, K) and the two chunks (empty when off)."""
    if not cfg.sandwich:
        return None, []
    largest, smallest = p.extremes
    top = _chunk_loss(module, x, y, largest, p, soft=soft)
    bottom = _chunk_loss(module, x, y, smallest, p, top.logits, cfg.distill, soft)
    return top.logits, [top, bottom]


def _supernet_step(module: nn.Module, x: torch.Tensor, y: torch.Tensor, archs: Sequence[Arch],
                   prev: ProbModel | None, cfg: TrainConfig, p: LossParams,
                   soft: torch.Tensor | None = None) -> StepOut:
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
        return StepOut(task.mean() + sandwich_loss, chunks, info, None)
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
    return StepOut(loss + sandwich_loss, chunks, info, new)


def _forward_step(module: nn.Module, h: torch.Tensor, y: torch.Tensor, model: ProbModel | None,
                  cfg: TrainConfig, p: LossParams, rng: np.random.Generator,
                  soft: torch.Tensor | None = None) -> StepOut:
    """Loss of one step: the whole batch through a fixed module, or chunks through picked paths."""
    if not isinstance(module, SupernetModule):
        chunk = _chunk_loss(module, h, y, NO_ARCH, p, soft=soft)
        return StepOut(chunk.loss, [chunk], {}, None)
    archs = _pick(cfg, model if model is not None else ProbModel.uniform(module.space), rng)
    return _supernet_step(module, h, y, archs, model, cfg, p, soft)


# ----------------------------------------------------------------------------------------- training


class StepNet(nn.Module):
    """One training step's forward as a module (what DistributedDataParallel wraps: one forward
    call per backward, however many paths the step runs)."""

    def __init__(self, module: nn.Module, cfg: TrainConfig, params: LossParams, rng: np.random.Generator):
        super().__init__()
        self.module = module
        self.cfg, self.params, self.rng = cfg, params, rng

    def forward(self, h: torch.Tensor, y: torch.Tensor, model: ProbModel | None,
                soft: torch.Tensor | None = None) -> StepOut:
        return _forward_step(self.module, h, y, model, self.cfg, self.params, self.rng, soft)
