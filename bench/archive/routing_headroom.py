"""Does per-image routing pay in a trained cascade, and if not, why? Every routing policy of each
supernet module, measured end to end: the whole cascade with that module routed, exit thresholds
(and exit-ensemble decay) fitted on `calib` by params' `calibrate` rule, then read on `test`.

    python -m bench.archive.routing_headroom                 # a workspace after `dvc repro`
    python -m bench.archive.routing_headroom --pools 1 2 4 --prices 0 0.02 0.05 0.1 0.2 0.4

Policies per supernet module k (the other modules on their selected static paths):

- ``static:<path>``: every image on one candidate (the twin routing must beat is the one `select`
  chose; the others show the module's static accuracy-cost front);
- ``label``: the `select` stage's predictor (labels: the cheapest candidate whose exit is right);
- ``p_right pool=P price=L``: a predictor estimating each candidate's chance of being right (its
  labels: what the cascade answers at exit k, with the exit ensemble), trained on `route`, choosing
  argmax p_right - L * MACs / max MACs; the setting is chosen on `calib` (the cheapest as accurate as
  the static twin within 0.05 points, else the most accurate at no more MACs), every price's test
  reading shown for transparency;
- ``oracle``: per image the cheapest candidate whose exit-k answer is right (reads the labels: the
  headroom no predictor can pass, not a policy).

Writes bench/out/routing_headroom.json. Nothing is chosen on `test`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.io import load_split, read_json, write_json
from pipeline.models.modules import confidence
from pipeline.models.profile import CostModel
from pipeline.params.config import load_params, section
from pipeline.routing.assemble import load_stage, load_stages
from pipeline.routing.calibration import simulate_thresholds
from pipeline.routing.engine import Stage, combine_exits
from pipeline.routing.fit import exit_outputs, fit_best_ensemble
from pipeline.routing.package import CascadeMeta
from pipeline.routing.predictor import Predictor, predictor_macs, priced_offsets, train_p_right
from pipeline.routing.recognize import preprocess
from pipeline.search.space import Arch

SPLITS = ("route", "calib", "test")


def features_before(stages: list[Stage], x: torch.Tensor, k: int, batch_size: int = 512) -> torch.Tensor:
    """Module k's (1-based) input: x through the single-path stages 1..k-1 -> (N, C, H, W)."""
    parts = []
    with torch.inference_mode():
        for s in range(0, x.shape[0], batch_size):
            h = x[s:s + batch_size]
            for stage in stages[:k - 1]:
                h, _ = stage.module(h, stage.candidates[0])
            parts.append(h.float())
    return torch.cat(parts)


def exit_probs_before(stages: list[Stage], x: torch.Tensor, k: int, batch_size: int = 512) -> torch.Tensor:
    """Exit k-1's class probabilities (the previous exit's answer, which the cascade has computed before
    module k runs) as an (N, classes, 1, 1) map the predictor can read."""
    parts = []
    with torch.inference_mode():
        for s in range(0, x.shape[0], batch_size):
            h, logits = x[s:s + batch_size], None
            for stage in stages[:k - 1]:
                h, logits = stage.module(h, stage.candidates[0])
            parts.append(logits.float().softmax(-1)[:, :, None, None])
    return torch.cat(parts)


def predictor_inputs(reads: str, stages: list[Stage], k: int, xs: dict, inputs: dict) -> dict[str, torch.Tensor]:
    """What the p_right predictor reads per split: ``input`` (module k's input, as select), ``transition``
    (the supernet's shared stem), ``exit`` (exit k-1's probabilities), ``input+exit`` (the input
    averaged over space, beside exit k-1's probabilities: one (N, C + classes, 1, 1) map)."""
    if reads == "input":
        return inputs
    if reads == "transition":  # every candidate runs the stem first anyway
        with torch.inference_mode():
            return {split: torch.cat([stages[k - 1].module.transition(f[i:i + 512]) for i in range(0, len(f), 512)])
                    for split, f in inputs.items()}
    if k < 2:
        raise SystemExit(f"--reads {reads}: module {k} has no exit before it")
    probs = {split: exit_probs_before(stages, xs[split], k) for split in SPLITS}
    if reads == "exit":
        return probs
    return {split: torch.cat([inputs[split].mean(dim=(2, 3), keepdim=True), probs[split]], 1) for split in SPLITS}


