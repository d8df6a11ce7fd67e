"""Benchmark: does a plain CNN's plateau come from its recipe? A kept run's plain CNN trained again as the
baselines stage trained it (the run's params, its step floor, its training seed) and under variants, each
read on the run's held-out images, with its training accuracy along the way.

    python -m bench.plateau --run KEPT_RUN [--net plain_large] [--variants committed warmup_epochs=3 lr=0.025 seed=106]

A kept run is a repository a pipeline ran in (``python -m bench.own_data --keep DIR`` keeps one per folder
and seed). A variant is ``committed`` (the run's own recipe: it reproduces the stage's net on the same CPU
kind), ``KEY=VALUE`` for a key of the ``baselines`` params section, or ``seed=N`` for another training seed.
Results: docs/RESULTS.md "The plain CNNs' plateau".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any


def variant_config(cfg: Any, seed: int, variant: str) -> tuple[Any, int]:
    """(``BaselineConfig``, training seed) of one variant of the run's recipe ``cfg`` and ``seed``."""
    key, _, value = variant.partition("=")
    if key == "committed" and not value:
        return cfg, seed
    if key == "seed":
        return cfg, int(value)
    if not value or key not in {f.name for f in dataclasses.fields(cfg)}:
        raise SystemExit(f"variant {variant!r}: use committed, seed=N or KEY=VALUE with a baselines key")
    kind = type(getattr(cfg, key))
    return dataclasses.replace(cfg, **{key: kind(value)}), seed


def train_variants(run: Path, net: str, variants: list[str]) -> dict[str, dict[str, Any]]:
    """Each variant's held-out accuracy, training accuracy every fifth of the epochs and seconds."""
    import torch
    import yaml

    from pipeline.io import load_held_out, load_split, read_json
    from pipeline.params.config import CalibrateConfig
    from pipeline.train.baselines import LARGE, BaselineConfig, plain_outputs, train_baseline
    from pipeline.train.inputs import normalisation_stats
    from pipeline.workflows.baselines import SEED_OFFSETS, sized_config

    params = yaml.safe_load((run / "params.yaml").read_text())
    data = run / "data" / "prepared"
    classes = len(read_json(data / "meta.json")["classes"])
    train = load_split(data, "train")
    held_out = load_held_out(data, CalibrateConfig.from_params(params).held_out)
    recipe, _ = sized_config(BaselineConfig.from_params(params), len(train), run / "data" / "graded", classes)
    norm = normalisation_stats(train.images)  # what the baselines stage computes
    width = recipe.large_width if net == LARGE else recipe.small_width
    out = {}
    for variant in variants:
        cfg, seed = variant_config(recipe, int(params["seed"]) + SEED_OFFSETS[net], variant)
        curve: list[tuple[int, float]] = []
        started = time.perf_counter()
        model = train_baseline(width, train.images, train.labels, *norm, classes, cfg, seed, progress=False,
                               on_epoch=lambda e, r, _m, _p, c=curve: c.append((e, round(r["train_acc"], 3))))
        logits, _ = plain_outputs(model, held_out.images, *norm, "maxprob")
        right = (logits.argmax(dim=-1) == torch.from_numpy(held_out.labels)).numpy()  # as the stage reads it
        out[variant] = {"held_out": float(right.mean()), "steps": cfg.epochs * max(1, len(train) // cfg.batch_size),
                        "train_acc_by_epoch": curve[::max(1, len(curve) // 5)] + curve[-1:],
                        "seconds": round(time.perf_counter() - started, 1)}
        print(f"{net} {variant}: held out {out[variant]['held_out']:.4f}, training accuracy by epoch "
              f"{out[variant]['train_acc_by_epoch']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, metavar="KEPT_RUN")
    p.add_argument("--net", choices=("plain_small", "plain_large"), default="plain_large")
    p.add_argument("--variants", nargs="+", default=["committed", "warmup_epochs=3", "lr=0.025", "seed=106"])
    p.add_argument("--out", type=Path, default=Path("bench/out/plateau.json"))
    args = p.parse_args(argv)
    if not (args.run / "params.yaml").is_file() or not (args.run / "data" / "prepared").is_dir():
        raise SystemExit(f"{args.run}: no params.yaml or data/prepared (is it a kept run of bench.own_data?)")
    from pipeline.train.baselines import BaselineConfig

    for variant in args.variants:
        variant_config(BaselineConfig(), 0, variant)  # refuse a bad variant before any training
    rows = train_variants(args.run, args.net, args.variants)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"run": str(args.run), "net": args.net, "variants": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
