"""Ablations of the quality work's design changes (docs/DESIGN.md "Design notes: where the build departs
from the brief"), side by side in one run, scored on the `calib` split.

    dvc repro grade            # data/prepared and data/graded of the current params
    python -m bench.archive.quality_ablations --part m1       # exit head x curriculum on module 1
    python -m bench.archive.quality_ablations --part m2       # supernet training recipes on module 2

Part m1 trains module 1 (the params' spec and epochs) four ways: the default (params' head and
curriculum), the global-pool head (`gap`), and the curricula `all` and `cumulative`. Part m2 takes
module 1 from `models/modules/m1/train` (or trains it), then trains module 2 four ways: as a plain module,
and as a supernet of the same width (the params' supernet ops and layers) with method B alone,
+ sandwich rule, + sandwich and in-place distillation; for each supernet it reports the calib exit
accuracy of the space's largest, smallest and default path, of P(N)'s most likely path, the median
of random paths, and the three named paths again after re-estimating their BatchNorm statistics.
Every figure of a part comes from one process on one machine, so the rows compare fairly.
Part pm trains the same supernet in position 2 with method B's update variants (raw-score softmax,
rank utilities, rank + paired perf, and the MI weight at 0 and x10) and reports P(N)'s entropy as a
fraction of the maximum, its most likely path against the median random path.
`--max-train` and `--epochs` shrink the run (the README says which settings its figures used).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bench.report import report_parts
from pipeline.data.grading import curriculum_repeats
from pipeline.io import load_split
from pipeline.models.cascade import feature_shapes
from pipeline.models.config import ModelConfig
from pipeline.models.cost import count_macs
from pipeline.models.modules import NO_ARCH, ModuleSpec, build_module
from pipeline.models.store import load_module
from pipeline.params.config import GradeConfig, deep_merge, load_params, section
from pipeline.search.picks import max_entropy
from pipeline.train.config import TrainConfig
from pipeline.train.loop import train_module
from pipeline.train.paths import evaluate_path, recalibrate_batchnorm
from pipeline.train.prefix import Prefix
from pipeline.train.steps import extreme_archs


def curriculum_subset(train, scores: pd.DataFrame, module: int, levels: int, mode: str, weight: int):
    """Module ``module``'s training images under a curriculum (repeats kept), in id order."""
    level_of = dict(zip(scores["id"].astype(str), scores["level"], strict=True))
    repeats = np.asarray((0, *curriculum_repeats(module, levels, mode, weight)))
    per_row = repeats[[level_of[str(i)] for i in train.ids]]
    return train.subset(np.repeat(np.arange(len(train)), per_row))


def train_config(params: dict, name: str, seed: int, **override) -> TrainConfig:
    merged = deep_merge(section(params, "train"), params["modules"][name].get("train") or {})
    # kd 0: these ablations (head, curriculum) were measured without distillation and have no teacher
    return TrainConfig.from_dict({**merged, "seed": seed, "kd": 0.0, **override})


def fit(spec: ModuleSpec, in_shape, n_classes: int, prefix: Prefix, subset, cfg: TrainConfig, seed: int):
    torch.manual_seed(seed)
    module = build_module(spec, in_shape[0], n_classes)
    macs_of = {}

    def cost(arch):
        if arch not in macs_of:
            macs_of[arch] = count_macs(module, in_shape, arch)
        return macs_of[arch]

    largest, _ = extreme_archs(module.space, cost) if module.space.decisions else (module.default_arch(), None)
    start = time.perf_counter()
    result = train_module(module, prefix, subset.images, subset.labels, cfg, cost_of=cost,
                          cost_max=cost(largest), exit_saving=0.5, progress=False)
    return module, result, time.perf_counter() - start, cost


def part_m1(params, train, calib, scores, shapes, n_classes, mean, std, epochs, seed) -> list[dict]:
    g = GradeConfig.from_params(params)
    spec = ModelConfig.from_params(params).specs[0]
    variants = {
        f"default (head {spec.head}, curriculum {g.curriculum})": (spec, g.curriculum),
        f"head gap (curriculum {g.curriculum})": (dataclasses.replace(spec, head="gap"), g.curriculum),
        f"head {spec.head}, curriculum all": (spec, "all"),
        f"head {spec.head}, curriculum cumulative": (spec, "cumulative"),
    }
    rows = []
    for name, (s, mode) in variants.items():
        subset = curriculum_subset(train, scores, 1, g.levels, mode, g.level_weight)
        cfg = train_config(params, "m1", seed, **({"epochs": epochs} if epochs else {}))
        module, _, seconds, cost = fit(s, shapes[0], n_classes, Prefix((), mean, std), subset, cfg, seed + 1)
        acc = evaluate_path(module, Prefix((), mean, std), calib.images, calib.labels, module.default_arch(), 512)
        rows.append({"variant": name, "calib_acc": acc["acc"], "macs": cost(module.default_arch()),
                     "train_images": len(subset), "seconds": round(seconds, 1)})
        print(rows[-1], flush=True)
    return rows


