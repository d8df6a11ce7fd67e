"""A positive control for routing (docs/RESULTS.md "Positive control"): an image folder on which the right
subnetwork *is* predictable before it runs, put through the user's command, so "routing does not pay here" can be told
apart from "routing is broken".

    python -m bench.routing_control                      # seeds 0 1 2, about 9 min each alone here
    python -m bench.routing_control --seeds 0 --keep /tmp/rc-runs
    python -m bench.routing_control --report docs/results/routing_control.json

The folder (``make_control_folder``, deterministic for a seed): 32 x 32 RGB PNGs, 4 classes, two
families of images, half each, with the family visible in the colour of the whole picture:

- warm (red-orange backdrop): class c is a pale disc in the c-th of four horizontal bands, top to bottom.
  One convolution and the exit head (pooled to a 4 x 4 grid) answer it; a deeper path adds nothing.
- cold (blue backdrop): three pairs of small dots, each pair along the class's direction (horizontal,
  vertical, rising, falling) with a 2-pixel gap, anywhere in the picture. No 3 x 3 window sees both dots
  of a pair, so one convolution under the exit head is near chance (25%); two more 3 x 3 layers see the
  pairs (plain networks, 600 cold images, 8 epochs at a constant lr: 28% against 71% on held-out images).

So the cheapest path is right on warm images and the costly paths are needed on cold ones, and a
predictor that averages the input's colour (``select.pool: 1``) can tell which is which. The control's
params (``CONTROL``: module 1 a supernet of two ``conv3`` / ``skip`` layers at full resolution, whose
cheapest path costs a tenth of its largest; the ``p_right`` predictor; no horizontal flips; see its comments)
are laid over the quick profile as ``dvc exp run -S`` overrides, and every seed runs ``python -m
pipeline.profiles --profile quick --data imagefolder:<folder> -- -S ...`` in a fresh copy of this
working tree (``bench.own_data``).

Per seed it reads ``metrics/evaluate.json`` (the routed cascade, its static twin and the routing
table) and, in the same run's models, a **random router**: module 1's predictor replaced by a draw
per image with the predictor's own shares on test (the same mean MACs), thresholds refitted on the
held-out images by the calibrate rule, read on test. Target (docs/RESULTS.md "Positive control"): the routed
cascade >= its static twin + 1.0 point at equal MACs, or equal accuracy (within 0.3 points) at <= 0.7x its
MACs, on every seed; the random router must not reach it. Writes ``docs/results/routing_control.json``.
"""

from __future__ import annotations

import argparse
import colorsys
import json
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn

from bench.own_data import run_one
from pipeline.io import load_held_out, load_split
from pipeline.params.config import CalibrateConfig, load_params
from pipeline.profiles import settings
from pipeline.routing.engine import Stage, run_cascade
from pipeline.routing.fit import exit_outputs, fit_best_ensemble
from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import preprocess

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("horizontal", "vertical", "rising", "falling")  # named after the cold pairs
FAMILIES = ("warm", "cold")
# images per class and family: 6,400 in all. At 400 (3,200) select decided whether the predictor serves on
# 52 held-out route images (one image 1.9 points); the training steps are floored, so twice the images cost
# little more time.
PER_CLASS = 800
SIZE = 32
EQUAL = 0.003  # "equal accuracy": within 0.3 points (select.delta, calibrate.delta)

# Laid over profiles/quick.yaml (keys params.yaml lacks get DVC's "+", pipeline.profiles.settings).
CONTROL: dict[str, Any] = {
    "modules": {"m1": {"spec": {"kind": "supernet", "channels": 16, "stride": 1, "layers": 2,
                                "ops": ["conv3", "skip"], "default_op": "conv3"},
                       # no distillation: the teacher (baselines) gets 3 epochs here. 1,200 steps: at the quick
                       # profile's 600 the largest path read 53-64% on cold pictures, at 1,200 86-96% (a shared
                       # exit head slows the deep path; docs/RESULTS.md "Positive control")
                       "train": {"kd": 0.0, "min_steps": 1200}}},
    "search": {"spread": 4},
    # Every image once for every module: the weighted curriculum gave module 1 the warm pictures twice (the
    # grader's linear model finds the cold ones hard), so its training ids were 37% cold and the deep path,
    # the only one that can learn them, read about 60% on them after 1,200 steps (86-96% at 50% cold).
    "grade": {"curriculum": "all"},
    "train": {"flip": False},  # a mirror turns a rising pair into a falling one
    "baselines": {"epochs": 3},  # the plain CNNs are not what the control measures (and teach nothing: kd 0)
    "select": {"scoring": "p_right", "pool": 1, "epochs": 50},
}


