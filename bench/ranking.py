"""Supernet ranking benchmark: does a sampler's shared-weight accuracy rank subnets as training them does?

One module under test, a supernet like the pipeline's module 2 (``modules.<name>.spec`` of the params
file, default m2), sits behind a small fixed stem (module 1's spec), trained briefly once and then
frozen, so every variant sees the same inputs (``--stem-epochs 0``: no stem, the supernet reads the
images). For each sampler variant the supernet trains from the same initial weights, on the same
images in the same order with the same augmentation, for the same number of steps
(``pipeline.train.loop.train_module``, the pipeline's own training):

  uniform              single-path one-shot (uniform sampling)
  probmodel            method B: entropy pick of the m subnets, MLE update, beta / (MI + eps) term
  probmodel_beta0      method B without the MI term (beta = 0)
  probmodel_noentropy  method B with plain sampling instead of the entropy pick

R subnets, distinct and spread over the MACs range (``pipeline.search.ranking.choose_subnets``),
are each trained stand-alone from scratch (the exported path of a freshly initialised supernet,
same seed) with one equal budget, by the same training loop and loss. Every subnet is evaluated on
the held-out ``route`` split stand-alone and, per variant, with the weights it inherits from the
supernet (as ``search@k`` does: shared BatchNorm statistics) and, with ``--bn-recal-images N``,
after re-estimating its BatchNorm statistics on N training images. Kendall tau-b and Spearman rho
are computed against the stand-alone ranking; for the method-B variants also the ranking by
log P(N)(arch), the final probability model's own score for each subnet.

Run from the repository root: ``python -m bench.ranking`` (default: sized for about 15 minutes on
2 shared CPU cores) or ``python -m bench.ranking --quick`` (a 1-2 minute check of the plumbing whose
figures mean nothing).
"""

from __future__ import annotations

import os

# Before torch loads: with OpenMP's default spin-waiting, 2 threads on 2 cores that another process
# also uses run several times slower than 1 thread; passive waiting removes that penalty.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from pipeline.io import Split, load_split, write_json  # noqa: E402
from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes  # noqa: E402
from pipeline.models.cost import count_macs, fixed_macs, op_mac_table, path_macs  # noqa: E402
from pipeline.models.modules import NO_ARCH, ModuleSpec, SupernetModule, build_module  # noqa: E402
from pipeline.params.config import deep_merge, load_params, section  # noqa: E402
from pipeline.search.probmodel import ProbModel  # noqa: E402
from pipeline.search.ranking import choose_subnets, kendall_tau, spearman_rho  # noqa: E402
from pipeline.search.space import Arch  # noqa: E402
from pipeline.train.config import TrainConfig  # noqa: E402
from pipeline.train.loop import train_module
from pipeline.train.paths import evaluate_path
from pipeline.train.prefix import Prefix

VARIANTS: dict[str, dict[str, Any]] = {
    "uniform": {"sampler": "uniform"},
# The README's table was measured with the first (greedy pool) entropy pick: ``pick: greedy`` here.
    "probmodel": {"sampler": "probmodel", "pick": "greedy"},  # beta: --beta (params' value)
    "probmodel_beta0": {"sampler": "probmodel", "pick": "greedy", "beta": 0.0},
    "probmodel_noentropy": {"sampler": "probmodel", "pick": "plain"},
    "probmodel_hypercube": {"sampler": "probmodel", "pick": "entropy"},
}

# Default run (about 15 minutes on 2 shared cores) and --quick (plumbing check); explicit flags win.
DEFAULTS = {"train_images": 3000, "eval_images": 1500, "epochs": 3, "standalone_epochs": 2,
            "stem_epochs": 2, "subnets": 8, "bn_recal_images": 256}
QUICK = {"train_images": 512, "eval_images": 300, "epochs": 1, "standalone_epochs": 1,
         "stem_epochs": 1, "subnets": 8, "bn_recal_images": 128}


