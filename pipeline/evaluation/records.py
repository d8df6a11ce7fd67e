"""One engine pass per model over a split, and the engine's outputs read off it (docs/DESIGN.md 'Stages
and workflows'): every module runs on every image once, with the cascade's own per-image routing, and
the record keeps each exit's logits, the candidate each module ran and the MACs it spent. The exits
alone or as an ensemble, the early-exit cascade at any thresholds and each routing candidate's exit are
then pure functions of the record, so evaluate never runs a model twice over the test split."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.models.modules import confidence, eval_mode
from pipeline.routing.engine import CascadeOutput, Stage, combine_exits, run_stage, spent_macs
from pipeline.routing.rules import exit_mask
from pipeline.search.space import Arch

Candidates = Sequence[tuple[Sequence[Arch], Sequence[int]]]
BATCH = 512  # the batch run_all_exits uses: the same float path, so the same answers


@dataclass(frozen=True)
class CandidateExits:
    """A module's recorded routing candidates, each run as the module's exit on the cascade's prefix."""

    paths: tuple[str, ...]
    module_macs: tuple[int, ...]
    logits: torch.Tensor  # (N, R, classes)


@dataclass(frozen=True)
class ExitRecord:
    """One model on one split: ``logits`` (N, K, classes) each exit's own (no ensemble), ``choices``
    (N, K) the candidate each module ran, ``macs`` (N, K) MACs spent at each module, ``candidates``
    per module (1-based) whose recorded routing candidates were also run."""

    logits: torch.Tensor
    choices: torch.Tensor
    macs: torch.Tensor
    candidates: dict[int, CandidateExits] = field(default_factory=dict)


def _nets(stages: Sequence[Stage]) -> list[torch.nn.Module]:
    return [s.module for s in stages] + [s.predictor for s in stages if s.predictor is not None]


def _batch(stages: Sequence[Stage], images: torch.Tensor, extra: dict[int, tuple[Arch, ...]]) -> dict:
    logits, choices, macs, cands = [], [], [], {}
    h = images
    for k, stage in enumerate(stages, start=1):
        if k in extra:  # each candidate as a standalone exit on the same prefix features
            cands[k] = torch.stack([run_stage(Stage(stage.module, (a,), (0,), float("inf")), h)[1]
                                    for a in extra[k]], dim=1)
        h, z, choice = run_stage(stage, h)
        logits.append(z)
        choices.append(choice)
        macs.append(spent_macs(stage, choice))
    return {"logits": torch.stack(logits, dim=1), "choices": torch.stack(choices, dim=1),
            "macs": torch.stack(macs, dim=1), **{f"c{k}": v for k, v in cands.items()}}


def record_exits(stages: Sequence[Stage], images: torch.Tensor, recorded: Candidates | None = None) -> ExitRecord:
    """The model's one pass over ``images``; ``recorded`` (per module, its routing candidates and
    their MACs) adds each candidate's exit at every module with two or more."""
    if recorded is not None and len(recorded) != len(stages):
        raise ValueError(f"candidates for {len(recorded)} modules, the cascade has {len(stages)}")
    extra = {k: tuple(archs) for k, (archs, _) in enumerate(recorded or (), start=1) if len(archs) >= 2}
    with eval_mode(*_nets(stages)), torch.inference_mode():
        parts = [_batch(stages, images[i:i + BATCH], extra) for i in range(0, max(len(images), 1), BATCH)]
    cat = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
    cands = {k: CandidateExits(tuple(a.key() for a in extra[k]), tuple(int(m) for m in recorded[k - 1][1]),
                               cat[f"c{k}"]) for k in extra} if recorded is not None else {}
    return ExitRecord(cat["logits"], cat["choices"], cat["macs"], cands)


