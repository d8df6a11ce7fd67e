"""The field's small networks beside a run's cascade: each anchor of ``pipeline.models.anchors`` trained from
scratch on a run's train split with the run's plain-CNN recipe and the optimiser-step budget ``plain_large``
got (its epochs, batch size, SGD + cosine, weight decay, crop and flip), read on the run's test split.
Their MACs are counted twice: the project's counter and PyTorch's ``FlopCounterMode`` (FLOPs / 2).

    python -m bench.anchors --run .                     # the Fashion-MNIST default (run `dvc repro` first)
    python -m bench.anchors --run KEPT_RUN --anchors resnet18@8 shufflenet_v2@0.5
    python -m bench.anchors --plot bench/out/anchors.json --png docs/results/anchors/fashion_mnist.png

``--run`` is a finished pipeline run's repository (``data/prepared``, ``metrics/baselines.json``, and for
the plot ``metrics/evaluate.json``). Every anchor's row is saved as it finishes; an anchor already in
``--out`` is not trained again. Accuracy figures do not depend on what else runs; the seconds do.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from pipeline.io import load_split, read_json
from pipeline.models.anchors import WIDTHS, AnchorNet, anchor_name
from pipeline.models.cost import count_macs
from pipeline.train.baselines import BaselineConfig, plain_outputs, train_single_exit

SEED_OFFSET = 103  # after plain_small's 101 and plain_large's 102


def flop_counter_macs(module: torch.nn.Module, shape: tuple[int, ...]) -> int:
    """MACs per image by PyTorch's own counter (it counts FLOPs = 2 x MACs of convolutions and matmuls)."""
    module.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(torch.zeros(1, *shape))
    return int(counter.get_total_flops()) // 2


def parse_anchor(text: str) -> tuple[str, float]:
    arch, _, width = text.partition("@")
    if arch not in WIDTHS or not width:
        raise SystemExit(f"bench.anchors: {text!r} is not ARCH@WIDTH with ARCH one of {sorted(WIDTHS)}")
    return arch, float(width)


def recipe(run: Path) -> BaselineConfig:
    """The run's ``baselines`` recipe at the epochs ``plain_large`` trained for (its step budget)."""
    params = yaml.safe_load((run / "params.yaml").read_text())
    cfg = BaselineConfig.from_dict(params.get("baselines"))
    epochs = int(read_json(run / "metrics" / "baselines.json")["epochs"])
    return BaselineConfig(**{**cfg.__dict__, "epochs": epochs})


def train_and_read(run: Path, arch: str, width: float, seed: int) -> dict[str, Any]:
    """One anchor trained on ``run``'s train split and read on its test split (a bench row)."""
    row = train_net_and_read(run, lambda c, k: AnchorNet(arch, width, c, k), seed + SEED_OFFSET)
    return {"name": anchor_name(arch, width), "arch": arch, "width": width, "seed": seed, **row}


