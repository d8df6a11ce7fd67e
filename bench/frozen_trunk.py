"""What holds the later exits back on hard data: the modules behind module 1, or module 1 itself once it is
frozen? Tails trained behind a finished run's frozen module 1, the same trunk and tails trained end to end,
module 1 trained with a look-ahead tail (its exit's loss plus a tail's) before it is frozen, and the run's
module 1 trained on from where it stopped with that look-ahead tail (exit 1 starts trained there).

    python -m bench.frozen_trunk --run KEPT_RUN                    # the quick profile's trunk and two tails
    python -m bench.frozen_trunk --run KEPT_RUN --tails t16s2,c,t32s2,c,c --lookahead 0.5
    python -m bench.frozen_trunk --run KEPT_RUN --finetune-only    # only the last kind of row
    python -m bench.frozen_trunk --run KEPT_RUN --finetune-only --control  # its control: exit 1 loss only

A net is written ``t<N>s<S>`` (a 3x3 conv-BN-ReLU to N channels at stride S, a module's transition), ``p``
(a 2x2 max pool), ``c`` (a conv3 block at the width so far), comma-separated, then the modules' exit head
(pool_mlp, 4x4 grid, 128 hidden). ``--trunk`` should be the run's module 1 (the quick profile's by default),
so that the rows behind the run's own module 1 and behind a retrained one compare.

Every net trains by the run's plain-CNN recipe at plain_large's step budget (``bench.anchors.recipe``):
the pipeline's optimizer (``make_optimizer``) and lr schedule, its random crop and flip, its gradient clip,
in one loop here so the rows differ only in what is trained and what is frozen. Rows are read on the
held-out images (route + calib: choose on these) and on test. docs/RESULTS.md "Module 1 frozen is what
stops the later exits".
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.anchors import recipe
from pipeline.io import load_split, read_json
from pipeline.models.cost import count_macs
from pipeline.models.modules import NO_ARCH, ExitHead
from pipeline.models.ops import ConvBNReLU, make_op
from pipeline.models.store import load_module
from pipeline.train.config import TrainConfig, learning_rate
from pipeline.train.data import random_crop, random_flip
from pipeline.train.loop import make_optimizer

TRANSITION = re.compile(r"t(\d+)s([12])")


class Net(nn.Module):
    """A net written as above; ``forward(x) -> (features, logits)`` as a module's."""

    def __init__(self, text: str, in_channels: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for token in text.split(","):
            match = TRANSITION.fullmatch(token)
            if token == "p":
                layers.append(nn.MaxPool2d(2))
            elif token == "c":
                layers.append(make_op("conv3", channels))
            elif match:
                layers.append(ConvBNReLU(channels, int(match[1]), 3, int(match[2])))
                channels = int(match[1])
            else:
                raise SystemExit(f"bench.frozen_trunk: {token!r} in {text!r} is not t<N>s<1|2>, p or c")
        self.body = nn.Sequential(*layers)
        self.head = ExitHead(channels, num_classes, "pool_mlp", 4, 128)

    def forward(self, x: torch.Tensor, arch: Any = NO_ARCH) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)  # (B, C, H', W')
        return h, self.head(h)


class Data:
    """A run's splits as float tensors in [0, 1] (the crop pads the raw image, as the pipeline's does)."""

    def __init__(self, run: Path) -> None:
        prepared = run / "data" / "prepared"
        self.classes = len(read_json(prepared / "meta.json")["classes"])
        splits = {name: load_split(prepared, name) for name in ("train", "route", "calib", "test")}
        self.x = {k: torch.from_numpy(s.images).float() / 255.0 for k, s in splits.items()}  # (N, C, H, W)
        self.y = {k: torch.from_numpy(s.labels.astype(np.int64)) for k, s in splits.items()}  # (N,)
        self.x["held"] = torch.cat([self.x["route"], self.x["calib"]])
        self.y["held"] = torch.cat([self.y["route"], self.y["calib"]])
        self.shape = tuple(int(v) for v in self.x["train"].shape[1:])


