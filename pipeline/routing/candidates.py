"""Method B's final step on a trained supernet module: evaluate k subnets drawn from P(N) on held-out
data, keep the best by perf as the target, and the accuracy-cost Pareto set as routing candidates
(optionally over extra subnets spread across the whole space's cost range, ``spread_archs``: P(N)'s
own draws cluster where its cost term pulls them, which leaves routing little to choose between).
Also what the ``search`` stage writes: ``search.json`` (no measured timing: identical runs write
identical files), its metrics, and the candidates table and plots."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.device import autocast
from pipeline.io import read_json
from pipeline.models.modules import SupernetModule
from pipeline.models.profile import CostModel
from pipeline.report.plots import pareto_plot, search_curves
from pipeline.search.probmodel import ProbModel
from pipeline.search.space import Arch, SearchSpace
from pipeline.train.prefix import Prefix

TIMING_KEYS = ("latency_ms_b1", "latency_ms_b64")  # measured: the metrics file only, never search.json


@torch.inference_mode()
def evaluate_candidates(module: nn.Module, features: torch.Tensor, labels: torch.Tensor, archs: Sequence[Arch], *,
                        macs_of: Callable[[Arch], float], latency_of: Callable[[Arch, int], float], cost_max: float,
                        lambda_c: float, batch_size: int = 512) -> list[dict[str, Any]]:
    """One row per arch: accuracy, CE, perf = -CE - lambda_c * c / c_max, MACs and latency (b1, b64)."""
    module.eval()
    rows = []
    for arch in archs:
        correct, ce = 0, 0.0
        for start in range(0, len(labels), batch_size):
            _, logits = module(features[start:start + batch_size], arch)  # (B, classes)
            y = labels[start:start + batch_size]
            ce += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
        macs = macs_of(arch)
        mean_ce = ce / len(labels)
        rows.append({"arch": arch.key(), "acc": correct / len(labels), "ce": mean_ce,
                     "perf": -mean_ce - lambda_c * macs / cost_max, "macs": int(macs),
                     "latency_ms_b1": latency_of(arch, 1), "latency_ms_b64": latency_of(arch, 64)})
    return rows


def pareto_front(rows: Sequence[dict[str, Any]], max_size: int) -> list[dict[str, Any]]:
    """Rows not dominated in (higher acc, lower MACs), cheapest first, thinned to ``max_size`` evenly
    along the front (the cheapest and the most accurate are always kept)."""
    ordered = sorted(rows, key=lambda r: (r["macs"], -r["acc"]))
    front: list[dict[str, Any]] = []
    for row in ordered:
        if not front or row["acc"] > front[-1]["acc"]:
            front.append(row)
    if len(front) <= max_size:
        return front
    keep = np.unique(np.round(np.linspace(0, len(front) - 1, max_size)).astype(int))
    return [front[i] for i in keep]


def spread_archs(space: SearchSpace, op_macs: dict[str, dict[str, float]], macs_of: Callable[[Arch], float],
                 n: int, rng: np.random.Generator, pool_per_pick: int = 40) -> list[Arch]:
    """``n`` distinct subnets spanning the space's cost range: its cheapest and its most expensive path
    (per decision the op of least / most MACs in ``op_macs``) and, between them, the subnet of a uniform
    pool (``pool_per_pick`` draws per pick) nearest each of ``n`` evenly spaced costs."""
    if n < 2:
        raise ValueError(f"a spread needs at least 2 subnets (the cheapest and the largest), got {n}")
    ends = [space.make({label: pick(ops, key=ops.get) for label, ops in op_macs.items()}) for pick in (min, max)]
    pool = list(dict.fromkeys([*ends, *ProbModel.uniform(space).sample_distinct(pool_per_pick * n, rng)]))
    costs = np.array([macs_of(a) for a in pool], dtype=np.float64)
    chosen: list[Arch] = []
    for target in np.linspace(costs[0], costs[1], n):
        order = np.argsort(np.abs(costs - target), kind="stable")
        pick = next((pool[i] for i in order if pool[i] not in chosen), None)
        if pick is not None:
            chosen.append(pick)
    return chosen


def draw_candidates(module: nn.Module, prob_model: Path, costs: CostModel, k: int, samples: int, spread: int,
                    rng: np.random.Generator) -> tuple[ProbModel | None, list[Arch], list[Arch]]:
    """What the search evaluates on module k: P(N) (read from the file ``prob_model``, uniform where
    there is none: the uniform-sampler ablation), ``samples`` distinct draws from it plus its most likely
    subnet, and with ``spread`` > 0 up to ``spread`` more subnets across the space's cost range
    (:func:`spread_archs`, those not drawn already), in this order from ``rng``. A fixed module: no
    model, its one path, no spread."""
    if not isinstance(module, SupernetModule):
        return None, [module.default_arch()], []
    model = (ProbModel.from_dict(module.space, read_json(prob_model)) if prob_model.exists()
             else ProbModel.uniform(module.space))
    archs = model.sample_distinct(samples, rng)
    if model.most_likely() not in archs:
        archs.append(model.most_likely())
    if not spread:
        return model, archs, []
    op_macs = costs.table["modules"][k - 1]["op_macs"]
    spread_pool = spread_archs(module.space, op_macs, lambda a: costs.macs(k, a), spread, rng)
    return model, archs, [a for a in spread_pool if a not in archs]


def prefix_features(prefix: Prefix, images: np.ndarray, labels: np.ndarray, device: torch.device,
                    precision: str, batch_size: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Module k's input on a split: the images through the frozen ``prefix`` (N, C_k, H_k, W_k), and the
    labels (N,), both on ``device``."""
    with torch.inference_mode(), autocast(device, precision):
        batches = prefix.batches(images, labels, batch_size, device)
        feats, ys = zip(*((prefix(x), y) for x, y in batches), strict=True)
    return torch.cat(feats), torch.cat(ys)