def position2_specs(specs) -> tuple[ModuleSpec, ModuleSpec]:
    """Module 2 as a plain module (the params' spec if fixed) and as a supernet of the same width
    (layers, ops and default op from the params' first supernet module)."""
    supernet = next(s for s in specs if s.kind == "supernet")
    m2 = specs[1]
    plain = m2 if m2.kind == "fixed" else dataclasses.replace(m2, kind="fixed", ops=(), default_op="")
    return plain, dataclasses.replace(supernet, channels=m2.channels, stride=m2.stride)


def recipe_variants(plain: ModuleSpec, supernet: ModuleSpec) -> dict[str, tuple[ModuleSpec, dict]]:
    """Part m2: plain module 2 against supernet training recipes (the update as in params)."""
    return {f"plain module ({plain.layers + 1} conv3)": (plain, {}),
            "supernet, method B alone": (supernet, {"sandwich": False, "distill": 0.0}),
            "supernet, method B + sandwich": (supernet, {"sandwich": True, "distill": 0.0}),
            "supernet, method B + sandwich + distillation": (supernet, {"sandwich": True, "distill": 1.0})}


def update_variants(plain: ModuleSpec, supernet: ModuleSpec) -> dict[str, tuple[ModuleSpec, dict]]:
    """Part pm: method B's probability-model update in supernet training (sandwich on)."""
    base = {"sandwich": True, "distill": 0.0}
    return {"softmax(perf / T) (original)": (supernet, {**base, "utility": "softmax", "paired_perf": False}),
            "rank utilities": (supernet, {**base, "utility": "rank", "paired_perf": False}),
            "rank + paired perf (default)": (supernet, {**base, "utility": "rank", "paired_perf": True}),
            "rank + paired perf, beta 0": (supernet, {**base, "utility": "rank", "paired_perf": True, "beta": 0.0}),
            "rank + paired perf, beta x10": (supernet, {**base, "utility": "rank", "paired_perf": True,
                                                       "beta": 0.1}),
            "rank + paired, smoothing 0.005": (supernet, {**base, "utility": "rank", "paired_perf": True,
                                                         "smoothing": 0.005}),
            "rank + paired, smoothing 0.005, beta 0": (supernet, {**base, "utility": "rank", "paired_perf": True,
                                                                 "smoothing": 0.005, "beta": 0.0}),
            "rank + paired, smoothing 0.005, plain pick": (supernet, {**base, "utility": "rank",
                                                                     "paired_perf": True, "smoothing": 0.005,
                                                                     "pick": "plain"})}