class Standalone(nn.Module):
    """A fixed path (an exported ``Subnet``) behind the module interface ``forward(x, arch)``."""

    def __init__(self, subnet: nn.Module) -> None:
        super().__init__()
        self.subnet = subnet

    def forward(self, x: torch.Tensor, arch: Arch = NO_ARCH) -> tuple[torch.Tensor, torch.Tensor]:
        del arch  # one path only
        return self.subnet(x)  # (B, C, H, W), (B, num_classes)


def log(message: str, started: float) -> None:
    print(f"[{time.perf_counter() - started:7.1f}s] {message}", flush=True)


def stratified_subset(split: Split, n: int | None, seed: int) -> Split:
    """n images with the split's class shares (all of them when n is None or too large), seeded."""
    if n is None or n >= len(split):
        return split
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(split.labels, return_counts=True)
    quota = np.floor(counts / counts.sum() * n).astype(int)
    quota[np.argsort(-(counts / counts.sum() * n - quota))[: n - quota.sum()]] += 1
    index = np.concatenate([rng.choice(np.flatnonzero(split.labels == c), size=q, replace=False)
                            for c, q in zip(classes, quota, strict=True)])
    return split.subset(np.sort(index))


def exit_savings(params: dict[str, Any], in_channels: int, num_classes: int, image_size: int,
                 seed: int) -> list[float]:
    """s_k of every module of the params' cascade, from default-path MACs (as CostModel.exit_saving)."""
    specs = [ModuleSpec.from_dict(m["spec"]) for m in params["modules"].values()]
    spec = CascadeSpec(in_channels, num_classes, image_size, tuple(specs))
    modules = build_modules(spec, seed)
    shapes = feature_shapes(spec)
    costs = [count_macs(m, shape, m.default_arch()) for m, shape in zip(modules, shapes, strict=False)]
    return [sum(costs[k:]) / sum(costs) for k in range(1, len(costs) + 1)]


def base_config(params: dict[str, Any], name: str, args: argparse.Namespace) -> TrainConfig:
    merged = deep_merge(section(params, "train"), params["modules"][name].get("train") or {})
    merged.update(seed=args.seed, epochs=args.epochs, kd=0.0)  # no teacher in this bench
    if args.batch_size is not None:
        merged["batch_size"] = args.batch_size
    if args.lr is not None:
        merged["lr"] = args.lr
    if args.beta is not None:
        merged["beta"] = args.beta
    return TrainConfig.from_dict(merged)


def log_prob(model: ProbModel, arch: Arch) -> float:
    index = model.space.index(arch)
    return float(sum(math.log(max(float(p[i]), 1e-300)) for p, i in zip(model.table, index, strict=True)))


def recalibrated(supernet: SupernetModule, arch: Arch, prefix: Prefix, images: np.ndarray,
                 batch_size: int) -> Standalone:
    """A copy of one inherited path whose BatchNorm statistics are re-estimated on ``images``."""
    path = Standalone(supernet.export(arch))
    for m in path.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the batches
    path.train()
    with torch.no_grad():
        for x, _ in prefix.batches(images, np.zeros(len(images), dtype=np.int64), batch_size,
                                   torch.device("cpu")):
            path(prefix(x))
    return path.eval()


