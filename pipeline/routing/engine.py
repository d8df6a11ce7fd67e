"""The batched early-exit engine: real exits and per-image routing (claims 1-4).

At each module the rows still in the cascade are split by their predictor's choice, each chosen
subnetwork runs once on its own group, and the rows whose confidence reaches the threshold leave:
the feature tensor is compacted, so later modules compute only on the images that remain. The
result does not depend on the batch size (modules run in eval mode; only float noise differs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.models.cost import count_macs
from pipeline.models.modules import Subnet, confidence, eval_mode
from pipeline.routing.predictor import Predictor, predictor_macs
from pipeline.routing.rules import exit_mask, route_groups
from pipeline.search.space import Arch


@dataclass(frozen=True, eq=False)
class Stage:
    """One cascade module as the engine runs it.

    ``candidates`` are the subnetworks it may run (one for a fixed module or a static choice, R
    for per-image routing, which then needs a ``predictor`` over R). ``candidate_macs`` are MACs
    per image of each candidate path including its exit head; ``threshold`` is ignored on the
    last stage. A ``Subnet`` (an exported module) runs its own path: give it one candidate.
    """

    module: nn.Module
    candidates: tuple[Arch, ...]
    candidate_macs: tuple[int, ...]
    threshold: float
    predictor: Predictor | None = None
    predictor_macs: int = 0

    def __post_init__(self) -> None:
        for name in ("candidates", "candidate_macs"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        r = len(self.candidates)
        if r == 0 or not all(isinstance(a, Arch) for a in self.candidates):
            raise ValueError(f"Stage.candidates must be a non-empty tuple of Arch, got {self.candidates!r}")
        if len(set(self.candidates)) != r:
            raise ValueError(f"Stage.candidates has repeats: {[a.key() for a in self.candidates]}")
        if len(self.candidate_macs) != r or any(int(m) < 0 for m in self.candidate_macs):
            raise ValueError(f"Stage.candidate_macs needs {r} values >= 0, got {self.candidate_macs!r}")
        if isinstance(self.module, Subnet) and r != 1:
            raise ValueError(f"a Subnet runs one fixed path; Stage got {r} candidates")
        if r > 1 and self.predictor is None:
            raise ValueError(f"Stage has {r} candidates but no predictor to choose among them")
        if r == 1 and self.predictor is not None:
            raise ValueError("Stage has a predictor but a single candidate: nothing to choose")
        if self.predictor is not None and self.predictor.num_candidates != r:
            n = self.predictor.num_candidates
            raise ValueError(f"Stage's predictor scores {n} candidates, but the stage has {r}")
        if self.predictor_macs < 0:
            raise ValueError(f"Stage.predictor_macs must be >= 0, got {self.predictor_macs}")
        if math.isnan(self.threshold):
            raise ValueError("Stage.threshold is NaN")


def build_stage(
    module: nn.Module,
    input_shape: Sequence[int],
    candidates: Sequence[Arch],
    threshold: float,
    predictor: Predictor | None = None,
) -> Stage:
    """A ``Stage`` with its MACs counted on a (C, H, W) input, so costs come from one counter."""
    if isinstance(module, Subnet):
        macs = tuple(count_macs(module, input_shape) for _ in candidates)
    else:
        macs = tuple(count_macs(module, input_shape, arch) for arch in candidates)
    pmacs = predictor_macs(predictor, input_shape) if predictor is not None else 0
    return Stage(module, tuple(candidates), macs, float(threshold), predictor, pmacs)


@dataclass(frozen=True)
class CascadeOutput:
    """Per-image results of ``run_cascade``; ``calls[k]`` = images module k actually processed."""

    pred: torch.Tensor  # (B,) long
    conf: torch.Tensor  # (B,) float
    exit_index: torch.Tensor  # (B,) long, 0-based module that answered
    choices: torch.Tensor  # (B, K) long, candidate run at each module, -1 where not reached
    macs: torch.Tensor  # (B,) long, candidate paths + predictors actually run on the image
    calls: list[int]


def _nets(stages: Sequence[Stage]) -> list[nn.Module]:
    return [s.module for s in stages] + [s.predictor for s in stages if s.predictor is not None]


def _forward(module: nn.Module, x: torch.Tensor, arch: Arch) -> tuple[torch.Tensor, torch.Tensor]:
    return module(x) if isinstance(module, Subnet) else module(x, arch)


def run_stage(stage: Stage, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Route each row, run each chosen candidate once on its group -> features, logits, choice."""
    n = h.shape[0]
    if stage.predictor is None:
        features, logits = _forward(stage.module, h, stage.candidates[0])
        return features, logits, torch.zeros(n, dtype=torch.long, device=h.device)
    choice = stage.predictor.choose(h)  # (n,)
    groups = route_groups(choice)
    if len(groups) <= 1:  # everyone chose the same path (or no rows): no gather/scatter needed
        candidate = groups[0][0] if groups else 0
        features, logits = _forward(stage.module, h, stage.candidates[candidate])
        return features, logits, choice
    features = logits = None
    for candidate, rows in groups:
        f, z = _forward(stage.module, h.index_select(0, rows), stage.candidates[candidate])
        if features is None or logits is None:
            features = f.new_empty((n, *f.shape[1:]))  # (n, C', H', W')
            logits = z.new_empty((n, *z.shape[1:]))  # (n, num_classes)
        features.index_copy_(0, rows, f)
        logits.index_copy_(0, rows, z)
    assert features is not None and logits is not None
    return features, logits, choice