def _rgb(hue: float, sat: float, val: float) -> tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb(hue % 1.0, sat, val)
    return int(255 * r), int(255 * g), int(255 * b)


PAIRS = {"horizontal": (1, 0), "vertical": (0, 1), "rising": (1, -1), "falling": (1, 1)}  # the cold classes
GAP = 2  # pixels between the two dots of a pair (at 32 px): no 3 x 3 window sees both dots
DOT, NPAIRS = 2, 3  # a dot's side (pixels at 32 px) and the pairs per cold picture


def _dot(draw: ImageDraw.ImageDraw, x: float, y: float, d: float, fill: tuple) -> None:
    draw.rectangle((x, y, x + d - 1, y + d - 1), fill=fill)


def control_image(family: str, label: int, rng: np.random.Generator, size: int = SIZE) -> np.ndarray:
    """One (size, size, 3) uint8 picture of class ``label`` (0-3) in ``family`` (``warm`` or ``cold``)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    if not 0 <= label < len(CLASSES):
        raise ValueError(f"label must be in 0..{len(CLASSES) - 1}, got {label!r}")
    s = size / 32
    hue = rng.uniform(0.0, 0.1) if family == "warm" else rng.uniform(0.55, 0.65)
    img = Image.new("RGB", (size, size), _rgb(hue, rng.uniform(0.6, 0.9), rng.uniform(0.55, 0.8)))
    draw = ImageDraw.Draw(img)
    if family == "warm":  # a disc in the label-th of four horizontal bands, top to bottom
        band = size / len(CLASSES)
        cx, cy = rng.uniform(0.2, 0.8) * size, (label + 0.5) * band + rng.uniform(-1, 1) * s
        r = rng.uniform(2.5, 3.5) * s
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=_rgb(rng.uniform(0.1, 0.2), 0.2, 1.0))
    else:  # three pairs of dots, each pair along the label's direction, anywhere
        d, step = round(DOT * s), round(DOT * s) + round(GAP * s)
        dx, dy = (v * step for v in PAIRS[CLASSES[label]])
        for _ in range(NPAIRS):
            x = rng.integers(1 + max(0, -dx), size - d - 1 - max(0, dx))
            y = rng.integers(1 + max(0, -dy), size - d - 1 - max(0, dy))
            fill = _rgb(rng.random(), rng.uniform(0, 0.4), 1.0)
            _dot(draw, x, y, d, fill)
            _dot(draw, x + dx, y + dy, d, fill)
    pixels = np.asarray(img, dtype=np.float64) + rng.normal(0, 6, (size, size, 3))
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def control_arrays(per_class: int, seed: int = 0, size: int = SIZE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The control as arrays: images (N, size, size, 3) uint8, labels (N,), family (N,: 0 warm, 1 cold),
    ``per_class`` images of each class in each family, interleaved so any prefix holds both families."""
    if per_class < 1:
        raise ValueError(f"per_class must be >= 1, got {per_class}")
    rng = np.random.default_rng(seed)
    rows = [(f, c) for _ in range(per_class) for f in range(len(FAMILIES)) for c in range(len(CLASSES))]
    images = np.stack([control_image(FAMILIES[f], c, rng, size) for f, c in rows])
    return images, np.array([c for _, c in rows]), np.array([f for f, _ in rows])


def make_control_folder(folder: Path, seed: int = 0, per_class: int = PER_CLASS, size: int = SIZE) -> Path:
    """The control as an image folder (``imagefolder:<folder>``: one sub-folder per class, PNGs inside; the
    family is in each file's name). Kept if already complete for these settings."""
    stamp = folder / ".complete"
    key = f"seed={seed} per_class={per_class} size={size}\n"
    if stamp.is_file() and stamp.read_text() == key:
        return folder
    images, labels, family = control_arrays(per_class, seed, size)
    for i, (pixels, label, fam) in enumerate(zip(images, labels, family, strict=True)):
        out = folder / CLASSES[label]
        out.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(out / f"{FAMILIES[fam]}-{i:05d}.png")
    stamp.write_text(key)
    return folder