def train_net_and_read(run: Path, build: Callable[[int, int], torch.nn.Module], seed: int) -> dict[str, Any]:
    """``build(channels, classes)`` trained by the run's plain-CNN recipe at plain_large's step budget on the
    run's train split; its test accuracy (and SE), MACs by both counters, parameters, steps and seconds."""
    prepared = run / "data" / "prepared"
    classes = len(read_json(prepared / "meta.json")["classes"])
    train, test = load_split(prepared, "train"), load_split(prepared, "test")
    pixels = train.images.astype(np.float32) / 255.0  # the baselines stage's normalisation
    mean = tuple(pixels.mean(axis=(0, 2, 3)).round(4).tolist())
    std = tuple(pixels.std(axis=(0, 2, 3)).round(4).tolist())
    cfg = recipe(run)
    shape = tuple(int(v) for v in train.images.shape[1:])
    started = time.perf_counter()
    net = train_single_exit(lambda c: build(c, classes), train.images, train.labels, mean, std, cfg, seed)
    seconds = time.perf_counter() - started
    logits, _ = plain_outputs(net, test.images, mean, std)
    right = logits.argmax(dim=-1).numpy() == test.labels
    acc = float(right.mean())
    held = [load_split(prepared, name) for name in ("route", "calib")]  # what a run may choose on
    held_right = np.concatenate([plain_outputs(net, h.images, mean, std)[0].argmax(dim=-1).numpy() == h.labels
                                 for h in held])
    return {"accuracy": acc, "se": math.sqrt(acc * (1 - acc) / len(right)), "test_images": len(right),
            "held_out_accuracy": float(held_right.mean()), "held_out_images": len(held_right),
            "mean_macs": count_macs(net, shape), "flop_counter_macs": flop_counter_macs(net, shape),
            "params": sum(p.numel() for p in net.parameters()), "epochs": cfg.epochs,
            "steps": cfg.epochs * (len(train) // cfg.batch_size), "train_seconds": round(seconds, 1)}


def run_rows(evaluation: dict[str, Any]) -> dict[str, Any]:
    """The run's own models from its metrics/evaluate.json: cascade, its exits, its budget curve, plain CNNs."""
    return {"cascade": {k: evaluation["cascade"][k] for k in ("accuracy", "mean_macs")},
            "exits": [{k: r[k] for k in ("exit", "accuracy", "mean_macs")} for r in evaluation["each_exit_alone"]],
            "curve": [{k: r[k] for k in ("accuracy", "mean_macs")} for r in evaluation["budget_curves"]["cascade"]],
            **{name: {k: evaluation["baselines"][name][k] for k in ("accuracy", "mean_macs")}
               for name in ("plain_small", "plain_large")}}


def plot(result: dict[str, Any], png: Path) -> None:
    """Accuracy against MACs: every anchor a point (each net's widths joined), the plain CNNs points, the
    cascade's exits and operating points a curve, the shipped cascade a star."""
    from pipeline.report.plots import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    own = result["run"]
    curve = sorted(own["curve"], key=lambda r: r["mean_macs"])
    ax.plot([r["mean_macs"] / 1e6 for r in curve], [100 * r["accuracy"] for r in curve], "-", color="k",
            label="cascade operating points")
    ax.plot([r["mean_macs"] / 1e6 for r in own["exits"]], [100 * r["accuracy"] for r in own["exits"]], "s--",
            color="grey", label="cascade exits alone")
    ax.plot([own["cascade"]["mean_macs"] / 1e6], [100 * own["cascade"]["accuracy"]], "*", ms=14, color="red",
            label="cascade (shipped)")
    for name in ("plain_small", "plain_large"):
        ax.plot([own[name]["mean_macs"] / 1e6], [100 * own[name]["accuracy"]], "D", label=name)
    for arch in WIDTHS:
        rows = sorted((r for r in result["anchors"] if r["arch"] == arch), key=lambda r: r["mean_macs"])
        if rows:
            ax.errorbar([r["mean_macs"] / 1e6 for r in rows], [100 * r["accuracy"] for r in rows],
                        yerr=[100 * r["se"] for r in rows], fmt="o-", capsize=3, label=arch)
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter

    for axis in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
        axis(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.set_xlabel("mean MACs per image (millions, log)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(result.get("title", "accuracy against cost"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(plt, fig, png)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=None, help="a finished run's repository")
    p.add_argument("--anchors", nargs="*", default=[anchor_name(a, w) for a, ws in WIDTHS.items() for w in ws],
                   metavar="ARCH@WIDTH", help="default: every net at each of its widths")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--title", default=None, help="the plot's title (default: the run's data source)")
    p.add_argument("--out", type=Path, default=Path("bench/out/anchors.json"))
    p.add_argument("--plot", type=Path, default=None, help="plot an earlier --out file and stop")
    p.add_argument("--png", type=Path, default=None, help="where --plot writes (default: beside --plot)")
    args = p.parse_args(argv)
    if args.plot:
        plot(json.loads(args.plot.read_text()), args.png or args.plot.with_suffix(".png"))
        return 0
    if args.run is None:
        p.error("--run is required unless --plot is given")
    if args.threads:
        torch.set_num_threads(args.threads)
    wanted = [parse_anchor(a) for a in args.anchors]
    result = json.loads(args.out.read_text()) if args.out.exists() else {"anchors": []}
    result["run"] = run_rows(read_json(args.run / "metrics" / "evaluate.json"))
    result["title"] = args.title or read_json(args.run / "data" / "prepared" / "meta.json")["source"]
    done = {(r["name"], r["seed"]) for r in result["anchors"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for arch, width in wanted:
        if (anchor_name(arch, width), args.seed) in done:
            continue
        row = train_and_read(args.run, arch, width, args.seed)
        result["anchors"].append(row)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"anchors: {row['name']:<24} {100 * row['accuracy']:6.2f}% (SE {100 * row['se']:.2f}) at "
              f"{row['mean_macs'] / 1e6:6.2f} M MACs (FlopCounterMode {row['flop_counter_macs'] / 1e6:.2f} M), "
              f"{row['train_seconds']:.0f} s", flush=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