def split_timings(rows: list[dict]) -> dict[str, dict]:
    """Remove the measured latencies from candidate rows (in place); returns them by arch key."""
    return {r["arch"]: {key: r.pop(key) for key in TIMING_KEYS if key in r} for r in rows}


def search_result(k: int, sampler: str, rows: list[dict], target: dict, front: list[dict],
                  model: ProbModel | None, spread: list[dict] | None = None) -> dict:
    """What ``search.json`` holds: no timing, so identical runs write identical files (``spread``: the
    rows of the spread subnets, kept only when there are any)."""
    result = {"module": k, "sampler": sampler, "samples": len(rows), "target": target, "pareto": front,
              "candidates": rows, "most_likely": model.most_likely().key() if model is not None else "",
              "entropy_final": model.entropy() if model is not None else 0.0}
    if spread:
        result["spread"] = spread
    return result


def search_metrics(result: dict, latency: dict[str, dict]) -> dict[str, Any]:
    """The search stage's metrics: the target's figures (its measured latencies from ``latency``, by arch
    key, included), the Pareto set's size, the spread of the drawn candidates' accuracy."""
    target = result["target"]
    accs = np.array([r["acc"] for r in result["candidates"]])
    return {"target_acc": target["acc"], "target_macs": target["macs"], "target_perf": target["perf"],
            "pareto_size": len(result["pareto"]), "acc_min": float(accs.min()), "acc_max": float(accs.max()),
            "acc_spread": float(accs.max() - accs.min()), "entropy_final": result["entropy_final"],
            **{f"target_{key}": v for key, v in latency[target["arch"]].items()}}


def write_search_plots(directory: Path, k: int, rows: list[dict], spread_rows: list[dict], front: list[dict],
                       target: dict, iterations: Path) -> None:
    """Into ``directory``: ``candidates.csv`` (every evaluated subnet, whether on the front, drawn from
    P(N) or spread), ``acc_vs_macs.png``; with method B's ``iterations`` table (a file that may be
    absent), ``entropy_mi.csv`` and ``entropy_mi.png``."""
    every = rows + spread_rows
    pd.DataFrame(every).assign(pareto=[r in front for r in every],
                               drawn_from=["P(N)"] * len(rows) + ["spread"] * len(spread_rows)).to_csv(
        directory / "candidates.csv", index=False)
    pareto_plot(directory / "acc_vs_macs.png", every, front, target, title=f"module {k}: candidates on route")
    if iterations.exists():
        table = pd.read_csv(iterations)
        table[["iteration", "entropy", "mi"]].to_csv(directory / "entropy_mi.csv", index=False)
        search_curves(directory / "entropy_mi.png", table, title=f"module {k}: method B training")