def all_exits(record: ExitRecord, kind: str, decay: float = 0.0) -> dict[str, torch.Tensor]:
    """``run_all_exits``'s outputs: ``logits`` (the exit ensemble's with ``decay`` > 0), ``conf``,
    ``pred``, ``choices``, ``macs`` and ``cum_macs`` (N, K)."""
    scores = combine_exits(record.logits, decay)
    return {"logits": scores, "conf": confidence(scores, kind), "pred": scores.argmax(dim=-1),
            "choices": record.choices, "macs": record.macs, "cum_macs": record.macs.cumsum(dim=1)}


def cascade_output(record: ExitRecord, kind: str, thresholds: Sequence[float], decay: float = 0.0) -> CascadeOutput:
    """``run_cascade``'s outputs at these K-1 ``thresholds``: each image leaves at the first exit whose
    confidence reaches its threshold (the engine's ``exit_mask``), the last exit answers the rest."""
    outs = all_exits(record, kind, decay)
    n, k_total = record.choices.shape
    leave = torch.ones((n, k_total), dtype=torch.bool, device=record.choices.device)
    for k, t in enumerate(thresholds[:k_total - 1]):
        leave[:, k] = exit_mask(outs["conf"][:, k], t)
    exit_index = leave.long().argmax(dim=1)  # the first exit taken
    rows = torch.arange(n, device=exit_index.device)
    reached = torch.arange(k_total, device=exit_index.device)[None, :] <= exit_index[:, None]
    return CascadeOutput(pred=outs["pred"][rows, exit_index], conf=outs["conf"][rows, exit_index],
                         exit_index=exit_index, choices=torch.where(reached, record.choices, -1),
                         macs=outs["cum_macs"][rows, exit_index], calls=[int(c) for c in reached.sum(dim=0)])


def scored_candidates(record: ExitRecord, labels: np.ndarray, decay: float = 0.0) -> dict[int, dict]:
    """``figures.candidate_correct``'s rows read off the record: per module with recorded candidates,
    ``paths``, ``macs`` (mean cost of reaching that exit), ``module_macs`` and ``correct`` (N, R)."""
    out = {}
    for k, c in record.candidates.items():
        prefix = record.macs[:, :k - 1].sum(dim=1)
        correct, reach = [], []
        for j, macs in enumerate(c.module_macs):
            scores = combine_exits(torch.cat([record.logits[:, :k - 1], c.logits[:, j:j + 1]], dim=1), decay)
            correct.append(scores[:, -1].argmax(dim=-1).cpu().numpy() == labels)
            reach.append(float((prefix + macs).double().mean()))
        out[k] = {"paths": list(c.paths), "macs": reach, "module_macs": list(c.module_macs),
                  "correct": np.stack(correct, axis=1)}
    return out


def _same_module(a: torch.nn.Module | None, b: torch.nn.Module | None) -> bool:
    if a is b:
        return True
    if a is None or b is None or type(a) is not type(b):
        return False
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[key], sb[key]) for key in sa)


def same_network(a: Sequence[Stage], b: Sequence[Stage]) -> bool:
    """Whether two stage lists compute the same thing on every image (thresholds aside): the same
    paths, MACs and weights, module by module."""
    return len(a) == len(b) and all(
        sa.candidates == sb.candidates and sa.candidate_macs == sb.candidate_macs
        and sa.predictor_macs == sb.predictor_macs and _same_module(sa.module, sb.module)
        and _same_module(sa.predictor, sb.predictor) for sa, sb in zip(a, b, strict=True))


def record_models(models: dict[str, Sequence[Stage]], images: torch.Tensor,
                  recorded: dict[str, Candidates] | None = None) -> dict[str, ExitRecord]:
    """One record per distinct network among ``models`` (name -> stages): a model whose network an
    earlier one already ran shares its record. ``recorded``: routing candidates to add, by model name."""
    out: dict[str, ExitRecord] = {}
    for name, stages in models.items():
        twin = next((other for other in out if other not in (recorded or {}) and name not in (recorded or {})
                     and same_network(models[other], stages)), None)
        out[name] = out[twin] if twin is not None else record_exits(stages, images, (recorded or {}).get(name))
    return out
