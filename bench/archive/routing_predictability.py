"""Is "which candidate will be right" predictable, and would more labelled images help? The limit
behind per-image routing, measured apart from the cascade (docs/RESULTS.md "Is the right candidate
predictable at all?").

    python -m bench.archive.routing_predictability --modules 2      # a workspace whose module 2 is a supernet

Routing at module k can only gain on the images that reach it (the static twin's calib-fitted exits
before k pass them) and on which the candidates disagree: one is right, the other wrong. Per
candidate j this bench asks, on the `test` images that reach module k:

- how many images routing could change at all: the candidates' exit-k accuracy, the share on which
  candidate j and the twin disagree, and the oracle (any candidate right);
- how well a learner, trained on labelled non-test images that reach module k, tells the
  disagreements apart: the AUC of ``p_j(right) - p_twin(right)`` for "j right, twin wrong" against
  "twin right, j wrong" (0.5: a coin), for learners from a confidence rule (no training) through
  logistic regression to gradient-boosted trees, each on a growing training set (a quarter, half and
  all of `route`'s reaching images, then `route` + `calib`): a curve that keeps rising says more
  labelled data would help; a flat one near 0.5 says the input does not carry the answer;
- what sending the top q of images by predicted gain to candidate j would do to exit k's accuracy
  on those images, beside random sending of the same share and the oracle.

Features per image: module k's input averaged over space (and over a 2x2 grid), exit k-1's class
probabilities, their maximum and entropy: what the cascade has in hand before module k runs.
Nothing is chosen here; `test` is only read. Writes bench/out/routing_predictability.json. The features,
the learner and the AUC live in `pipeline.routing.predictability`, which every evaluate run uses for
routing's verdict (fitted on `route`, read on `calib`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.ensemble import HistGradientBoostingClassifier

from bench.archive.routing_headroom import (
    SPLITS,
    evaluate_policy,
    exit_k_correct,
    exit_probs_before,
    features_before,
    load_workspace,
    reaching,
    with_candidate,
    workspace_parser,
)
from pipeline.io import read_json, write_json
from pipeline.routing.fit import exit_outputs
from pipeline.routing.predictability import disagreement_auc, image_features, logistic, p_right, pooled
from pipeline.search.space import Arch

SHARES = (0.1, 0.25, 0.5)


def transition_output(stages, k: int, inputs: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Module k's shared stem (its transition, which every candidate runs first) on its input."""
    stem = stages[k - 1].module.transition
    with torch.inference_mode():
        return torch.cat(
            [stem(inputs[i : i + batch_size]) for i in range(0, len(inputs), batch_size)]
        ).float()


def learners(seed: int) -> dict[str, Any]:
    return {
        "logistic": logistic,
        "boosted trees": lambda: HistGradientBoostingClassifier(
            max_iter=150, learning_rate=0.05, max_leaf_nodes=8, l2_regularization=1.0, random_state=seed
        ),
    }


def send_top(gain: np.ndarray, right: np.ndarray, j: int, twin: int, share: float) -> float:
    """Exit-k accuracy on these images when the top ``share`` by ``gain`` go to j, the rest to the twin."""
    n = len(gain)
    top = np.argsort(-gain, kind="stable")[: int(round(share * n))]
    answer = right[:, twin].copy()
    answer[top] = right[top, j]
    return float(answer.mean())