class RandomRouter(nn.Module):
    """A stand-in for a stage's predictor: each image's candidate drawn at random with fixed ``shares``
    (R,), from its own generator; it reads nothing of the image."""

    def __init__(self, shares: Sequence[float], seed: int = 0) -> None:
        super().__init__()
        probs = torch.tensor([float(s) for s in shares], dtype=torch.float64)
        if probs.dim() != 1 or len(probs) < 2 or bool((probs < 0).any()) or float(probs.sum()) <= 0:
            raise ValueError(f"RandomRouter needs >= 2 shares >= 0 with a positive sum, got {list(shares)}")
        self.probs = probs / probs.sum()
        self.num_candidates = len(probs)
        self.generator = torch.Generator().manual_seed(seed)

    def choose(self, features: torch.Tensor) -> torch.Tensor:
        picks = torch.multinomial(self.probs, features.shape[0], replacement=True, generator=self.generator)
        return picks.to(features.device)  # (B,) long


def calibrated(stages: list[Stage], held: tuple[torch.Tensor, np.ndarray], test: tuple[torch.Tensor, np.ndarray],
               cfg: dict[str, Any], kind: str) -> dict[str, float]:
    """``stages`` with exit thresholds fitted on the held-out images by the calibrate rule (``cfg``: the
    params' ``calibrate`` section), read on test: accuracy and mean MACs."""
    logits, cum = exit_outputs(stages, held[0], kind)
    fitted = fit_best_ensemble(logits, cum, torch.from_numpy(held[1]), cfg, kind)
    stages = [replace(s, threshold=float(t)) for s, t in zip(stages, [*fitted["thresholds"], float("inf")],
                                                                strict=True)]
    out = run_cascade(stages, test[0], confidence_kind=kind, batch_size=256, ensemble_decay=fitted["ensemble_decay"])
    return {"accuracy": float((out.pred.cpu().numpy() == test[1]).mean()), "mean_macs": float(out.macs.float().mean()),
            "held_out_accuracy": fitted["accuracy"]}


def random_router(repo: Path, seed: int) -> dict[str, Any]:
    """The run's routed cascade (``models/cascade``) with each served predictor replaced by a
    :class:`RandomRouter` at the predictor's own shares on test (so the same mean MACs where it routes),
    thresholds refitted on the held-out images, read on test. Empty where no predictor serves."""
    params = load_params(repo / "params.yaml")
    cfg = CalibrateConfig.from_params(params)
    cascade = load_cascade(repo / "models" / "cascade", torch.device("cpu"))
    data = repo / "data" / "prepared"
    test, held = load_split(data, "test"), load_held_out(data, cfg.held_out)
    meta, kind = cascade.meta, cascade.meta.confidence_kind
    x, xh = preprocess(test.images, meta), preprocess(held.images, meta)
    with torch.inference_mode():
        choices = run_cascade(cascade.stages, x, confidence_kind=kind, batch_size=256).choices  # (N, K)
        stages, shares = list(cascade.stages), {}
        for k, stage in enumerate(stages):
            if stage.predictor is None:
                continue
            reached = choices[:, k][choices[:, k] >= 0]
            counts = torch.bincount(reached, minlength=len(stage.candidates)).double()
            if counts.sum() == 0:  # no test image reaches this module: even shares (its held-out images may)
                counts += 1
            shares[f"m{k + 1}"] = (counts / counts.sum()).tolist()
            stages[k] = replace(stage, predictor=RandomRouter(shares[f"m{k + 1}"], seed=seed + k))
        if not shares:
            return {}
        return {"shares": shares, **calibrated(stages, (xh, held.labels), (x, test.labels), cfg, kind)}


def judge(routed: dict[str, float], twin: dict[str, float]) -> dict[str, Any]:
    """The control's target for one seed: routed >= twin + 1.0 point at no more MACs, or routed within
    ``EQUAL`` of the twin's accuracy at <= 0.7x its MACs."""
    gain = 100 * (routed["accuracy"] - twin["accuracy"])
    share = routed["mean_macs"] / twin["mean_macs"]
    return {"gain_points": round(gain, 2), "macs_share": round(share, 3),
            "met": bool((gain >= 1.0 and share <= 1.0) or (gain >= -100 * EQUAL and share <= 0.7))}


