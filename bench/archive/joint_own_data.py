"""Is it the module-by-module training? A kept own-data run's cascade trained again end to end.

    python -m bench.own_data --folders scenes-colour-64 --seeds 0 1 2 --keep KEPT
    python -m bench.archive.joint_own_data KEPT/scenes-colour-64-seed0 KEPT/scenes-colour-64-seed1 ...

The pipeline trains its modules one by one from the input side, each behind its frozen predecessors
(the source's mechanism). On the hard own-data folder (the scenes) the cascade's exits stay below a
plain CNN of their cost (docs/RESULTS.md "Your own images"). This study takes a kept run (``--keep``)
and trains the same architecture again with every module at once, end to end (the sum of the exits'
cross-entropies; module 3 on the path the run's ``select`` stage chose), with the run's own recipe
(its ``train`` section: optimiser, lr schedule, batch, crop and flip, gradient clip, epochs raised to the
hard-data step floor, no distillation) from the run's seed, two ways: ``joint``, every exit's loss, and
``last``, the last exit's loss only (the three modules as one plain network: what their shape can reach
when nothing else pulls on the features). Both are read per exit on the held-out
images (``route`` + ``calib``) and on ``test``, beside the run's ``plain_small`` and ``plain_large``
(test, from its ``metrics/evaluate.json``). If the jointly trained exits reach the plain CNNs, the
sequential training is what costs; if not, the modules' shape is.

The joint net uses plain cross-entropy, not the pipeline's cost-aware loss, and sees every training
image once per epoch (no curriculum): it is the end-to-end control, not a variant of the pipeline.
Writes ``--out`` (default ``bench/out/joint_own_data.json``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.io import load_held_out, load_split, read_json, write_json
from pipeline.models.modules import NO_ARCH, build_module
from pipeline.models.store import load_module
from pipeline.params.config import load_params
from pipeline.search.space import Arch
from pipeline.train.config import learning_rate, module_train_config, sized_to
from pipeline.train.data import ImageBatches
from pipeline.train.loop import make_optimizer

MODULES = ("m1", "m2", "m3")


def run_stages(run: Path) -> tuple[list[nn.Module], list[Arch], Any]:
    """The run's trained modules (eval mode), the path each runs (module 3: its static selection) and
    module 1's record (input normalisation)."""
    modules, archs, first = [], [], None
    for name in MODULES:
        module, info = load_module(run / "models" / "modules" / name / "train")
        selection = run / "models" / "modules" / name / "select" / "selection.json"
        key = read_json(selection).get("static", "") if selection.exists() else ""
        modules.append(module)
        archs.append(Arch.from_key(key) if key else NO_ARCH)
        first = first or info
    return modules, archs, first


def exit_accuracies(modules: list[nn.Module], archs: list[Arch], images: np.ndarray, labels: np.ndarray,
                    mean: Any, std: Any) -> list[float]:
    """Each exit's accuracy when the modules run in series on ``images`` (N, C, H, W) uint8."""
    batches = ImageBatches(images, labels, 256, mean=mean, std=std)
    right = np.zeros(len(modules))
    with torch.no_grad():
        for x, y in batches:
            for k, (module, arch) in enumerate(zip(modules, archs, strict=True)):
                x, logits = module(x, arch)
                right[k] += int((logits.argmax(dim=-1) == y).sum())
    return (right / len(labels)).round(4).tolist()


VARIANTS = ("joint", "last")


def train_jointly(run: Path, archs: list[Arch], first: Any, seed: int,
                  variant: str = "joint") -> tuple[list[nn.Module], dict[str, Any]]:
    """The run's three modules, fresh, trained together end to end with module 1's recipe (``first``:
    module 1's record, whose input normalisation the net keeps); ``variant`` ``joint`` sums every exit's
    cross-entropy, ``last`` takes the last exit's only."""
    params = load_params(run / "params.yaml")
    train = load_split(run / "data" / "prepared", "train")
    cfg = sized_to(module_train_config(params, MODULES[0], seed), len(train), hard=True)
    torch.manual_seed(seed)
    infos = [load_module(run / "models" / "modules" / name / "train")[1] for name in MODULES]
    net = nn.ModuleList([build_module(i.spec, i.in_channels, i.num_classes) for i in infos])
    batches = ImageBatches(train.images, train.labels, cfg.batch_size, mean=first.mean, std=first.std,
                           shuffle=True, crop_padding=cfg.crop_padding, flip=cfg.flip, drop_last=True, seed=cfg.seed)
    opt = make_optimizer(net, cfg)
    start, step = time.perf_counter(), 0
    net.train()
    for epoch in range(cfg.epochs):
        for x, y in batches.epoch(epoch):
            for group in opt.param_groups:
                group["lr"] = learning_rate(cfg, step, len(batches))
            losses = []
            for module, arch in zip(net, archs, strict=True):
                x, logits = module(x, arch)
                losses.append(F.cross_entropy(logits, y))
            loss = sum(losses) if variant == "joint" else losses[-1]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
    net.eval()
    return list(net), {"epochs": cfg.epochs, "steps": step, "lr": cfg.lr, "batch_size": cfg.batch_size,
                       "seconds": round(time.perf_counter() - start, 1)}


def study(run: Path, variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    params = load_params(run / "params.yaml")
    seed = int(params.get("seed", 0))
    data = run / "data" / "prepared"
    held, test = load_held_out(data, "pooled"), load_split(data, "test")
    modules, archs, first = run_stages(run)
    evaluation = read_json(run / "metrics" / "evaluate.json")
    row: dict[str, Any] = {"run": run.name, "seed": seed, "paths": [a.key() for a in archs], "recipes": {}}
    nets = {"sequential": modules}
    for variant in variants:
        nets[variant], row["recipes"][variant] = train_jointly(run, archs, first, seed, variant)
    for split_name, split in (("held_out", held), ("test", test)):
        row[split_name] = {name: exit_accuracies(net, archs, split.images, split.labels, first.mean, first.std)
                           for name, net in nets.items()}
        row[split_name]["images"] = len(split.labels)
    row["test"]["plain"] = {k: evaluation["baselines"][k] for k in ("plain_small", "plain_large")}
    row["exit_macs"] = [e["mean_macs"] for e in evaluation["each_exit_alone"]]
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="runs kept by bench.own_data --keep")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--out", type=Path, default=Path("bench/out/joint_own_data.json"))
    args = p.parse_args(argv)
    rows = [study(run, tuple(args.variants)) for run in args.runs]
    write_json(args.out, {"runs": rows, "threads": torch.get_num_threads()})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