def module_report(
    k: int,
    stages,
    models: Path,
    costs,
    xs: dict,
    ys: dict,
    cfg: dict,
    kind: str,
    fractions: list[float],
    seed: int,
    with_transition: bool = False,
) -> dict[str, Any]:
    splits = tuple(xs)  # SPLITS, and "train" with --with-train
    selection = read_json(models / f"m{k}" / "select" / "selection.json")
    archs = [Arch.from_key(key) for key in selection["candidates"]]
    macs = [costs.macs(k, a) for a in archs]
    twin = archs.index(Arch.from_key(selection["static"]))
    outs = {
        split: [
            exit_outputs(with_candidate(stages, k, a, m), xs[split], kind)
            for a, m in zip(archs, macs, strict=True)
        ]
        for split in splits
    }
    pinned = {split: torch.full((len(ys[split]),), twin, dtype=torch.long) for split in splits}
    fitted = evaluate_policy("twin", pinned, outs, ys, cfg, kind, len(archs))
    reach = {split: reaching(outs[split], twin, fitted, k, kind).numpy() for split in splits}
    right = {
        split: exit_k_correct(outs[split], ys[split], k, fitted["ensemble_decay"]).numpy()[reach[split]]
        for split in splits
    }
    feats = {}
    for split in splits:
        inputs = features_before(stages, xs[split], k)
        f = image_features(inputs, exit_probs_before(stages, xs[split], k))
        if with_transition:  # free: every candidate computes it before it branches
            f = np.concatenate([f, pooled(transition_output(stages, k, inputs))], 1)
        feats[split] = f[reach[split]]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(right["route"]))
    sets = {f"route x{f:g}": order[: int(round(f * len(order)))] for f in fractions}
    if min(len(right[split]) for split in splits) < 2:  # e.g. the twin's exits before k answer every image
        return {
            "module": k,
            "candidates": [a.key() for a in archs],
            "candidate_macs": macs,
            "twin": twin,
            "reaching": {split: int(reach[split].sum()) for split in splits},
            "rows": [],
            "note": f"too few images reach module {k} to route",
        }
    test_right = right["test"]
    report: dict[str, Any] = {
        "module": k,
        "candidates": [a.key() for a in archs],
        "candidate_macs": macs,
        "twin": twin,
        "reaching": {split: int(reach[split].sum()) for split in splits},
        "exit_k_accuracy_reaching_test": test_right.mean(0).tolist(),
        "oracle_reaching_test": float(test_right.any(1).mean()),
        "disagree_with_twin_test": [
            float((test_right[:, j] != test_right[:, twin]).mean()) for j in range(len(archs))
        ],
        "rows": [],
    }
    prev = exit_probs_before(stages, xs["test"], k).flatten(1).numpy()[reach["test"]]
    for j in range(len(archs)):
        if j == twin:
            continue
        # no training: a less confident exit k-1 sends the image to j
        report["rows"].append(
            {
                "candidate": j,
                "learner": "exit k-1 doubt (no training)",
                "train": "-",
                "train_images": 0,
                "auc": disagreement_auc(-prev.max(1), test_right, j, twin),
                "send_top": {f"{q:g}": send_top(-prev.max(1), test_right, j, twin, q) for q in SHARES},
            }
        )
    runs = [(name, right["route"][idx], feats["route"][idx]) for name, idx in sets.items()]
    runs.append(
        (
            "route + calib",
            np.concatenate([right["route"], right["calib"]]),
            np.concatenate([feats["route"], feats["calib"]]),
        )
    )
    if "train" in right:  # the modules' own training images: 10x more, but seen in training (held in)
        runs.append(("train (held in)", right["train"], feats["train"]))
    for learner, make in learners(seed).items():
        for name, r_fit, x_fit in runs:
            p = p_right(make, x_fit, r_fit, feats["test"])
            for j in range(len(archs)):
                if j == twin:
                    continue
                gain = p[:, j] - p[:, twin]
                report["rows"].append(
                    {
                        "candidate": j,
                        "learner": learner,
                        "train": name,
                        "train_images": len(r_fit),
                        "train_disagreements": int((r_fit[:, j] != r_fit[:, twin]).sum()),
                        "auc": disagreement_auc(gain, test_right, j, twin),
                        "send_top": {f"{q:g}": send_top(gain, test_right, j, twin, q) for q in SHARES},
                    }
                )
    for j in range(len(archs)):
        if j == twin:
            continue
        base, other = test_right[:, twin].mean(), test_right[:, j].mean()
        report["rows"].append(
            {
                "candidate": j,
                "learner": "random (expected)",
                "train": "-",
                "train_images": 0,
                "auc": 0.5,
                "send_top": {f"{q:g}": float((1 - q) * base + q * other) for q in SHARES},
            }
        )
        report["rows"].append(
            {
                "candidate": j,
                "learner": "oracle (reads labels)",
                "train": "-",
                "train_images": 0,
                "auc": 1.0,
                "send_top": {
                    f"{q:g}": send_top(
                        test_right[:, j].astype(float) - test_right[:, twin], test_right, j, twin, q
                    )
                    for q in SHARES
                },
            }
        )
    return report


def main(argv: list[str] | None = None) -> int:
    p = workspace_parser(__doc__)
    p.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=[0.25, 0.5, 1.0],
        help="shares of route's reaching images to train on (then route + calib)",
    )
    p.add_argument(
        "--with-train",
        action="store_true",
        help="also train the learners on the modules' own training images that reach module k "
        "(many more, but held in: the candidates saw them, so their disagreements differ)",
    )
    p.add_argument(
        "--with-transition",
        action="store_true",
        help="also give the learners module k's transition output (its shared stem, pooled), which every "
        "candidate computes before the paths branch",
    )
    p.add_argument("--modules", type=int, nargs="*", default=None, help="supernet modules (default: all)")
    p.add_argument("--out", type=Path, default=Path("bench/out/routing_predictability.json"))
    args = p.parse_args(argv)
    params, cfg, kind, costs, stages, xs, ys = load_workspace(
        args.params, args.profile, args.models, args.data, SPLITS + (("train",) if args.with_train else ())
    )
    reports = []
    for k in range(2, costs.n_modules + 1):
        path = args.models / f"m{k}" / "select" / "selection.json"
        if (
            not path.exists()
            or len(read_json(path)["candidates"]) < 2
            or (args.modules and k not in args.modules)
        ):
            continue
        report = module_report(
            k,
            stages,
            args.models,
            costs,
            xs,
            ys,
            cfg,
            kind,
            args.fractions,
            int(params.get("seed", 0)),
            args.with_transition,
        )
        if report.get("note"):
            print(f"module {k}: reaching {report['reaching']}: {report['note']}")
            reports.append(report)
            continue
        print(
            f"module {k}: reaching {report['reaching']}; exit-{k} accuracy on reaching test images per "
            f"candidate {[round(100 * a, 2) for a in report['exit_k_accuracy_reaching_test']]} "
            f"(twin {report['twin']}), oracle {100 * report['oracle_reaching_test']:.2f}%"
        )
        for row in report["rows"]:
            auc = "  -  " if row["auc"] is None else f"{row['auc']:.3f}"
            sends = " ".join(f"{q}:{100 * a:.2f}" for q, a in row["send_top"].items())
            print(
                f"  cand {row['candidate']} {row['learner']:<28} {row['train']:<14} "
                f"n={row['train_images']:<5} "
                f"AUC {auc} | exit-{k} acc sending top share -> {sends}"
            )
        reports.append(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(
        args.out, {"modules": reports, "with_train": args.with_train, "with_transition": args.with_transition}
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
