"""Would routing pay if the candidates differed where it can be predicted? A small experiment before
any design (docs/RESULTS.md "Candidates that differ where it can be predicted"): module-2 specialists
per group of confusable classes, routed by exit 1's answer.

    python -m bench.archive.routing_specialists                   # a workspace after `dvc repro` (about 10 min)
    python -m bench.archive.routing_specialists --epochs 4 --max-train 6000     # a smoke run

`bench.archive.routing_predictability` showed that which of a supernet's paths is right is close to a coin
flip on the images that reach module 2: the paths are all generalists and differ by noise. This
bench builds candidates that differ by construction: behind the pipeline's frozen module 1, one
module 2 per group of classes (the groups come from exit 1's confusions on `calib`: the most confused
pairs are merged until ``--groups`` remain), each trained only on its group's training images, all of
the params' module-2 architecture (so equal MACs). An image goes to the specialist of the group of
exit 1's answer. Beside them: the same architecture trained on every image with the same recipe (the
generalist, the static twin), the pipeline's own trained module 2, and specialists chosen by the true
class's group (the routing oracle: what a perfect group predictor would give).

Read as the cascade answers at the operating point: exit 1's calib-fitted threshold (params'
`calibrate` rule on the pipeline's module 1 and 2) decides which images reach module 2 and module 2
answers them (the default cascade's exit 2, whose threshold is 0 on seed 0), on `calib` and `test`.
Training uses the pipeline's recipe (``bench.archive.ceiling``: ``make_optimizer``, ``learning_rate``, cached
features with flip and shift). Writes bench/out/routing_specialists.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bench.archive.ceiling import Views, fit_on_views, next_views, normalised, run_batched
from pipeline.io import load_split, read_json
from pipeline.models.config import ModelConfig
from pipeline.models.modules import build_module
from pipeline.models.store import load_module
from pipeline.params.config import load_params
from pipeline.train.config import module_train_config


def confusion_groups(pred: np.ndarray, labels: np.ndarray, n_classes: int, groups: int) -> list[list[int]]:
    """Classes merged by the most confused pairs first (symmetric confusion counts, off the diagonal)
    until ``groups`` groups remain; each group sorted, groups in order of their smallest class."""
    conf = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(conf, (labels, pred), 1)
    pair = conf + conf.T
    parent = list(range(n_classes))

    def root(c: int) -> int:
        while parent[c] != c:
            c = parent[c]
        return c

    order = sorted(
        ((int(pair[a, b]), a, b) for a in range(n_classes) for b in range(a + 1, n_classes)),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    count = n_classes
    for _, a, b in order:
        if count <= groups:
            break
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
            count -= 1
    members: dict[int, list[int]] = {}
    for c in range(n_classes):
        members.setdefault(root(c), []).append(c)
    return sorted(members.values())


def group_of(classes: torch.Tensor, groups: list[list[int]]) -> torch.Tensor:
    """(N,) the index of each class's group."""
    table = torch.empty(sum(len(g) for g in groups), dtype=torch.long)
    for i, g in enumerate(groups):
        table[g] = i
    return table[classes]


def routed_logits(per_group: list[torch.Tensor], choice: torch.Tensor) -> torch.Tensor:
    """(N, classes): image i's logits from the specialist ``choice[i]``."""
    stacked = torch.stack(per_group)  # (G, N, classes)
    return stacked[choice, torch.arange(choice.shape[0])]


