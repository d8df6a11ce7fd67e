"""Method B as the architect, measured: the elastic cascade of ``pipeline.architect.search`` trained on a
run's train split, then its whole-cascade shapes searched on the held-out images by method B and by random
search at the same budget (on the same trained weights), and, with ``--samplers``, the weights trained
again with uniform sampling instead of method B's probability model.

    python -m bench.architect --data KEPT_RUN/data/prepared --width 12 --epochs 20 --budget 24
    python -m bench.architect --data ... --samplers probmodel uniform --out bench/out/architect.json

Per (sampler, searcher): the chosen shape (the cheapest within one SE of the most accurate on the held-out
images), its calibrated accuracy and expected MACs there, the best score found after each evaluation, and
the training and search seconds. The held-out images choose; nothing here reads the test split.
Results and what they say: docs/RESULTS.md "Method B as the architect".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.architect.search import (
    ArchitectConfig,
    Scored,
    choose,
    default_choices,
    search_shapes,
    train_elastic,
)
from pipeline.io import load_held_out, load_split
from pipeline.models.cost import count_macs
from pipeline.models.elastic import ElasticCascade
from pipeline.models.modules import PlainCNN
from pipeline.train.inputs import normalisation_stats


def row(s: Scored) -> dict[str, Any]:
    return {"arch": s.arch.key(), "accuracy": s.accuracy, "mean_macs": s.mean_macs, "score": s.score,
            "exit_accuracy": list(s.exit_accuracy), "exit_macs": list(s.exit_macs),
            "shapes": [dataclasses.asdict(x) for x in s.shapes]}


def trajectory(scored: list[Scored]) -> list[float]:
    """The best score after each evaluation, in the order the searcher asked."""
    best, out = float("-inf"), []
    for s in scored:
        best = max(best, s.score)
        out.append(round(best, 5))
    return out


def plain_large_macs(width: int, image_shape: tuple[int, int, int], classes: int) -> int:
    """MACs per image of the run's ``plain_large`` (a ``PlainCNN`` of ``width``): the yardstick of a ceiling."""
    return count_macs(PlainCNN(width, image_shape[0], classes), image_shape)


def run(data: Path, width: int, cfg: ArchitectConfig, samplers: list[str], max_train: int = 0,
        max_macs_share: float | None = None) -> dict[str, Any]:
    train, held = load_split(data, "train"), load_held_out(data)
    if max_train:  # the first images of the (shuffled, stratified) train split: a cheaper run, said in the JSON
        train = dataclasses.replace(train, images=train.images[:max_train], labels=train.labels[:max_train],
                                    ids=train.ids[:max_train])
    side = int(train.images.shape[-1])
    classes = int(max(train.labels.max(), held.labels.max()) + 1)
    choices = default_choices(side, width)
    stats = normalisation_stats(train.images)
    large = plain_large_macs(width, tuple(int(v) for v in train.images.shape[1:]), classes)
    if max_macs_share is not None:
        cfg = dataclasses.replace(cfg, max_macs=max_macs_share * large)
    out: dict[str, Any] = {"data": str(data), "width": width, "train_images": len(train.labels),
                           "held_out_images": len(held.labels),
                           "plain_large_macs": large,
                           "config": dataclasses.asdict(cfg), "runs": []}
    for sampler in samplers:
        torch.manual_seed(cfg.seed)
        net = ElasticCascade(train.images.shape[1], classes, choices)
        start = time.perf_counter()
        train_elastic(net, train, dataclasses.replace(cfg, sampler=sampler), side,
                      lambda e, loss, s=sampler: print(f"architect [{s}]: epoch {e}/{cfg.epochs} loss {loss:.3f}",
                                                       flush=True))
        seconds = time.perf_counter() - start
        for searcher in ("method_b", "random"):
            t = time.perf_counter()
            scored = search_shapes(net, held, dataclasses.replace(cfg, searcher=searcher), side, stats)
            chosen = choose(scored, len(held), cfg.max_macs)
            out["runs"].append({"sampler": sampler, "searcher": searcher, "train_seconds": round(seconds, 1),
                                "search_seconds": round(time.perf_counter() - t, 1), "chosen": row(chosen),
                                "best_score": trajectory(scored), "scored": [row(s) for s in scored]})
            print(f"{sampler:9s} {searcher:8s} chosen {chosen.accuracy:.4f} at {chosen.mean_macs / 1e6:.2f} M "
                  f"(best score {max(s.score for s in scored):.4f}; {chosen.arch.key()})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a run's data/prepared (train, route, calib)")
    p.add_argument("--width", type=int, default=12, help="the run's plain_large width (baselines.large_width)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--budget", type=int, default=24, help="distinct shapes scored per searcher")
    p.add_argument("--samplers", nargs="+", default=["probmodel"], choices=["probmodel", "uniform"])
    p.add_argument("--m", type=int, default=1, help="shapes drawn from P per batch beside the two corners")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-macs-share", type=float, default=None,
                   help="a ceiling on the chosen cascade's mean MACs, as a share of plain_large's (default: none)")
    p.add_argument("--max-train", type=int, default=0, help="train on the first N train images (0: all)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=Path("bench/out/architect.json"))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = ArchitectConfig(epochs=args.epochs, budget=args.budget, seed=args.seed, m=args.m)
    result = run(args.data, args.width, cfg, args.samplers, args.max_train, args.max_macs_share)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