def reaching(outs: list[tuple[torch.Tensor, np.ndarray]], static: int, fitted: dict, k: int, kind: str
             ) -> torch.Tensor:
    """(N,) whether an image passes exits 1..k-1 of the static twin (its calib-fitted thresholds and
    decay): the images routing at module k serves."""
    scores = combine_exits(outs[static][0], fitted["ensemble_decay"])
    conf = confidence(scores, kind)[:, :k - 1]
    return (conf < torch.tensor(fitted["thresholds"][:k - 1], dtype=conf.dtype)).all(1)


def with_candidate(stages: list[Stage], k: int, arch: Arch, macs: int) -> list[Stage]:
    """The stages with module k pinned to one candidate path."""
    out = list(stages)
    out[k - 1] = Stage(stages[k - 1].module, (arch,), (macs,), math.inf)
    return out


def gather(per_candidate: list[tuple[torch.Tensor, np.ndarray]], choice: torch.Tensor
           ) -> tuple[torch.Tensor, np.ndarray]:
    """Logits (N, K, classes) and cumulative MACs (N, K) of the cascade when image i runs candidate
    choice[i] at the routed module (every candidate's full-cascade outputs given)."""
    logits = torch.stack([lg for lg, _ in per_candidate])  # (R, N, K, classes)
    cum = np.stack([c for _, c in per_candidate])  # (R, N, K)
    rows = np.arange(choice.shape[0])
    return logits[choice, torch.arange(choice.shape[0])], cum[choice.numpy(), rows]


def read_on(outputs: tuple[torch.Tensor, np.ndarray, torch.Tensor], fitted: dict, kind: str) -> dict[str, Any]:
    """Calib-fitted thresholds and decay read on another split's outputs."""
    logits, cum, y = outputs
    scores = combine_exits(logits, fitted["ensemble_decay"])
    correct = (scores.argmax(dim=-1) == y[:, None]).numpy()
    acc, macs, counts = simulate_thresholds(confidence(scores, kind).numpy(), correct, cum, fitted["thresholds"])
    return {"accuracy": float(acc), "mean_macs": float(macs), "exit_counts": np.asarray(counts).tolist()}


def evaluate_policy(name: str, choices: dict[str, torch.Tensor], outs: dict[str, list], ys: dict[str, torch.Tensor],
                    cfg: dict, kind: str, r: int, k: int = 1, extra_macs: int = 0) -> dict[str, Any]:
    """Fit the exit rule on calib with this routing, read it on test; shares of each candidate.
    ``extra_macs``: the predictor's cost, paid by every image from module k on."""
    def routed(split: str) -> tuple[torch.Tensor, np.ndarray]:
        logits, cum = gather(outs[split], choices[split])
        cum = cum.astype(np.float64)
        cum[:, k - 1:] += extra_macs
        return logits, cum

    calib = routed("calib")
    fitted = fit_best_ensemble(calib[0], calib[1], ys["calib"], cfg, kind)
    test = routed("test")
    row = {"policy": name,
           "calib": {"accuracy": fitted["accuracy"], "mean_macs": fitted["mean_macs"]},
           "test": read_on((test[0], test[1], ys["test"]), fitted, kind),
           "share": (torch.bincount(choices["test"], minlength=r).double() / len(choices["test"])).tolist(),
           "ensemble_decay": fitted["ensemble_decay"], "thresholds": fitted["thresholds"]}
    return row


def exit_k_correct(per_candidate: list[tuple[torch.Tensor, np.ndarray]], y: torch.Tensor, k: int,
                   decay: float) -> torch.Tensor:
    """(N, R): whether the cascade's answer at exit k (with the exit ensemble) is right per candidate."""
    return torch.stack([combine_exits(lg, decay)[:, k - 1].argmax(-1) == y for lg, _ in per_candidate], 1)


