"""Method B as the architect: the cascade's module shapes searched on the data, not set by hand.

One elastic cascade (:mod:`pipeline.models.elastic`) holds every module's widths, depths and resolution
steps in shared weights. It is trained as the supernets are (sandwich: the largest and the smallest
shape on every batch, plus ``m`` shapes drawn from method B's probability model P, which is refitted by
maximum likelihood from the drawn shapes' paired losses and costs), then shapes are scored on held-out
images by the whole cascade's accuracy and expected MACs at thresholds calibrated there (the delta rule
of ``calibrate``, so a large last module is cheap when few images reach it), and the searcher of
:mod:`pipeline.search.blackbox` (method B, or random search as the control) looks for the best score.
The shipped shape is the cheapest scored one within one standard error of the most accurate
(docs/DESIGN.md "Method B as the architect").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.io import Split
from pipeline.models.elastic import (
    ElasticCascade,
    ModuleChoices,
    ModuleShape,
    extreme_arch,
    shape_macs,
    shapes_of,
)
from pipeline.routing.calibration import calibrate_delta, simulate_thresholds
from pipeline.search.blackbox import random_search, search
from pipeline.search.probmodel import ProbModel, mle_update
from pipeline.search.space import Arch
from pipeline.train.data import ImageBatches
from pipeline.train.inputs import normalisation_stats

STRIDE_ABOVE = 32  # images larger than this (px) enter module 1 at stride 2 (pipeline.models.config's rule)
SAMPLERS = ("probmodel", "uniform")  # how shapes are drawn while the weights train
SEARCHERS = ("method_b", "random")  # how shapes are searched once they are trained


@dataclass(frozen=True)
class ArchitectConfig:
    epochs: int = 20
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    m: int = 2  # shapes drawn from P per batch, beside the largest and the smallest
    sampler: str = "probmodel"
    searcher: str = "method_b"
    budget: int = 24  # distinct shapes scored on held-out images
    cost_weight: float = 0.02  # search score: accuracy - cost_weight * mean MACs / the largest shape's MACs
    # a ceiling on the calibrated cascade's mean MACs (None: none): a shape over it scores below every shape
    # under it, and the choice is made among those under it (docs/RESULTS.md "Method B as the architect")
    max_macs: float | None = None
    delta: float = 0.003  # calibrate's delta rule on the held-out images
    bound_z: float = 1.0
    grid: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS or self.searcher not in SEARCHERS:
            raise ValueError(f"sampler must be one of {SAMPLERS} and searcher one of {SEARCHERS}, got "
                             f"{self.sampler!r}, {self.searcher!r}")
        if self.epochs < 1 or self.batch_size < 2 or self.m < 0 or self.budget < 1:
            raise ValueError(f"need epochs >= 1, batch_size >= 2, m >= 0, budget >= 1; got {self.epochs}, "
                             f"{self.batch_size}, {self.m}, {self.budget}")


@dataclass(frozen=True)
class Scored:
    arch: Arch
    shapes: tuple[ModuleShape, ...]
    accuracy: float  # the calibrated cascade on the held-out images
    mean_macs: float
    exit_accuracy: tuple[float, ...]
    exit_macs: tuple[int, ...]  # cumulative MACs to each exit
    score: float


def default_choices(side: int, width: int, modules: int = 3) -> tuple[ModuleChoices, ...]:
    """The space the architect searches, from the input's side and ``width``, the run's ``plain_large``
    width (``baselines.large_width``), so the deepest shapes reach that network's cost on any input:
    module k's widths are (1/2, 1, 2) x width x 2^(k-1), its depth 1-3 (1-2 after module 1); module 1 enters
    at stride 2 above 32 px and pools its map 0-2 times (whether later modules see its full resolution);
    every later module halves the side."""
    first = ModuleChoices(widths=(max(width // 2, 2), width, 2 * width), depths=(1, 2, 3),
                          strides=(2,) if side > STRIDE_ABOVE else (1,), pools=(0, 1, 2))
    later = tuple(ModuleChoices(widths=tuple(w * 2 ** k for w in (max(width // 2, 2), width, 2 * width)),
                                depths=(1, 2), strides=(2,)) for k in range(1, modules))
    return (first, *later)


def _exit_losses(logits: Sequence[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """The mean of every exit's cross-entropy: each exit is trained, as every module's exit serves."""
    return torch.stack([F.cross_entropy(z, y) for z in logits]).mean()


def train_elastic(net: ElasticCascade, train: Split, cfg: ArchitectConfig, side: int,
                  progress: Callable[[int, float], None] | None = None) -> ProbModel:
    """Train the shared weights; returns P after the last batch (uniform with ``sampler: uniform``)."""
    mean, std = normalisation_stats(train.images)
    batches = ImageBatches(train.images, train.labels, cfg.batch_size, mean=mean, std=std, shuffle=True,
                           crop_padding=2, flip=True, drop_last=True, seed=cfg.seed)
    steps = cfg.epochs * len(batches)
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                          nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, cfg.lr, total_steps=steps, pct_start=0.1,
                                                anneal_strategy="cos")
    rng = np.random.default_rng(cfg.seed)
    space, choices = net.space, net.choices
    model = ProbModel.uniform(space)
    largest, smallest = extreme_arch(space, True), extreme_arch(space, False)
    in_channels, classes = train.images.shape[1], int(net.modules_[0].head.fc.out_features)
    cost_max = sum(shape_macs(shapes_of(largest, choices), in_channels, side, classes))
    net.train()
    for epoch in range(cfg.epochs):
        total = 0.0
        for x, y in batches.epoch(epoch):
            picks = model.sample_hypercube(cfg.m, rng) if cfg.m and space.decisions else []
            opt.zero_grad(set_to_none=True)
            losses = []
            for arch in (largest, smallest, *picks):
                loss = _exit_losses(net.forward_all(x, shapes_of(arch, choices)), y)
                loss.backward()
                losses.append(float(loss.detach()))
            opt.step()
            sched.step()
            total += losses[0]
            if cfg.sampler == "probmodel" and picks:
                costs = [sum(shape_macs(shapes_of(a, choices), in_channels, side, classes)) / cost_max for a in picks]
                # paired perf, as the supernets' (docs/DESIGN.md): against the largest shape on the same batch
                perf = torch.tensor([-(loss - losses[0]) - 0.1 * c for loss, c in zip(losses[2:], costs, strict=True)],
                                    dtype=torch.float64)
                model = mle_update(model, picks, perf, temperature=0.1, smoothing=0.005, step=0.1)
        if progress is not None:
            progress(epoch + 1, total / max(len(batches), 1))
    return model


@torch.no_grad()
def exit_outputs(net: ElasticCascade, held: Split, shapes: Sequence[ModuleShape], mean, std,
                 batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct), each (N, K): every exit of ``shapes`` on ``held`` (batch statistics)."""
    batches = ImageBatches(held.images, held.labels, batch, mean=mean, std=std)
    conf, right = [], []
    for x, y in batches:
        logits = net.forward_all(x, shapes)
        probs = torch.stack([torch.softmax(z, -1) for z in logits], 1)  # (B, K, classes)
        top, pred = probs.max(-1)  # (B, K)
        conf.append(top.numpy())
        right.append((pred == y[:, None]).numpy())
    return np.concatenate(conf), np.concatenate(right)


