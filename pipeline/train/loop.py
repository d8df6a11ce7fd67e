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

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from pipeline.device import MEMORY_FORMATS, as_memory_format, autocast, memory_format
from pipeline.models.modules import NO_ARCH, SupernetModule
from pipeline.search.probmodel import (
    ProbModel,
)
from pipeline.search.space import Arch
from pipeline.train import distributed
from pipeline.train.config import TrainConfig, learning_rate
from pipeline.train.prefix import Prefix, module_device
from pipeline.train.resume import restore_training_state, save_training_state
from pipeline.train.steps import LossParams, StepNet, StepOut, extreme_archs

EpochCallback = Callable[[int, dict[str, Any], nn.Module, "ProbModel | None"], None]


@dataclass
class TrainResult:
    """Per-epoch history, per-iteration records (probmodel sampler) and P(N) (or None)."""

    history: list[dict[str, Any]]
    iterations: list[dict[str, Any]]
    prob_model: ProbModel | None


class TrainingDiverged(ValueError):
    """The training loss became NaN or infinite: the run stops instead of training on garbage."""


def make_optimizer(module: nn.Module, cfg: TrainConfig) -> torch.optim.SGD:
    """The training recipe's optimizer for ``module``'s trainable parameters: SGD at ``cfg.lr`` with
    ``cfg.momentum`` (Nesterov when > 0); ``cfg.weight_decay`` on the weights (ndim > 1), none on
    BatchNorm and biases (1-d), which it would only shrink. The lr of each step is
    :func:`pipeline.train.config.learning_rate`. Modules, baselines and the benches all use it."""
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
    def of(cls, out: StepOut) -> _StepStats:
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


def _check_trainable(module: nn.Module, prefix: Prefix, cost_max: float) -> None:
    if module in prefix:
        raise ValueError("the module being trained is part of its own frozen prefix")
    if cost_max <= 0:
        raise ValueError(f"cost_max must be > 0, got {cost_max}")
    if not any(q.requires_grad for q in module.parameters()):
        raise ValueError("the module has no trainable parameters (a Prefix freezes the modules it holds)")


def _kd_targets(cfg: TrainConfig, soft_targets: np.ndarray | None, labels: np.ndarray,
                device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None, np.ndarray]:
    """Soft targets, labels on the device and what the batches carry (labels, or row indices with KD)."""
    if cfg.kd <= 0:
        return None, None, labels
    # With soft targets the batches carry each image's row index (the same shuffle and augmentation
    # draws as the labels would: only the gathered values differ); labels and targets are looked up.
    soft_t = _soft_targets(soft_targets, labels, device)  # (N, K)
    labels_t = torch.as_tensor(np.asarray(labels, dtype=np.int64), device=device)  # (N,)
    return soft_t, labels_t, np.arange(len(labels), dtype=np.int64)


@dataclass
class _Run:
    """One training run's parts and its running state (the sampler's model, the records)."""

    module: nn.Module
    prefix: Prefix
    cfg: TrainConfig
    data: Any  # Prefix.batches
    optimizer: torch.optim.Optimizer
    step_net: nn.Module
    rows: torch.Tensor  # this rank's rows of every chunk
    kd: tuple[torch.Tensor | None, torch.Tensor | None]  # soft targets and labels looked up by row index
    device: torch.device
    precision: str
    layout: str
    model: ProbModel | None
    history: list[dict[str, Any]]
    iterations: list[dict[str, Any]]


def _step(run: _Run, x: torch.Tensor, y: torch.Tensor, epoch: int, i: int, w: Any) -> _StepStats:
    """One optimiser step on a batch; a non-finite loss raises ``TrainingDiverged`` naming the step."""
    cfg, n = run.cfg, len(run.data)
    for group in run.optimizer.param_groups:
        group["lr"] = learning_rate(cfg, (epoch - 1) * n + i, n)
    if w.distributed:
        x, y = x[run.rows], y[run.rows]  # (B / ranks, C, H, W): this rank's share of every chunk
    soft = None
    soft_t, labels_t = run.kd
    if soft_t is not None and labels_t is not None:  # y holds row indices
        soft, y = soft_t[y.to(run.device)], labels_t[y.to(run.device)]  # (B, K), (B,)
    x = as_memory_format(x, run.layout)  # (B, C, H, W), strides of the layout
    with autocast(run.device, run.precision):
        h = run.prefix(x)  # (B, C_k, H_k, W_k)
        out = run.step_net(h, y, run.model, soft)
    run.optimizer.zero_grad(set_to_none=True)  # unpicked ops keep grad None: no decay, no momentum
    out.loss.backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.module.parameters(), cfg.grad_clip)
    run.optimizer.step()
    if out.model is not None:
        run.model = out.model
        run.iterations.append({"epoch": epoch, "iteration": len(run.iterations) + 1, **out.info})
    stats = _StepStats.of(out)
    if not math.isfinite(stats.loss):
        raise TrainingDiverged(f"training diverged: the loss is {stats.loss} at epoch {epoch}, "
                               f"step {i + 1} of {n}; lower train.lr, set train.grad_clip "
                               f"(e.g. 5) or lower train.kd")
    return stats


