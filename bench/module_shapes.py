"""Which shape should module 1 have? Candidate first modules trained alone as single-exit nets on a run's
train split, by the run's plain-CNN recipe at plain_large's step budget (``bench.anchors``), and read on
its test split beside the field's nets: accuracy per MAC at the first exit, before any cascade.

    python -m bench.module_shapes --run . c16s1:conv3 c24s2:conv3 c32s2:dw3,dw3,dw3

A candidate is ``c<channels>s<stride>:<op>,<op>,...``: a 3x3 conv-BN-ReLU transition to ``channels`` at
``stride`` (the modules' own), then the ops of ``pipeline.models.ops`` in series (``maxpool``: a 2x2 max
pool there), then the modules' exit head (``--head``, default the shipped pool_mlp 4x4 grid, 128 hidden).
``c16s1:conv3`` is the default's module 1. Each row has the test accuracy and the held-out (``route`` +
``calib``) accuracy: choose on the held-out one.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
from torch import nn

from bench.anchors import train_net_and_read
from pipeline.models.modules import NO_ARCH, ExitHead
from pipeline.models.ops import ConvBNReLU, make_op
from pipeline.search.space import Arch, SearchSpace


class Candidate(nn.Module):
    """Transition, ops, exit head, with a fixed module's surface (``forward(x, arch)``, an empty space)."""

    def __init__(self, shape: str, in_channels: int, num_classes: int, head: tuple[str, int, int]) -> None:
        super().__init__()
        stem, _, body = shape.partition(":")
        match = re.fullmatch(r"c(\d+)s([12])", stem)
        if match is None:
            raise SystemExit(f"bench.module_shapes: {shape!r} is not c<channels>s<stride>:<op>,... (stride 1 or 2)")
        channels, stride = int(match[1]), int(match[2])
        self.space = SearchSpace()
        self.transition = ConvBNReLU(in_channels, channels, 3, stride)
        self.body = nn.Sequential(*(nn.MaxPool2d(2) if op == "maxpool" else make_op(op, channels)
                                    for op in body.split(",") if op))
        self.head = ExitHead(channels, num_classes, *head)

    def default_arch(self) -> Arch:
        return NO_ARCH

    def forward(self, x: torch.Tensor, arch: Arch = NO_ARCH) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(self.transition(x))  # (B, C, H', W')
        return features, self.head(features)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shapes", nargs="+", metavar="SHAPE")
    p.add_argument("--run", type=Path, required=True, help="a finished run's repository (bench.anchors)")
    p.add_argument("--head", nargs=3, default=["pool_mlp", "4", "128"], metavar=("KIND", "GRID", "HIDDEN"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steady on a shared machine)")
    p.add_argument("--out", type=Path, default=Path("bench/out/module_shapes.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    head = (args.head[0], int(args.head[1]), int(args.head[2]))
    rows = json.loads(args.out.read_text())["rows"] if args.out.exists() else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes:
        if any(r["shape"] == shape and r["seed"] == args.seed and r["head"] == list(head) for r in rows):
            continue
        row = train_net_and_read(args.run, lambda c, k, s=shape: Candidate(s, c, k, head), args.seed + 1)
        rows.append({"shape": shape, "head": list(head), "seed": args.seed, **row})
        args.out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        print(f"module_shapes: {shape:<24} held out {100 * row['held_out_accuracy']:6.2f}%, test "
              f"{100 * row['accuracy']:6.2f}% (SE {100 * row['se']:.2f}) at "
              f"{row['mean_macs'] / 1e6:5.2f} M MACs, {row['train_seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
