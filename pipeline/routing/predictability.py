"""Is "which routing candidate will be right" predictable before the module runs? The measure behind
per-image routing's verdict (`bench.archive.routing_predictability`; docs/RESULTS.md 'Is the right
candidate predictable at all?').

Routing at module k can only gain on the images where the candidates disagree: candidate j right and
the static choice (the twin) wrong, or the reverse. A learner fitted on labelled images that never
reach testing estimates each candidate's chance of being right from what the cascade has in hand
before module k runs (module k's input, pooled, and exit k-1's class probabilities); on held-out
images, the AUC of ``p_j(right) - p_twin(right)`` separates the two kinds of disagreement (0.5: a
coin; 1: the right candidate is always known in advance).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from pipeline.models.modules import Subnet, eval_mode
from pipeline.routing.engine import Stage

LEARNER = "logistic regression on module k's input (pooled) and exit k-1's probabilities"


def pooled(maps: torch.Tensor) -> np.ndarray:
    """(N, 5C) float64: a feature map (N, C, H, W) averaged over space and over a 2x2 grid."""
    if maps.dim() != 4:
        raise ValueError(f"pooled needs feature maps (N, C, H, W), got shape {tuple(maps.shape)}")
    maps = maps.float()
    grid = torch.nn.functional.adaptive_avg_pool2d(maps, 2).flatten(1)
    return torch.cat([maps.mean(dim=(2, 3)), grid], 1).cpu().numpy().astype(np.float64)


def image_features(inputs: torch.Tensor, probs: torch.Tensor) -> np.ndarray:
    """(N, F) float64: module k's input ``inputs`` (N, C, H, W) pooled (:func:`pooled`), then exit
    k-1's class probabilities ``probs`` (N, classes, ...), their maximum and entropy (none of the
    three for module 1, whose ``probs`` has no columns)."""
    p = probs.float().flatten(1)
    if p.shape[0] != inputs.shape[0]:
        raise ValueError(f"image_features: {inputs.shape[0]} inputs but {p.shape[0]} probability rows")
    parts = [torch.from_numpy(pooled(inputs))]
    if p.shape[1]:
        entropy = -(p * p.clamp_min(1e-12).log()).sum(1, keepdim=True)
        parts += [p, p.max(1, keepdim=True).values, entropy]
    return torch.cat([t.double().cpu() for t in parts], 1).numpy()


def module_inputs(stages: Sequence[Stage], x: torch.Tensor, k: int,
                  batch_size: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Module k's (1-based) input, ``x`` through stages 1..k-1 on their first path, and exit k-1's
    class probabilities: ((N, C, H, W), (N, classes)); module 1 gets ``x`` and an (N, 0) tensor.
    Meant for single-path stages (a static twin), whose first path is the one they run."""
    if not 1 <= k <= len(stages):
        raise ValueError(f"module_inputs: module {k} is not in a cascade of {len(stages)} modules")
    feats, probs = [], []
    with eval_mode(*(s.module for s in stages[:k - 1])), torch.inference_mode():
        for i in range(0, x.shape[0], batch_size):
            h, logits = x[i:i + batch_size], None
            for stage in stages[:k - 1]:
                h, logits = stage.module(h) if isinstance(stage.module, Subnet) else stage.module(
                    h, stage.candidates[0])
            feats.append(h.float())
            probs.append(logits.float().softmax(-1) if logits is not None else h.new_zeros((h.shape[0], 0)))
    if not feats:
        return x.float(), x.new_zeros((0, 0))
    return torch.cat(feats), torch.cat(probs)


def logistic() -> Any:
    """The learner the verdict uses: standardised features, L2-regularised logistic regression (fast,
    deterministic, and among the best of the learners `bench.archive.routing_predictability` compared)."""
    return make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=5000))


def p_right(make: Callable[[], Any], x_fit: np.ndarray, right_fit: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(N, R) predicted chance that each candidate is right on ``x``: one binary learner per candidate
    fitted on ``x_fit`` (M, F) and ``right_fit`` (M, R) bool (a constant where its labels hold one class)."""
    if right_fit.ndim != 2 or len(right_fit) != len(x_fit):
        raise ValueError(f"p_right needs one row of candidate answers per fit image, got {right_fit.shape} "
                         f"for {len(x_fit)} images")
    cols = []
    for j in range(right_fit.shape[1]):
        y = right_fit[:, j]
        if len(y) == 0 or y.min() == y.max():
            cols.append(np.full(len(x), float(y[0]) if len(y) else 0.5))
            continue
        cols.append(make().fit(x_fit, y).predict_proba(x)[:, 1])
    return np.stack(cols, 1)


def disagreements(right: np.ndarray, j: int, twin: int) -> tuple[np.ndarray, np.ndarray]:
    """(win, lose): the images where candidate j is right and the twin wrong, and the reverse."""
    return right[:, j] & ~right[:, twin], right[:, twin] & ~right[:, j]


def disagreement_auc(gain: np.ndarray, right: np.ndarray, j: int, twin: int) -> float | None:
    """AUC of ``gain`` for "j right, twin wrong" against "twin right, j wrong" (None without both)."""
    win, lose = disagreements(right, j, twin)
    if win.sum() == 0 or lose.sum() == 0:
        return None
    mask = win | lose
    return float(roc_auc_score(win[mask], gain[mask]))


def predictability(x_fit: np.ndarray, right_fit: np.ndarray, x_held: np.ndarray, right_held: np.ndarray,
                   twin: int, make: Callable[[], Any] = logistic) -> dict[str, Any]:
    """The learner fitted on (``x_fit`` (M, F), ``right_fit`` (M, R) bool), read on the held-out
    (``x_held``, ``right_held``): per candidate j other than the ``twin``, the AUC of its gain over the
    twin on their disagreements, and ``auc`` over every candidate's disagreements pooled (None where
    the held-out images hold no disagreement of both kinds; ``note`` says why)."""
    r = right_held.shape[1]
    if right_fit.shape[1] != r or not 0 <= twin < r:
        raise ValueError(f"predictability: {right_fit.shape[1]} fit and {r} held-out candidates, twin {twin}")
    out: dict[str, Any] = {"learner": LEARNER, "fit_images": int(len(x_fit)), "held_out_images": int(len(x_held)),
                           "auc": None, "per_candidate": []}
    if len(x_fit) < 2 or len(x_held) == 0:
        out["note"] = f"too few images reach the module ({len(x_fit)} to fit, {len(x_held)} held out)"
        return out
    p = p_right(make, x_fit, right_fit, x_held)
    gains, wins = [], []
    for j in range(r):
        if j == twin:
            continue
        gain = p[:, j] - p[:, twin]
        win, lose = disagreements(right_held, j, twin)
        out["per_candidate"].append({
            "candidate": j, "auc": disagreement_auc(gain, right_held, j, twin),
            "fit_disagreements": int((right_fit[:, j] != right_fit[:, twin]).sum()),
            "held_out_disagreements": int((win | lose).sum())})
        gains.append(gain[win | lose])
        wins.append(win[win | lose])
    label = np.concatenate(wins) if wins else np.zeros(0, dtype=bool)
    if label.any() and not label.all():
        out["auc"] = float(roc_auc_score(label, np.concatenate(gains)))
    else:
        out["note"] = (f"the held-out images hold {int(label.sum())} disagreements the twin loses and "
                       f"{int((~label).sum())} it wins: an AUC needs both")
    return out