def module_report(k: int, stages: list[Stage], models: Path, costs: CostModel, xs: dict, ys: dict, cfg: dict,
                  kind: str, pools: list[int], prices: list[float], seed: int, epochs: int,
                  reads: str = "input", train_on: str = "all") -> dict[str, Any]:
    selection = read_json(models / f"m{k}" / "select" / "selection.json")
    archs = [Arch.from_key(key) for key in selection["candidates"]]
    macs = [costs.macs(k, a) for a in archs]
    r = len(archs)
    static = archs.index(Arch.from_key(selection["static"]))
    outs = {split: [exit_outputs(with_candidate(stages, k, a, m), xs[split], kind)
                    for a, m in zip(archs, macs, strict=True)]
            for split in SPLITS}
    rows = []
    for i, arch in enumerate(archs):
        pinned = {split: torch.full((len(ys[split]),), i, dtype=torch.long) for split in SPLITS}
        row = evaluate_policy(f"static:{arch.key() or '(fixed)'}", pinned, outs, ys, cfg, kind, r)
        row["twin"] = i == static
        rows.append(row)
    twin = rows[static]
    decay = twin["ensemble_decay"]
    inputs = {split: features_before(stages, xs[split], k) for split in SPLITS}
    feats = predictor_inputs(reads, stages, k, xs, inputs)
    right = {split: exit_k_correct(outs[split], ys[split], k, decay) for split in SPLITS}
    # the predictor's training images: every route image, or those the twin's exits before k pass on
    keep = reaching(outs["route"], static, twin, k, kind) if train_on == "reaching" and k > 1 else None
    fit_x, fit_right = ((feats["route"], right["route"]) if keep is None else
                        (feats["route"][keep], right["route"][keep]))
    # the select stage's label predictor, where it trained one
    routed, _ = load_stage(models, k, costs, routing="predictor")
    if routed.predictor is not None:
        with torch.inference_mode():
            choice = {split: routed.predictor.choose(inputs[split]).cpu() for split in SPLITS}
        rows.append(evaluate_policy("label (select's predictor)", choice, outs, ys, cfg, kind, r, k,
                                    routed.predictor_macs))
    # the cost-priced p_right predictor, per pooling grid and price
    priced = []
    for pool in pools:
        predictor = Predictor(feats["route"].shape[1], r, hidden=16, pool=pool, seed=seed + k, scoring="p_right")
        p_macs = predictor_macs(predictor, tuple(feats["route"].shape[1:]))
        history = train_p_right(predictor, fit_x, fit_right, epochs=epochs, lr=0.01, batch_size=128, seed=seed + k)
        for price in prices:
            predictor.with_offsets(priced_offsets(price, macs))
            with torch.inference_mode():
                choice = {split: predictor.choose(feats[split]).cpu() for split in SPLITS}
            row = evaluate_policy(f"p_right {reads} pool={pool} price={price:g}", choice, outs, ys, cfg, kind, r,
                                  k, p_macs)
            row.update(pool=pool, price=price, fit_accuracy=history["accuracy"][-1], reads=reads,
                       predictor_macs=p_macs, train_on=train_on, train_images=len(fit_right))
            priced.append(row)
    rows.extend(priced)
    # chosen on calib, as the routing target reads test: the cheapest setting as accurate as the static
    # twin (within 0.05 points) at no more MACs; else the most accurate at no more MACs
    affordable = [p for p in priced if p["calib"]["mean_macs"] <= twin["calib"]["mean_macs"] * (1 + 1e-9)]
    equal = [p for p in affordable if p["calib"]["accuracy"] >= twin["calib"]["accuracy"] - 0.0005]
    chosen = (min(equal, key=lambda p: (p["calib"]["mean_macs"], -p["calib"]["accuracy"])) if equal else
              max(affordable, key=lambda p: (p["calib"]["accuracy"], -p["calib"]["mean_macs"]), default=None))
    # the oracle: per image the cheapest candidate right at exit k (labels read: headroom only)
    cost = torch.tensor(macs, dtype=torch.float64)
    oracle = {split: torch.where(right[split].any(1), torch.where(right[split], cost, math.inf).argmin(1),
                                 torch.full_like(ys[split], static)) for split in SPLITS}
    rows.append(evaluate_policy("oracle (reads labels)", oracle, outs, ys, cfg, kind, r))
    return {"module": k, "candidates": [a.key() for a in archs], "candidate_macs": macs, "static": static,
            "exit_k_accuracy_test": right["test"].double().mean(0).tolist(),
            "reads": reads, "train_on": train_on, "train_images": len(fit_right),
            "rows": rows, "chosen_on_calib": None if chosen is None else chosen["policy"]}