def spent_macs(stage: Stage, choice: torch.Tensor) -> torch.Tensor:
    """MACs per row at this stage: the chosen candidate's path plus the predictor (n,) long."""
    table = torch.tensor(stage.candidate_macs, dtype=torch.long, device=choice.device)  # (R,)
    return table[choice] + stage.predictor_macs  # (n,)


def check_decay(decay: float) -> float:
    """The exit ensemble's decay as a float in [0, 1], or a ValueError naming it."""
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= float(decay) <= 1.0:
        raise ValueError(f"ensemble_decay must be a number in [0, 1], got {decay!r}")
    return float(decay)


def fold_exit(running: torch.Tensor | None, logits: torch.Tensor, decay: float) -> torch.Tensor:
    """One step of the exit ensemble: ``decay * running + log_softmax(logits)`` (n, classes).

    After exits 1..k, ``running`` holds sum_j decay^(k-j) log p_j: the earlier exits' answers,
    each weighted down by ``decay`` per module since. They come for free (every image that reaches
    exit k went through exits 1..k-1), so an exit can use them at no extra MACs."""
    log_p = torch.log_softmax(logits.float(), dim=-1)  # (n, classes)
    return log_p if running is None else decay * running + log_p


def ensemble_scores(running: torch.Tensor, k: int, decay: float) -> torch.Tensor:
    """Exit k's (0-based) ensemble scores from ``fold_exit``'s sum: the decay-weighted mean of the
    exits' log-probabilities, i.e. logits of their normalised weighted geometric mean (n, classes)."""
    return running / sum(decay**j for j in range(k + 1))


def combine_exits(logits: torch.Tensor, decay: float) -> torch.Tensor:
    """(B, K, classes) exit logits -> the exit ensemble's scores at each exit (B, K, classes), as
    ``run_cascade`` computes them. ``decay`` 0 returns ``logits`` itself (each exit alone)."""
    decay = check_decay(decay)
    if decay == 0.0:
        return logits
    running, out = None, []
    for k in range(logits.shape[1]):
        running = fold_exit(running, logits[:, k], decay)
        out.append(ensemble_scores(running, k, decay))
    return torch.stack(out, dim=1)