def score_arch(net: ElasticCascade, arch: Arch, held: Split, cfg: ArchitectConfig, side: int, stats) -> Scored:
    """The whole cascade of ``arch`` on the held-out images: thresholds by the delta rule, then its
    accuracy and expected MACs there."""
    shapes = tuple(shapes_of(arch, net.choices))
    classes = int(net.modules_[0].head.fc.out_features)
    cum = np.cumsum(shape_macs(shapes, held.images.shape[1], side, classes))  # (K,)
    conf, right = exit_outputs(net, held, shapes, *stats)
    cum_macs = np.broadcast_to(cum, conf.shape)
    thresholds, _ = calibrate_delta(conf, right, cum_macs, cfg.delta, cfg.grid, reference="best", z=cfg.bound_z)
    accuracy, mean_macs, _ = simulate_thresholds(conf, right, cum_macs, thresholds)
    return Scored(arch, shapes, accuracy, mean_macs, tuple(float(a) for a in right.mean(0)),
                  tuple(int(c) for c in cum), 0.0)


def choose(scored: Sequence[Scored], n_images: int, max_macs: float | None = None) -> Scored:
    """The cheapest scored shape whose accuracy is within one standard error of the most accurate's, among
    those at most ``max_macs`` (all of them when None; the cheapest shape when none is under it)."""
    within = [s for s in scored if max_macs is None or s.mean_macs <= max_macs]
    if not within:
        return min(scored, key=lambda s: (s.mean_macs, -s.accuracy))
    scored = within
    best = max(scored, key=lambda s: (s.accuracy, -s.mean_macs))
    se = math.sqrt(max(best.accuracy * (1 - best.accuracy), 1e-12) / max(n_images, 1))
    return min((s for s in scored if s.accuracy >= best.accuracy - se), key=lambda s: (s.mean_macs, -s.accuracy))