def fit(chain: Sequence[nn.Module], weights: Sequence[float], frozen: Sequence[nn.Module], data: Data,
        norm: tuple[torch.Tensor, torch.Tensor], cfg: TrainConfig, seed: int) -> None:
    """Train ``chain`` (each net reads the previous one's features) behind the ``frozen`` nets, the loss the
    sum of ``weights[i]`` times net i's exit cross-entropy (weight 0: no exit loss)."""
    mean, std = norm
    trained = nn.ModuleList(chain)
    optimizer = make_optimizer(trained, cfg)
    params = [p for p in trained.parameters()]
    generator = torch.Generator().manual_seed(seed)
    x_all, y_all = data.x["train"], data.y["train"]
    per_epoch = len(x_all) // cfg.batch_size
    step = 0
    for net in frozen:
        net.eval().requires_grad_(False)
    for _ in range(cfg.epochs):
        trained.train()
        order = torch.randperm(len(x_all), generator=generator)
        for b in range(per_epoch):
            idx = order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
            h = (random_flip(random_crop(x_all[idx], cfg.crop_padding, generator), generator) - mean) / std
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(cfg, step, per_epoch)
            with torch.no_grad():
                for net in frozen:
                    h = net(h, NO_ARCH)[0]
            loss = torch.zeros(())
            for net, weight in zip(chain, weights, strict=True):
                h, logits = net(h, NO_ARCH)
                if weight:
                    loss = loss + weight * F.cross_entropy(logits, y_all[idx])
            optimizer.zero_grad()
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            optimizer.step()
            step += 1
    trained.eval()


@torch.no_grad()
def exit_accuracy(chain: Sequence[nn.Module], data: Data, split: str, norm: tuple[torch.Tensor, torch.Tensor]
                  ) -> list[float]:
    """Accuracy of each net's exit along ``chain`` on ``split`` (``held``: route + calib)."""
    h = (data.x[split] - norm[0]) / norm[1]
    out = []
    for net in chain:
        net.eval()
        h, logits = net(h, NO_ARCH)
        out.append(float((logits.argmax(-1) == data.y[split]).float().mean()))
    return out


def read_row(name: str, chain: Sequence[nn.Module], data: Data, norm: tuple[torch.Tensor, torch.Tensor],
             seconds: float) -> dict[str, Any]:
    held, test = exit_accuracy(chain, data, "held", norm), exit_accuracy(chain, data, "test", norm)
    shapes, macs = [data.shape], []
    for net in chain:
        macs.append(count_macs(net, shapes[-1]))
        with torch.no_grad():
            shapes.append(tuple(net(torch.zeros(1, *shapes[-1]), NO_ARCH)[0].shape[1:]))
    return {"row": name, "held_out": held, "test": test, "macs": macs, "held_out_images": len(data.y["held"]),
            "test_images": len(data.y["test"]), "seconds": round(seconds, 1)}


def study(run: Path, trunk: str, tails: Sequence[str], lookahead: float, seed: int,
          finetune_only: bool = False, control: bool = False) -> list[dict[str, Any]]:
    """Every row of the study on one run (see the module's docstring); ``finetune_only``: only the run's
    module 1 fine-tuned with the look-ahead tail and the fresh tails behind it."""
    data = Data(run)
    module1, info = load_module(run / "models" / "modules" / "m1" / "train")
    norm = (torch.tensor(info.mean).view(1, -1, 1, 1), torch.tensor(info.std).view(1, -1, 1, 1))
    cfg = recipe(run).train_config(seed)
    with torch.no_grad():
        features = module1(torch.zeros(1, *data.shape), module1.default_arch())[0].shape[1]

    def build(text: str, channels: int, offset: int) -> Net:
        torch.manual_seed(seed + offset)
        return Net(text, channels, data.classes)

    if finetune_only:
        return finetuned_rows(module1, tails, lookahead, data, norm, cfg, build, seed, control)
    rows = []
    for i, tail_text in enumerate(tails):
        started = time.perf_counter()
        tail = build(tail_text, features, 10 + i)
        fit([tail], [1.0], [module1], data, norm, cfg, seed + 1)
        rows.append(read_row(f"behind the run's module 1: {tail_text}", [module1, tail], data, norm,
                             time.perf_counter() - started))
        started = time.perf_counter()
        chain = [build(trunk, data.shape[0], 20 + i), build(tail_text, features, 30 + i)]
        fit(chain, [0.0, 1.0], [], data, norm, cfg, seed + 2)
        rows.append(read_row(f"end to end, one exit: {trunk} + {tail_text}", chain, data, norm,
                             time.perf_counter() - started))
    started = time.perf_counter()
    retrained, aux = build(trunk, data.shape[0], 40), build(tails[-1], features, 41)
    fit([retrained, aux], [lookahead, 1.0], [], data, norm, cfg, seed + 3)
    rows.append(read_row(f"module 1 with a look-ahead tail (exit loss x {lookahead:g}): {trunk} + {tails[-1]}",
                         [retrained, aux], data, norm, time.perf_counter() - started))
    rows += fresh_tails(retrained, features, tails, data, norm, cfg, build, 50, seed + 4)
    return rows + finetuned_rows(module1, tails, lookahead, data, norm, cfg, build, seed)