def cascade_accuracy(exit1: torch.Tensor, exit2: torch.Tensor, y: torch.Tensor, threshold: float) -> dict:
    """Exit 1 answers where its top probability reaches ``threshold``, exit 2 the rest: overall accuracy,
    and exit 2's on the images that reach it."""
    reach = exit1.softmax(-1).max(-1).values < threshold
    answer = torch.where(reach, exit2.argmax(-1), exit1.argmax(-1))
    return {
        "accuracy": round(100 * (answer == y).double().mean().item(), 2),
        "reaching": int(reach.sum()),
        "exit2_on_reaching": round(100 * (exit2.argmax(-1) == y)[reach].double().mean().item(), 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--data", type=Path, default=Path("data/prepared"))
    p.add_argument("--models", type=Path, default=Path("models/modules"))
    p.add_argument(
        "--calibration",
        type=Path,
        default=Path("metrics/calibrate.json"),
        help="the calibrate stage's metrics: exit 1's threshold of the selected cascade",
    )
    p.add_argument("--groups", type=int, default=3)
    p.add_argument(
        "--train-by",
        choices=("class", "answer"),
        default="class",
        help="each specialist's training images: those of its group's classes, or those exit 1 "
        "answers with one of them (the images the router will send it, misrouted ones included)",
    )
    p.add_argument("--epochs", type=int, default=0, help="epochs per module 2 (0: the params' own)")
    p.add_argument("--max-train", type=int, default=0, help="first N training images only (0: all)")
    p.add_argument("--shift", type=int, default=2, help="random feature-map shift, in cells")
    p.add_argument("--out", type=Path, default=Path("bench/out/routing_specialists.json"))
    args = p.parse_args(argv)
    params = load_params(args.params)
    seed = int(params.get("seed", 0))
    spec = ModelConfig.from_params(params).specs[1]
    epochs = args.epochs or module_train_config(params, "m2", seed).epochs
    train, calib, test = (load_split(args.data, s) for s in ("train", "calib", "test"))
    if args.max_train:
        train = train.subset(np.arange(min(args.max_train, len(train))))
    n_classes = len(json.loads((args.data / "meta.json").read_text())["classes"])
    ys = {
        "train": torch.from_numpy(train.labels).long(),
        "calib": torch.from_numpy(calib.labels).long(),
        "test": torch.from_numpy(test.labels).long(),
    }
    threshold = float(read_json(args.calibration)["selected"]["thresholds"][0])
    m1, info = load_module(args.models / "m1" / "train")
    raw = Views(
        normalised(train, info.mean, info.std),
        normalised(train, info.mean, info.std, flip=True),
        normalised(calib, info.mean, info.std),
        normalised(test, info.mean, info.std),
    )
    views = next_views(m1, raw)
    exit1 = {"calib": views.calib_logits[0], "test": views.test_logits[0]}
    groups = confusion_groups(exit1["calib"].argmax(-1).numpy(), ys["calib"].numpy(), n_classes, args.groups)
    print(f"groups from exit 1's confusions on calib: {groups}; exit 1 threshold {threshold:.3f}", flush=True)
    in_channels = views.train.shape[1]

    def trained(keep: torch.Tensor | None, salt: int) -> tuple[dict, float]:
        torch.manual_seed(seed + salt)
        net = build_module(spec, in_channels, n_classes)
        v = (
            views
            if keep is None
            else Views(views.train[keep], views.train_flipped[keep], views.calib, views.test)
        )
        seconds = fit_on_views(
            net, v, ys["train"] if keep is None else ys["train"][keep], epochs, args.shift, seed
        )
        return {s: run_batched(net, getattr(views, s))[1] for s in ("calib", "test")}, seconds

    m2, _ = load_module(args.models / "m2" / "train")
    candidates = {
        "pipeline's module 2 (its own training)": {
            s: run_batched(m2, getattr(views, s))[1] for s in ("calib", "test")
        }
    }
    generalist, g_seconds = trained(None, 0)
    candidates["generalist (same recipe, every image)"] = generalist
    if args.train_by == "class":
        train_group = group_of(ys["train"], groups)
    else:  # exit 1's answer on each (unflipped) training image
        train_group = group_of(run_batched(m1, raw.train)[1].argmax(-1), groups)
    specialists, s_seconds = [], 0.0
    for i in range(len(groups)):
        outs, seconds = trained(train_group == i, 1 + i)
        specialists.append(outs)
        s_seconds += seconds
    for name, choose in (
        ("specialists, routed by exit 1's answer", lambda s: group_of(exit1[s].argmax(-1), groups)),
        ("specialists, routed by the true class (oracle)", lambda s: group_of(ys[s], groups)),
    ):
        candidates[name] = {
            s: routed_logits([sp[s] for sp in specialists], choose(s)) for s in ("calib", "test")
        }
    rows = []
    for name, outs in candidates.items():
        row = {
            "candidate": name,
            **{s: cascade_accuracy(exit1[s], outs[s], ys[s], threshold) for s in ("calib", "test")},
        }
        rows.append(row)
        print(
            f"  {name:<48} calib {row['calib']['accuracy']:6.2f}% "
            f"(exit 2 on {row['calib']['reaching']} reaching: "
            f"{row['calib']['exit2_on_reaching']:6.2f}%) | test {row['test']['accuracy']:6.2f}% (exit 2 on "
            f"{row['test']['reaching']}: {row['test']['exit2_on_reaching']:6.2f}%)",
            flush=True,
        )
    group_right = {
        s: float((group_of(exit1[s].argmax(-1), groups) == group_of(ys[s], groups)).double().mean())
        for s in ("calib", "test")
    }
    out = {
        "groups": groups,
        "threshold": threshold,
        "epochs": epochs,
        "max_train": len(train),
        "seconds": {"generalist": round(g_seconds), "specialists": round(s_seconds)},
        "exit1_group_accuracy": group_right,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