def search_shapes(net: ElasticCascade, held: Split, cfg: ArchitectConfig, side: int, stats,
                  on_score: Callable[[Scored], None] | None = None) -> list[Scored]:
    """Score up to ``budget`` distinct shapes with method B (or random search); every scored shape."""
    scored: dict[Arch, Scored] = {}
    largest = sum(shape_macs(shapes_of(extreme_arch(net.space, True), net.choices), held.images.shape[1], side,
                             int(net.modules_[0].head.fc.out_features)))

    def evaluate(arch: Arch) -> float:
        s = score_arch(net, arch, held, cfg, side, stats)
        score = s.accuracy - cfg.cost_weight * s.mean_macs / largest
        if cfg.max_macs is not None and s.mean_macs > cfg.max_macs:
            score -= 1.0 + s.mean_macs / largest  # below every shape under the ceiling, cheaper ones first
        s = Scored(**{**s.__dict__, "score": score})
        scored[arch] = s
        if on_score is not None:
            on_score(s)
        return s.score

    # the corners first: the search's front always spans the space's cost range
    for corner in (extreme_arch(net.space, True), extreme_arch(net.space, False)):
        evaluate(corner)
    if len(scored) < min(cfg.budget, net.space.size()):
        run = search if cfg.searcher == "method_b" else random_search
        # the corners are known: the searcher's repeats of them cost no evaluation; it stops at the budget
        run(net.space, lambda a: scored[a].score if a in scored else evaluate(a), budget=cfg.budget,
            seed=cfg.seed, stop=lambda _record: len(scored) >= cfg.budget)
    return list(scored.values())


def architect(train: Split, held: Split, choices: Sequence[ModuleChoices], cfg: ArchitectConfig,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train the elastic cascade on ``train``, search its shapes on ``held``; the chosen shapes and the record."""
    torch.manual_seed(cfg.seed)
    side = int(train.images.shape[-1])
    classes = int(max(train.labels.max(), held.labels.max()) + 1)
    net = ElasticCascade(train.images.shape[1], classes, choices)
    say = progress or (lambda _line: None)
    start = time.perf_counter()
    model = train_elastic(net, train, cfg, side, lambda e, loss: say(f"architect: epoch {e}/{cfg.epochs} "
                                                                      f"loss {loss:.3f}"))
    trained = time.perf_counter() - start
    stats = normalisation_stats(train.images)
    scored = search_shapes(net, held, cfg, side, stats)
    chosen = choose(scored, len(held), cfg.max_macs)
    return {"chosen": chosen, "scored": scored, "p_final": model.as_dict(), "train_seconds": round(trained, 1),
            "search_seconds": round(time.perf_counter() - start - trained, 1), "space_size": net.space.size()}