def load_workspace(params_path: Path, profile: Path, models: Path, data: Path,
                   splits: tuple[str, ...] = SPLITS) -> tuple:
    """(params, calibrate cfg, confidence kind, cost model, stages on their static choices, preprocessed
    images per split, labels per split) of a workspace after `dvc repro`."""
    params = load_params(params_path)
    cfg = {"mode": "delta", "delta": 0.003, "budget_macs": None, "grid": 50, "reference": "best",
           "ensemble_decays": [0.0], **section(params, "calibrate")}
    kind = (params.get("model") or {}).get("confidence", "maxprob")
    costs = CostModel(read_json(profile))
    torch.manual_seed(0)
    stages, infos = load_stages(models, costs, routing="testset")
    meta = read_json(data / "meta.json")
    cmeta = CascadeMeta(classes=tuple(meta["classes"]), image_shape=tuple(meta["image_shape"]),
                        mean=infos[0].mean, std=infos[0].std, confidence_kind=kind)
    xs, ys = {}, {}
    for split in splits:
        loaded = load_split(data, split)
        xs[split], ys[split] = preprocess(loaded.images, cmeta), torch.from_numpy(loaded.labels).long()
    return params, cfg, kind, costs, stages, xs, ys


def workspace_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser with the workspace's paths (``--models --data --profile --params``, read by
    :func:`load_workspace`), defaults as after `dvc repro` in the repository root."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, default=Path("models/modules"))
    p.add_argument("--data", type=Path, default=Path("data/prepared"))
    p.add_argument("--profile", type=Path, default=Path("models/profile.json"))
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    return p


def main(argv: list[str] | None = None) -> int:
    p = workspace_parser(__doc__)
    p.add_argument("--pools", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--prices", type=float, nargs="+", default=[0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 1.0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--reads", choices=("input", "transition", "exit", "input+exit"), default="input",
                   help="what the p_right predictor reads: the module's input (as select), the supernet's "
                        "transition output (its shared stem, which every candidate runs first), the previous "
                        "exit's probabilities, or the input averaged over space beside them")
    p.add_argument("--train-on", choices=("all", "reaching"), default="all",
                   help="the predictor's route images: all, or those the static twin's earlier exits pass "
                        "(calib-fitted thresholds): the images routing at module k serves")
    p.add_argument("--modules", type=int, nargs="*", default=None, help="supernet modules to measure (default: all)")
    p.add_argument("--out", type=Path, default=Path("bench/out/routing_headroom.json"))
    args = p.parse_args(argv)
    params, cfg, kind, costs, stages, xs, ys = load_workspace(args.params, args.profile, args.models, args.data)
    reports = []
    for k in range(1, costs.n_modules + 1):
        path = args.models / f"m{k}" / "select" / "selection.json"
        if not path.exists() or len(read_json(path)["candidates"]) < 2 or (args.modules and k not in args.modules):
            continue
        print(f"module {k}: routing policies (thresholds fitted on calib, read on test)")
        report = module_report(k, stages, args.models, costs, xs, ys, cfg, kind, args.pools, args.prices,
                               int(params.get("seed", 0)), args.epochs, args.reads, args.train_on)
        for row in report["rows"]:
            mark = " <- chosen on calib" if row["policy"] == report["chosen_on_calib"] else (
                " (static twin)" if row.get("twin") else "")
            print(f"  {row['policy']:<34} calib {100 * row['calib']['accuracy']:6.2f}% "
                  f"{row['calib']['mean_macs'] / 1e6:5.2f} M | test {100 * row['test']['accuracy']:6.2f}% "
                  f"{row['test']['mean_macs'] / 1e6:5.2f} M | share {[round(s, 3) for s in row['share']]}{mark}")
        reports.append(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, {"modules": reports, "calibrate": cfg})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
