"""Why a plain CNN loses on the hard scenes folder: the plain CNN of ``pipeline.train.baselines`` trained
directly on drawn scenes (``bench.own_data_folders.scene``), one recipe per line, read on a held-out
fifth. The question (docs/RESULTS.md "Hard data trains longer"): is it the data, the width, the learning
rate or the epochs?

    python -m bench.plain_recipe                                   # the study of docs/RESULTS.md
    python -m bench.plain_recipe --radius 9 15 --clutter 3 7 --recipes 12:8:0.05:1 12:20:0.05:1

A recipe is ``width:epochs:lr:clip`` (clip 0 = off); batch 64 as in the quick profile. Run it alone: it
prints the seconds per recipe.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from bench.own_data_folders import SHAPES, scene
from pipeline.train.baselines import BaselineConfig, plain_outputs, train_baseline

DEFAULT_RECIPES = ("4:8:0.1:0", "12:8:0.1:0", "12:8:0.1:1", "12:8:0.02:1", "4:8:0.05:1", "12:8:0.05:1",
                   "12:20:0.05:1")


def scenes(per_class: int, size: int, radius: tuple[float, float], clutter: tuple[int, int], seed: int,
           ) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3, size, size) uint8 images and (N,) labels, shuffled."""
    rng = np.random.default_rng(seed)
    images = [scene(s, size, rng, radius, clutter) for s in SHAPES for _ in range(per_class)]
    labels = np.repeat(np.arange(len(SHAPES)), per_class)
    order = np.random.default_rng(seed + 1).permutation(len(labels))
    return np.stack(images).transpose(0, 3, 1, 2)[order].copy(), labels[order]


def held_out_accuracy(recipe: str, x: np.ndarray, y: np.ndarray, n_train: int) -> float:
    width, epochs, lr, clip = recipe.split(":")
    flat = x[:n_train].reshape(n_train, x.shape[1], -1) / 255.0
    mean, std = flat.mean((0, 2)).tolist(), flat.std((0, 2)).tolist()
    cfg = BaselineConfig(small_width=1, large_width=int(width), epochs=int(epochs), batch_size=64, lr=float(lr),
                         grad_clip=float(clip))
    model = train_baseline(int(width), x[:n_train], y[:n_train], mean, std, len(SHAPES), cfg, 0, progress=False)
    logits, _ = plain_outputs(model, x[n_train:], mean, std)
    return float((logits.argmax(1).numpy() == y[n_train:]).mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--radius", type=float, nargs=2, default=(9, 15), help="shape radius range at 64 px")
    p.add_argument("--clutter", type=int, nargs=2, default=(3, 7), help="clutter strokes before the shape")
    p.add_argument("--per-class", type=int, default=400)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--recipes", nargs="*", default=list(DEFAULT_RECIPES))
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    x, y = scenes(args.per_class, args.size, tuple(args.radius), tuple(args.clutter), args.seed)
    n_train = int(0.8 * len(y))
    rows = []
    for recipe in args.recipes:
        start = time.perf_counter()
        acc = held_out_accuracy(recipe, x, y, n_train)
        rows.append({"recipe": recipe, "held_out_accuracy": acc, "seconds": round(time.perf_counter() - start, 1)})
        print(f"width:epochs:lr:clip {recipe:>14}  held-out {100 * acc:6.2f}%  ({rows[-1]['seconds']} s)", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"radius": args.radius, "clutter": args.clutter, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