def figures(repo: Path, seed: int) -> dict[str, Any]:
    """One run's figures: the routed cascade and its static twin from ``metrics/evaluate.json``, what
    select decided for module 1, and the random router in the same models."""
    evaluation = json.loads((repo / "metrics" / "evaluate.json").read_text())
    select = json.loads((repo / "metrics" / "select_m1.json").read_text())
    pick = ("accuracy", "mean_macs", "exit_share")
    routed = {k: evaluation["cascade"][k] for k in pick}
    twin = {k: evaluation["static_selection"][k] for k in pick}
    rand = random_router(repo, seed)
    return {"routed": routed, "static_twin": twin, "random_router": rand, "select_m1": select,
            "routing": evaluation.get("routing"), "target": judge(routed, twin),
            "random_target": judge(rand, twin) if rand else None}


def run_seed(folder: Path, seed: int, keep: Path, logs: Path) -> dict[str, Any]:
    """The user's command on the control folder in a fresh copy of this working tree (kept under ``keep``)."""
    overrides = tuple(settings(CONTROL, load_params(ROOT / "params.yaml")))
    run = run_one(folder, seed, "quick", logs, keep, overrides)
    if "failed" in run:
        return {"seed": seed, "failed": run["failed"]}
    return {"seed": seed, "pipeline_s": run["pipeline_s"], "overrides": list(overrides),
            **figures(keep / f"{folder.name}-seed{seed}", seed)}


def table(runs: list[dict[str, Any]]) -> str:
    def cell(row: dict[str, float]) -> str:
        return f"{100 * row['accuracy']:.2f}% at {row['mean_macs'] / 1e6:.2f} M" if row else "-"

    lines = ["| seed | routed cascade | static twin | random router (same shares) | routed vs twin | random vs twin "
             "| predictor serves | target |", "|" + " --- |" * 8]
    for r in runs:
        if "failed" in r:
            lines.append(f"| {r['seed']} | failed: {r['failed']} |" + " |" * 6)
            continue
        t, rt = r["target"], r["random_target"] or {}
        lines.append(f"| {r['seed']} | {cell(r['routed'])} | {cell(r['static_twin'])} | {cell(r['random_router'])} "
                     f"| {t['gain_points']:+.2f} pts at {t['macs_share']:.2f}x "
                     f"| {rt.get('gain_points', 0):+.2f} pts at {rt.get('macs_share', 0):.2f}x "
                     f"| {'yes' if r['select_m1'].get('predictor_used') else 'no'} "
                     f"| {'met' if t['met'] else 'missed'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--folder", type=Path, default=ROOT / "bench" / "out" / "routing-control",
                   help="where the control's image folder is built (kept between runs)")
    p.add_argument("--keep", type=Path, default=None,
                   help="keep each run's working copy under this folder (default: a temporary one, removed)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "routing_control.json")
    p.add_argument("--report", type=Path, default=None, help="print the table of an earlier run and stop")
    args = p.parse_args(argv)
    if args.report:
        print(table(json.loads(args.report.read_text())["runs"]))
        return 0
    folder = make_control_folder(args.folder)
    logs = ROOT / "bench" / "out" / "routing_control_logs"
    logs.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="routing-control-") as scratch:
        keep = args.keep or Path(scratch)
        for seed in args.seeds:
            print(f"routing_control: seed {seed} ...", flush=True)
            runs.append(run_seed(folder, seed, keep, logs))
            ok = [r for r in runs if "failed" not in r]
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({
                "command": "python -m bench.routing_control", "profile": "quick", "control": CONTROL,
                "folder": {"per_class": PER_CLASS, "size": SIZE, "families": FAMILIES, "classes": CLASSES},
                "runs": runs, "target_met_on_every_seed": bool(ok) and len(ok) == len(runs)
                and all(r["target"]["met"] for r in ok),
                "random_router_meets_it": any((r["random_target"] or {}).get("met") for r in ok)}, indent=2) + "\n")
            print(table(runs[-1:]).splitlines()[-1], flush=True)
    print(table(runs))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