def part_m2(params, train, calib, scores, shapes, n_classes, mean, std, epochs, seed, paths,
            models: Path, make_variants=recipe_variants, only: tuple[str, ...] = ()) -> list[dict]:
    g = GradeConfig.from_params(params)
    specs = ModelConfig.from_params(params).specs
    if (models / "m1" / "train" / "module.pt").exists():  # the pipeline's own module 1
        m1, info = load_module(models / "m1" / "train")
        mean, std = info.mean, info.std
    else:
        m1, *_ = fit(specs[0], shapes[0], n_classes, Prefix((), mean, std),
                     curriculum_subset(train, scores, 1, g.levels, g.curriculum, g.level_weight),
                     train_config(params, "m1", seed), seed + 1)
    prefix = Prefix(((m1, m1.default_arch()),), mean, std)
    subset = curriculum_subset(train, scores, 2, g.levels, g.curriculum, g.level_weight)
    plain, supernet = position2_specs(specs)
    variants = {k: v for k, v in make_variants(plain, supernet).items() if not only or k in only}
    rng = np.random.default_rng(seed)
    randoms: list = []  # the same random paths score every supernet variant
    rows = []
    for name, (spec, override) in variants.items():
        cfg = train_config(params, "m2", seed, **override, **({"epochs": epochs} if epochs else {}))
        module, result, seconds, cost = fit(spec, shapes[1], n_classes, prefix, subset, cfg, seed + 2)

        def acc(arch, module=module):
            return evaluate_path(module, prefix, calib.images, calib.labels, arch, 512)["acc"]

        if not module.space.decisions:
            rows.append({"variant": name, "largest": acc(module.default_arch()), "macs_largest": cost(NO_ARCH),
                         "seconds": round(seconds, 1)})
            print(rows[-1], flush=True)
            continue
        largest, smallest = extreme_archs(module.space, cost)
        if not randoms:
            randoms = [module.space.from_index(tuple(int(rng.integers(len(d.choices))) for d in module.space.decisions))
                       for _ in range(paths)]

        def acc_bn(arch, module=module):  # after re-estimating the path's BatchNorm statistics
            recalibrate_batchnorm(module, prefix, subset.images[:2048], arch)
            return acc(arch)

        likely = result.prob_model.most_likely() if result.prob_model is not None else module.default_arch()
        random_accs = [acc(a) for a in randoms]
        row = {"variant": name, "largest": acc(largest), "macs_largest": cost(largest), "smallest": acc(smallest),
               "default": acc(module.default_arch()), "most_likely": acc(likely),
               "most_likely_path": likely.key(), "random_median": float(np.median(random_accs)),
               "random_min": float(np.min(random_accs)),
               "entropy": result.history[-1].get("entropy"),
               "entropy_ratio": (result.prob_model.entropy() / max_entropy(module.space)
                                 if result.prob_model is not None else None),
               "seconds": round(seconds, 1)}
        # BatchNorm re-estimation changes the module: measured last, one path after another.
        row.update(largest_bn=acc_bn(largest), default_bn=acc_bn(module.default_arch()),
                   smallest_bn=acc_bn(smallest))
        rows.append(row)
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("m1", "m2", "pm", "all"), default="all")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--data", type=Path, default=Path("data/prepared"))
    p.add_argument("--graded", type=Path, default=Path("data/graded"))
    p.add_argument("--epochs", type=int, default=0, help="epochs per module (0: the params' own)")
    p.add_argument("--max-train", type=int, default=0, help="first N training images only (0: all)")
    p.add_argument("--paths", type=int, default=8, help="random paths of the supernet to score (part m2)")
    p.add_argument("--models", type=Path, default=Path("models/modules"),
                   help="module 1 is loaded from here if trained")
    p.add_argument("--variants", nargs="*", default=[], help="part pm: only these variants (default: all)")
    p.add_argument("--out", type=Path, default=Path("docs/results/quality_ablations.json"))
    args = p.parse_args(argv)
    params = load_params(args.params)
    seed = int(params.get("seed", 0))
    train, calib = load_split(args.data, "train"), load_split(args.data, "calib")
    if args.max_train:
        train = train.subset(np.arange(min(args.max_train, len(train))))
    scores = pd.read_csv(args.graded / "scores.csv", dtype={"id": str})
    meta = json.loads((args.data / "meta.json").read_text())
    n_classes, (channels, size, _) = len(meta["classes"]), meta["image_shape"]
    shapes = feature_shapes(ModelConfig.from_params(params).cascade_spec(channels, n_classes, size))
    pixels = train.images.astype(np.float32) / 255.0
    mean = tuple(pixels.mean(axis=(0, 2, 3)).round(4).tolist())
    std = tuple(pixels.std(axis=(0, 2, 3)).round(4).tolist())
    out = {"settings": {"epochs": args.epochs or "params", "max_train": args.max_train or len(train),
                        "threads": torch.get_num_threads()}}
    if args.part in ("m1", "all"):
        out["m1"] = part_m1(params, train, calib, scores, shapes, n_classes, mean, std, args.epochs, seed)
    if args.part in ("m2", "all"):
        out["m2"] = part_m2(params, train, calib, scores, shapes, n_classes, mean, std, args.epochs, seed, args.paths,
                            args.models)
    if args.part == "pm":
        out["pm"] = part_m2(params, train, calib, scores, shapes, n_classes, mean, std, args.epochs, seed, args.paths,
                            args.models, update_variants, tuple(args.variants))
    report_parts(out, ("m1", "m2", "pm"), args.out, args.part)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