def rank_stats(inherited: list[float], standalone: list[float]) -> dict[str, float]:
    return {"tau": kendall_tau(inherited, standalone), "rho": spearman_rho(inherited, standalone)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    if args.module not in params["modules"]:
        raise SystemExit(f"--module {args.module}: params modules are {list(params['modules'])}")
    spec = ModuleSpec.from_dict(params["modules"][args.module]["spec"])
    if spec.kind != "supernet":
        raise SystemExit(f"--module {args.module} is {spec.kind!r}, not a supernet")
    train = stratified_subset(load_split(args.data, "train"), args.train_images, args.seed)
    held_out = stratified_subset(load_split(args.data, "route"), args.eval_images, args.seed + 1)
    channels, size = train.images.shape[1], train.images.shape[2]
    num_classes = int(max(train.labels.max(), held_out.labels.max())) + 1
    pixels = train.images.astype(np.float32) / 255.0
    mean = tuple(pixels.mean(axis=(0, 2, 3)).round(4).tolist())
    std = tuple(pixels.std(axis=(0, 2, 3)).round(4).tolist())
    savings = exit_savings(params, channels, num_classes, size, args.seed)
    position = list(params["modules"]).index(args.module)  # the module under test's place in the cascade
    cfg = base_config(params, args.module, args)
    log(f"{len(train)} train images, {len(held_out)} held-out (route) images; threads {args.threads}; "
        f"batch {cfg.batch_size}, lr {cfg.lr}, m {cfg.m}, beta {cfg.beta}", started)

    # The stem: module 1's spec, trained once, then frozen for everything that follows.
    prefix = Prefix(mean=mean, std=std)

    def held_out_acc(module: nn.Module, arch: Arch = NO_ARCH) -> float:
        """Accuracy on the held-out split, seen through the current prefix (no augmentation)."""
        scores = evaluate_path(module, prefix, held_out.images, held_out.labels, arch, args.eval_batch_size)
        return scores["acc"]

    stem_seconds = 0.0
    stem_acc = None
    in_shape: tuple[int, int, int] = (channels, size, size)
    if args.stem_epochs > 0:
        first = next(iter(params["modules"]))
        stem_spec = ModuleSpec.from_dict(params["modules"][first]["spec"])
        if stem_spec.kind != "fixed":
            raise SystemExit(f"the stem ({first}) must be a fixed module, got {stem_spec.kind!r}")
        torch.manual_seed(args.seed)
        stem = build_module(stem_spec, channels, num_classes)
        stem_macs = count_macs(stem, in_shape)
        t0 = time.perf_counter()
        train_module(stem, prefix, train.images, train.labels,
                     dataclasses.replace(cfg, epochs=args.stem_epochs), cost_of=lambda a: stem_macs,
                     cost_max=stem_macs, exit_saving=savings[0], progress=False)
        stem_seconds = time.perf_counter() - t0
        stem_acc = held_out_acc(stem)
        prefix = Prefix(stages=((stem, NO_ARCH),), mean=mean, std=std)
        in_shape = stem_spec.output_shape(in_shape)
        log(f"stem {first} trained ({args.stem_epochs} epoch(s), {stem_seconds:.0f}s), "
            f"exit acc {stem_acc:.4f}; frozen", started)

    def fresh_supernet() -> SupernetModule:
        torch.manual_seed(args.seed + 1)  # same initial weights for every variant and every stand-alone
        return build_module(spec, in_shape[0], num_classes)

    probe = fresh_supernet()
    table, fixed = op_mac_table(probe, in_shape), fixed_macs(probe, in_shape)
    macs_of = {}

    def macs(arch: Arch) -> int:
        if arch not in macs_of:
            macs_of[arch] = path_macs(table, fixed, arch)
        return macs_of[arch]

    cost_max = float(fixed + sum(max(ops.values()) for ops in table.values()))
    exit_saving = savings[position]
    subnets = choose_subnets(probe.space, args.subnets, np.random.default_rng(args.seed), macs)
    log(f"module {args.module}: {spec.channels} channels, {spec.layers} layers x {len(spec.ops)} ops "
        f"({probe.space.size()} paths); {len(subnets)} subnets, {macs(subnets[0]):,} to "
        f"{macs(subnets[-1]):,} MACs", started)

    # Stand-alone reference: each subnet from scratch, the same budget for each.
    standalone_cfg = dataclasses.replace(cfg, epochs=args.standalone_epochs)
    reference: list[dict[str, Any]] = []
    for r, arch in enumerate(subnets, start=1):
        path = Standalone(fresh_supernet().export(arch))
        t0 = time.perf_counter()
        path_cost = macs(arch)
        train_module(path, prefix, train.images, train.labels, standalone_cfg,
                     cost_of=lambda a, c=path_cost: c, cost_max=cost_max, exit_saving=exit_saving,
                     progress=False)
        seconds = time.perf_counter() - t0
        acc = held_out_acc(path)
        reference.append({"arch": arch.key(), "macs": macs(arch), "standalone_acc": acc,
                          "train_seconds": round(seconds, 1)})
        log(f"stand-alone {r}/{len(subnets)} {arch.key()}: acc {acc:.4f} ({seconds:.0f}s)", started)
    standalone = [row["standalone_acc"] for row in reference]

    results: list[dict[str, Any]] = []
    for name in args.variants:
        vcfg = dataclasses.replace(cfg, **VARIANTS[name])
        supernet = fresh_supernet()
        t0 = time.perf_counter()
        result = train_module(supernet, prefix, train.images, train.labels, vcfg, cost_of=macs,
                              cost_max=cost_max, exit_saving=exit_saving, progress=False)
        seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        inherited = [held_out_acc(supernet, a) for a in subnets]
        row: dict[str, Any] = {"variant": name, "sampler": vcfg.sampler,
                               "pick": vcfg.pick,
                               "beta": vcfg.beta if vcfg.sampler == "probmodel" else None,
                               "train_seconds": round(seconds, 1),
                               "steps": vcfg.epochs * max(1, len(train) // vcfg.batch_size),
                               "final_train_acc": result.history[-1]["train_acc"],
                               "inherited_acc": inherited, "mean_inherited_acc": float(np.mean(inherited)),
                               **rank_stats(inherited, standalone)}
        if args.bn_recal_images > 0:
            recal_images = train.images[: args.bn_recal_images]
            recal = [held_out_acc(recalibrated(supernet, a, prefix, recal_images, cfg.batch_size))
                     for a in subnets]
            stats = rank_stats(recal, standalone)
            row.update(inherited_acc_bn=recal, mean_inherited_acc_bn=float(np.mean(recal)),
                       tau_bn=stats["tau"], rho_bn=stats["rho"])
        if result.prob_model is not None:
            scores = [log_prob(result.prob_model, a) for a in subnets]
            stats = rank_stats(scores, standalone)
            row.update(final_entropy=result.prob_model.entropy(),
                       most_likely=result.prob_model.most_likely().key(), log_prob=scores,
                       tau_logp=stats["tau"], rho_logp=stats["rho"])
        row["eval_seconds"] = round(time.perf_counter() - t1, 1)
        results.append(row)
        extra = f", tau_bn {row['tau_bn']:+.3f}" if "tau_bn" in row else ""
        log(f"{name}: trained {seconds:.0f}s; tau {row['tau']:+.3f} rho {row['rho']:+.3f}{extra}; "
            f"mean inherited acc {row['mean_inherited_acc']:.4f}", started)

    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    return {
        "settings": settings,
        "train_config": dataclasses.asdict(cfg),
        "module": {"name": args.module, "spec": dataclasses.asdict(spec), "input_shape": list(in_shape),
                   "paths": probe.space.size(), "cost_max_macs": cost_max, "exit_saving": exit_saving},
        "stem": None if args.stem_epochs <= 0 else {"epochs": args.stem_epochs,
                                                    "seconds": round(stem_seconds, 1), "exit_acc": stem_acc},
        "subnets": reference,
        "variants": results,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def tables(report: dict[str, Any]) -> str:
    rows = report["variants"]
    bn = any("tau_bn" in r for r in rows)
    head = f"{'variant':<22}{'tau':>8}{'rho':>8}"
    head += f"{'tau_bn':>8}{'rho_bn':>8}" if bn else ""
    head += f"{'tau_logP':>10}{'mean inh acc':>14}" + (f"{'(bn)':>8}" if bn else "") + f"{'train s':>9}"
    lines = [head]
    for r in rows:
        line = f"{r['variant']:<22}{_fmt(r['tau'], '+8.3f')}{_fmt(r['rho'], '+8.3f')}"
        if bn:
            line += f"{_fmt(r.get('tau_bn'), '+8.3f')}{_fmt(r.get('rho_bn'), '+8.3f')}"
        line += f"{_fmt(r.get('tau_logp'), '+10.3f'):>10}{r['mean_inherited_acc']:>14.4f}"
        if bn:
            line += f"{_fmt(r.get('mean_inherited_acc_bn'), '8.4f'):>8}"
        line += f"{r['train_seconds']:>9.0f}"
        lines.append(line)
    lines.append("")
    names = [r["variant"] for r in rows]
    lines.append(f"{'subnet':<48}{'MACs':>12}{'alone':>8}" + "".join(f"{n[:14]:>15}" for n in names))
    for i, s in enumerate(report["subnets"]):
        accs = "".join(f"{r['inherited_acc'][i]:>15.4f}" for r in rows)
        lines.append(f"{s['arch']:<48}{s['macs']:>12,}{s['standalone_acc']:>8.4f}{accs}")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, a 1-2 minute plumbing check")
    p.add_argument("--data", type=Path, default=Path("data/prepared"), help="directory written by ingest")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--module", default="m2", help="params module whose supernet spec is benchmarked")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {list(VARIANTS)}")
    p.add_argument("--train-images", type=int, help=f"training images (stratified subset; default "
                   f"{DEFAULTS['train_images']}, quick {QUICK['train_images']})")
    p.add_argument("--eval-images", type=int, help=f"held-out route images (stratified subset; default "
                   f"{DEFAULTS['eval_images']})")
    p.add_argument("--eval-batch-size", type=int, default=128,
                   help="evaluation batch (on 2 CPU threads 128 runs faster than 512)")
    p.add_argument("--epochs", type=int, help=f"supernet epochs per variant (default {DEFAULTS['epochs']})")
    p.add_argument("--standalone-epochs", type=int,
                   help=f"epochs of each stand-alone subnet (default {DEFAULTS['standalone_epochs']})")
    p.add_argument("--stem-epochs", type=int,
                   help=f"stem training epochs; 0 = no stem (default {DEFAULTS['stem_epochs']})")
    p.add_argument("--subnets", type=int, help=f"R subnets ranked (default {DEFAULTS['subnets']})")
    p.add_argument("--bn-recal-images", type=int,
                   help=f"also rank after BN re-estimation on this many images; 0 = off (default "
                        f"{DEFAULTS['bn_recal_images']})")
    p.add_argument("--batch-size", type=int, help="default: the params' train.batch_size")
    p.add_argument("--lr", type=float, help="default: the params' train.lr")
    p.add_argument("--beta", type=float,
                   help="MI weight of the probmodel variants (default: params' train.beta)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench/out/ranking.json"))
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        p.error(f"--variants: unknown {unknown}; known {list(VARIANTS)}")
    if args.subnets < 2:
        p.error("--subnets must be >= 2")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    report = run(args)
    write_json(args.out, report)
    s = report["settings"]
    print(f"\nR = {len(report['subnets'])} subnets; {s['train_images']} train images; supernet "
          f"{s['epochs']} epoch(s) per variant, stand-alone {s['standalone_epochs']} epoch(s) each; "
          f"{s['eval_images']} route images; wall {report['wall_seconds']:.0f}s")
    print("tau/rho: inherited accuracy vs stand-alone accuracy (tau-b); _bn: after BN re-estimation; "
          "tau_logP: log P(N)(arch) vs stand-alone")
    print(tables(report))
    print(f"\nwritten: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