def finetuned_rows(module1: nn.Module, tails: Sequence[str], lookahead: float, data: Data,
                   norm: tuple[torch.Tensor, torch.Tensor], cfg: TrainConfig, build: Any, seed: int,
                   control: bool = False) -> list[dict[str, Any]]:
    """The run's module 1 (a copy) trained on from where it stopped with the last tail as look-ahead (exit 1
    starts trained, so it cannot stall as a fresh one can), then frozen, and each tail fresh behind it;
    ``control``: trained on as long with its own exit's loss only (is it the look-ahead, or the steps?)."""
    started = time.perf_counter()
    tuned = copy.deepcopy(module1).requires_grad_(True)
    features = tuned(torch.zeros(1, *data.shape), NO_ARCH)[0].shape[1]
    if control:
        fit([tuned], [1.0], [], data, norm, cfg, seed + 5)
        rows = [read_row("the run's module 1 trained on alone, as long (control)", [tuned], data, norm,
                         time.perf_counter() - started)]
    else:
        aux = build(tails[-1], features, 61)
        fit([tuned, aux], [lookahead, 1.0], [], data, norm, cfg, seed + 5)
        rows = [read_row(f"the run's module 1 trained on with a look-ahead tail (exit loss x {lookahead:g}): "
                         f"{tails[-1]}", [tuned, aux], data, norm, time.perf_counter() - started)]
    return rows + fresh_tails(tuned, features, tails, data, norm, cfg, build, 70, seed + 6)


def fresh_tails(module1: nn.Module, features: int, tails: Sequence[str], data: Data,
                norm: tuple[torch.Tensor, torch.Tensor], cfg: TrainConfig, build: Any, offset: int, seed: int
                ) -> list[dict[str, Any]]:
    """Each tail, fresh (initialised at ``offset`` + its index), trained behind ``module1`` frozen."""
    rows = []
    for i, tail_text in enumerate(tails):
        started = time.perf_counter()
        tail = build(tail_text, features, offset + i)
        fit([tail], [1.0], [module1], data, norm, cfg, seed)
        rows.append(read_row(f"behind that module 1, a fresh tail: {tail_text}", [module1, tail], data, norm,
                             time.perf_counter() - started))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a finished run kept by bench.own_data --keep")
    p.add_argument("--trunk", default="t8s1,p,c,p,c,c", help="the run's module 1 (default: the quick profile's)")
    p.add_argument("--tails", nargs="+", default=["t16s2,c,t32s2,c,c", "t32s1,c,t64s2,c,c"],
                   help="modules 2 and 3 as one net (default: the quick profile's, then a wide one); the last "
                        "is the look-ahead")
    p.add_argument("--lookahead", type=float, default=1.0, help="weight of module 1's exit loss beside the tail's")
    p.add_argument("--finetune-only", action="store_true",
                   help="only the run's module 1 trained on with the look-ahead tail, and tails behind it")
    p.add_argument("--control", action="store_true",
                   help="with --finetune-only: module 1 trained on with its own exit's loss only, as long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steady on a shared machine)")
    p.add_argument("--out", type=Path, default=Path("bench/out/frozen_trunk.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = study(args.run, args.trunk, args.tails, args.lookahead, args.seed, args.finetune_only,
                 args.control)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"run": str(args.run), "seed": args.seed, "rows": rows}, indent=1) + "\n")
    for row in rows:
        exits = " / ".join(f"{100 * a:.2f}" for a in row["held_out"])
        print(f"{row['row']:<100} held out {exits}%, last exit on test {100 * row['test'][-1]:.2f}% at "
              f"{sum(row['macs']) / 1e6:.2f} M MACs", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