def _epoch(run: _Run, epoch: int, w: Any, progress: bool) -> dict[str, Any]:
    """One epoch of steps and its record (with the sampler's summary for a supernet)."""
    cfg, start, steps = run.cfg, time.perf_counter(), []
    bar = tqdm(run.data.epoch(epoch), total=len(run.data), desc=f"epoch {epoch}/{cfg.epochs}",
               disable=not progress or not w.main, leave=False)
    epoch_lr = learning_rate(cfg, (epoch - 1) * len(run.data), len(run.data))
    for i, (x, y) in enumerate(bar):
        steps.append(_step(run, x, y, epoch, i, w))
        bar.set_postfix(loss=f"{steps[-1].loss:.3f}", refresh=False)
    bar.close()
    seconds = time.perf_counter() - start
    record = {"epoch": epoch, **_epoch_summary(steps, run.data.num_images, seconds, epoch_lr)}
    if isinstance(run.module, SupernetModule):
        record.update(_model_summary(run.model or ProbModel.uniform(run.module.space), steps))
    return record


def _train_module(module: nn.Module, prefix: Prefix, images: np.ndarray, labels: np.ndarray, cfg: TrainConfig,
                  *, cost_of: Callable[[Arch], float], cost_max: float, exit_saving: float,
                  on_epoch: EpochCallback | None, progress: bool, checkpoint_dir: str | os.PathLike[str] | None,
                  precision: str, layout: str, soft_targets: np.ndarray | None = None) -> TrainResult:
    """:func:`train_module` with the module and prefix already in ``layout``."""
    _check_trainable(module, prefix, cost_max)
    supernet = isinstance(module, SupernetModule)
    device = module_device(module)
    autocast(device, precision)  # a bad precision fails before any training
    w = distributed.world()
    rows = distributed.rank_rows(cfg.batch_size, min(cfg.m, cfg.batch_size) if supernet else 1, w).to(device)
    soft_t, labels_t, carried = _kd_targets(cfg, soft_targets, labels, device)
    data = prefix.batches(images, carried, cfg.batch_size, device, shuffle=True, crop_padding=cfg.crop_padding,
                          flip=cfg.flip, erase=cfg.erase, drop_last=True, seed=cfg.seed)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 1]))  # arch picks: own stream
    extremes = extreme_archs(module.space, cost_of) if supernet else (NO_ARCH, NO_ARCH)
    params = LossParams(cost_of, cost_max, exit_saving, cfg.lam, cfg.mu, cfg.label_smoothing, cfg.lambda_c,
                         extremes=extremes, kd=cfg.kd, kd_temperature=cfg.kd_temperature)
    model = ProbModel.uniform(module.space) if supernet and cfg.sampler == "probmodel" else None
    optimizer = make_optimizer(module, cfg)
    step_net = distributed.wrap(StepNet(module, cfg, params, rng), device, find_unused=supernet)
    run = _Run(module, prefix, cfg, data, optimizer, step_net, rows, (soft_t, labels_t), device, precision, layout,
               model, [], [])
    first = 1
    restored = None if checkpoint_dir is None else restore_training_state(checkpoint_dir, module, optimizer, cfg, rng)
    if restored is not None:
        first = restored["epoch"] + 1
        run.history, run.iterations = restored["history"], restored["iterations"]
        if restored["prob_model"] is not None:
            run.model = ProbModel(module.space, tuple(restored["prob_model"]))
    module.train()
    for epoch in range(first, cfg.epochs + 1):
        record = _epoch(run, epoch, w, progress)
        run.history.append(record)
        distributed.sync_buffers(module)  # the epoch ends with rank 0's BatchNorm statistics everywhere
        if checkpoint_dir is not None and w.main:
            save_training_state(checkpoint_dir, epoch, module, optimizer, cfg, rng, run.model, run.history,
                                run.iterations)
        distributed.barrier()  # no rank runs ahead of rank 0's checkpoint
        if on_epoch is not None:
            on_epoch(epoch, record, module, run.model)
    module.eval()
    return TrainResult(run.history, run.iterations, run.model)


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


TIMING_KEYS = ("seconds", "images_per_s")  # per-epoch wall-clock fields: MLflow/metrics only, never outputs


def history_frame_records(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The epoch records without their timings (:data:`TIMING_KEYS`): what ``history.csv`` holds,
    so that two identical runs write byte-identical files."""
    return [{k: v for k, v in record.items() if k not in TIMING_KEYS} for record in history]