def _check(stages: Sequence[Stage], images: torch.Tensor, batch_size: int | None) -> None:
    if not stages:
        raise ValueError("the cascade needs at least one stage")
    if images.dim() != 4 or not images.is_floating_point():
        got = f"{images.dtype} {tuple(images.shape)}"
        raise ValueError(f"images must be a float tensor (B, C, H, W), got {got}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def check_thresholds(thresholds: Sequence[float] | None, n_stages: int) -> list[float] | None:
    """Per-call thresholds as K-1 floats (the last stage always answers), or a ValueError naming them."""
    if thresholds is None:
        return None
    values = [float(t) for t in thresholds]
    if len(values) != n_stages - 1 or any(math.isnan(t) for t in values):
        raise ValueError(f"{n_stages} stages need {n_stages - 1} thresholds (not NaN), got {list(thresholds)}")
    return values


def _run_batch(stages: Sequence[Stage], images: torch.Tensor, confidence_kind: str,
               decay: float = 0.0, thresholds: Sequence[float] | None = None) -> CascadeOutput:
    b, k_total, device = images.shape[0], len(stages), images.device
    pred = torch.full((b,), -1, dtype=torch.long, device=device)
    conf = torch.zeros(b, dtype=images.dtype, device=device)
    exit_index = torch.full((b,), -1, dtype=torch.long, device=device)
    choices = torch.full((b, k_total), -1, dtype=torch.long, device=device)
    macs = torch.zeros(b, dtype=torch.long, device=device)
    calls = []
    active = torch.arange(b, device=device)  # (n,) original rows still in the cascade
    h = images  # (n, C, H, W)
    running = None  # exit ensemble: decay-weighted sum of the exits' log-probabilities (n, classes)
    for k, stage in enumerate(stages):
        calls.append(active.numel())
        if active.numel() == 0:
            continue
        features, logits, choice = run_stage(stage, h)  # (n, C', H', W'), (n, classes), (n,)
        logits = logits.float()  # confidences compared with thresholds in float32, also under bf16 autocast
        if decay > 0.0:
            running = fold_exit(running, logits, decay)
            logits = ensemble_scores(running, k, decay)
        choices[active, k] = choice
        macs[active] += spent_macs(stage, choice)
        c = confidence(logits, confidence_kind)  # (n,)
        last = k == k_total - 1
        if last:
            leave = torch.ones_like(c, dtype=torch.bool)  # (n,)
        else:
            leave = exit_mask(c, stage.threshold if thresholds is None else thresholds[k])  # (n,)
        rows = active[leave]
        pred[rows] = logits[leave].argmax(dim=1)
        conf[rows] = c[leave]
        exit_index[rows] = k
        stay = torch.nonzero(~leave, as_tuple=False).flatten()  # (n',)
        active = active.index_select(0, stay)
        h = features.index_select(0, stay)  # (n', C', H', W'): later modules see only these rows
        if running is not None:
            running = running.index_select(0, stay)
    return CascadeOutput(pred, conf, exit_index, choices, macs, calls)


def run_cascade(
    stages: Sequence[Stage],
    images: torch.Tensor,
    *,
    confidence_kind: str = "maxprob",
    batch_size: int | None = None,
    ensemble_decay: float = 0.0,
    thresholds: Sequence[float] | None = None,
) -> CascadeOutput:
    """Early-exit inference on images (B, C, H, W): each image leaves at the first module whose
    confidence reaches its threshold (the last module always answers).

    ``thresholds`` (K-1 values) replace the stages' own for this call only: how a server answers at
    one of the model's operating points without copying the stages (docs/DESIGN.md 'Serving').

    ``batch_size`` splits the input into chunks run one after another (bounded memory); the
    per-image results do not depend on it, and ``calls`` are summed over the chunks.
    ``ensemble_decay`` > 0: each exit answers with the exit ensemble (``combine_exits``) of itself
    and the exits before it, instead of its own logits alone (0, the default).
    """
    _check(stages, images, batch_size)
    decay = check_decay(ensemble_decay)
    thresholds = check_thresholds(thresholds, len(stages))
    step = batch_size or max(images.shape[0], 1)
    with eval_mode(*_nets(stages)), torch.inference_mode():
        starts = range(0, images.shape[0], step)
        parts = [_run_batch(stages, images[i : i + step], confidence_kind, decay, thresholds) for i in starts]
        if not parts:
            return _run_batch(stages, images, confidence_kind, decay, thresholds)
        return CascadeOutput(
            pred=torch.cat([p.pred for p in parts]),
            conf=torch.cat([p.conf for p in parts]),
            exit_index=torch.cat([p.exit_index for p in parts]),
            choices=torch.cat([p.choices for p in parts]),
            macs=torch.cat([p.macs for p in parts]),
            calls=[sum(p.calls[k] for p in parts) for k in range(len(stages))],
        )


def _all_exits_batch(
    stages: Sequence[Stage], images: torch.Tensor, confidence_kind: str, decay: float = 0.0
) -> dict[str, torch.Tensor]:
    logits, choices, macs = [], [], []
    h = images  # (B, C, H, W)
    for stage in stages:
        h, z, choice = run_stage(stage, h)  # (B, C', H', W'), (B, classes), (B,)
        logits.append(z.float())  # float32 also under bf16 autocast, as run_cascade
        choices.append(choice)
        macs.append(spent_macs(stage, choice))
    stacked = combine_exits(torch.stack(logits, dim=1), decay)  # (B, K, classes)
    spent = torch.stack(macs, dim=1)  # (B, K)
    return {
        "logits": stacked,
        "conf": confidence(stacked, confidence_kind),  # (B, K)
        "pred": stacked.argmax(dim=-1),  # (B, K)
        "choices": torch.stack(choices, dim=1),  # (B, K)
        "macs": spent,
        "cum_macs": spent.cumsum(dim=1),  # (B, K)
    }


def run_all_exits(
    stages: Sequence[Stage],
    images: torch.Tensor,
    *,
    confidence_kind: str = "maxprob",
    batch_size: int | None = None,
    ensemble_decay: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Every module on every image, with the same per-image routing, and no exits.

    An analysis tool, not the inference path (it spends the full cost on every image): it gives
    calibration, baselines and the oracle each exit's answer. Returns (N, K, ...) tensors:
    ``logits`` (N, K, classes), ``conf``, ``pred``, ``choices``, ``macs`` (spent at module k) and
    ``cum_macs`` (spent up to and including module k, i.e. the cost of exiting there).
    With ``ensemble_decay`` > 0, ``logits`` are the exit ensemble's scores, as ``run_cascade``'s.
    """
    _check(stages, images, batch_size)
    decay = check_decay(ensemble_decay)
    step = batch_size or max(images.shape[0], 1)
    with eval_mode(*_nets(stages)), torch.inference_mode():
        parts = [
            _all_exits_batch(stages, images[i : i + step], confidence_kind, decay)
            for i in range(0, max(images.shape[0], 1), step)
        ]
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


class RoutedModule(nn.Module):
    """A stage as a plain module ``forward(x, arch=None) -> (features, logits)`` with its per-image
    routing inside: how the next module's training prefix sees a predictor-routed supernet."""

    def __init__(self, stage: Stage) -> None:
        super().__init__()
        self.stage = stage
        self.inner = stage.module  # registered, so .eval() / .requires_grad_() reach it
        self.predictor = stage.predictor

    def forward(self, x: torch.Tensor, arch: Arch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        features, logits, _ = run_stage(self.stage, x)
        return features, logits
