"""Benchmark: training-step time of the plain CNNs and module 1, with the BatchNorm layers of
``pipeline.device.odd_width_norms`` (narrower than 16 channels, not a multiple of 8) in the standard layout
inside channels_last training (what ``pipeline.device.memory_format`` does) and without (every layer
channels_last), side by side in one run. The two settings alternate in rounds of a few steps, so a noisy
neighbour hits both alike; the medians over the rounds are reported.

    python -m bench.norm_layout [--rounds 12] [--steps 5] [--widths 4 8 12] [--out bench/out/norm_layout.json]

The nets are the plain CNNs of params.yaml on Fashion-MNIST's input (1x28x28, batch 128) and of the
quick profile on 64 px colour images (3x64x64, batch 64: the scenes folder of ``bench.own_data``), and
module 1 of each (the quick profile's has 8 channels at full resolution; the default's 16, a control).
Random images and labels: the step's time does not depend on the values. ``--widths`` adds plain CNNs
of those widths on the quick input (the rule's measurement). Results: docs/RESULTS.md "BatchNorm layers
of odd widths".
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.device import memory_format, odd_width_norms, standard_layout_hooks
from pipeline.models.cascade import build_modules
from pipeline.models.config import ModelConfig
from pipeline.models.modules import PlainCNN
from pipeline.params.config import deep_merge, load_params

Step = Callable[[], None]


def nets(params_file: str, profile_file: str) -> list[tuple[str, nn.Module, tuple[int, int, int], int]]:
    """(name, net, input shape, batch size) for each net measured."""
    default = load_params(params_file)
    quick = deep_merge(default, load_params(profile_file))
    out = []
    for label, params, shape in (("default", default, (1, 28, 28)), ("quick", quick, (3, 64, 64))):
        base, batch = params["baselines"], int(params["train"]["batch_size"])
        for role in ("small", "large"):
            out.append((f"{label} plain_{role} (w={base[f'{role}_width']})",
                        PlainCNN(int(base[f"{role}_width"]), shape[0], 10), shape, batch))
        spec = ModelConfig.from_params(params).cascade_spec(shape[0], 10, shape[1])
        module = build_modules(spec, seed=0)[0]
        out.append((f"{label} module 1 ({spec.modules[0].channels} channels)", module, shape, batch))
    return out


def training_step(net: nn.Module, shape: tuple[int, int, int], batch: int) -> Step:
    """One SGD step of ``net`` on a fixed random channels_last batch (cross-entropy on its logits)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *shape, generator=generator).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), generator=generator)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        logits = net(x)[1]  # (B, K): every net here returns (features, logits)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(logits, y).backward()
        optimizer.step()
    return step


def timed(net: nn.Module, step: Step, steps: int, standard: list[nn.BatchNorm2d]) -> float:
    """Milliseconds per step over ``steps`` steps under channels_last, the norms ``standard`` in the
    standard layout."""
    with memory_format([net], "channels_last", standard_norms=False):
        hooks = [h for norm in standard for h in standard_layout_hooks(norm)]
        try:
            step()  # untimed: oneDNN builds its kernels for this layout on first use
            start = time.perf_counter()
            for _ in range(steps):
                step()
            return (time.perf_counter() - start) / steps * 1000
        finally:
            for hook in hooks:
                hook.remove()


def compare(name: str, net: nn.Module, shape: tuple[int, int, int], batch: int, standard: list[nn.BatchNorm2d],
            rounds: int, steps: int) -> dict:
    """The median ms/step with the norms ``standard`` in the standard layout against none, alternating."""
    net.train()
    step = training_step(net, shape, batch)
    times: dict[str, list[float]] = {"standard": [], "channels_last": []}
    for _ in range(rounds):
        times["standard"].append(timed(net, step, steps, standard))
        times["channels_last"].append(timed(net, step, steps, []))
    row = {"net": name, "input": list(shape), "batch": batch, "standard_norms": [m.num_features for m in standard],
           "ms_per_step_standard": round(statistics.median(times["standard"]), 2),
           "ms_per_step_all_channels_last": round(statistics.median(times["channels_last"]), 2)}
    row["speedup"] = round(row["ms_per_step_all_channels_last"] / row["ms_per_step_standard"], 3)
    print(f"{name:34s} norms {str(row['standard_norms']):10s} standard: {row['ms_per_step_standard']:7.1f} ms/step, "
          f"all channels_last {row['ms_per_step_all_channels_last']:7.1f} ({row['speedup']:.2f}x)", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--profile", default="profiles/quick.yaml")
    p.add_argument("--rounds", type=int, default=12, help="alternating rounds per net and setting")
    p.add_argument("--steps", type=int, default=5, help="training steps timed per round")
    p.add_argument("--widths", type=int, nargs="*", default=[4, 6, 8, 12, 16, 20, 24],
                   help="plain CNNs of these widths on 3x64x64: their w-channel norms standard or not")
    p.add_argument("--out", type=Path, default=Path("bench/out/norm_layout.json"))
    args = p.parse_args(argv)
    rows = [compare(name, net, shape, batch, odd_width_norms([net]), args.rounds, args.steps)
            for name, net, shape, batch in nets(args.params, args.profile)]
    for width in args.widths:  # the rule's measurement: only the full-resolution norms (w channels) move
        torch.manual_seed(0)
        net = PlainCNN(width, 3, 10)
        full = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d) and m.num_features == width]
        rows.append(compare(f"plain CNN w={width} (3x64x64)", net, (3, 64, 64), 64, full, args.rounds, args.steps))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": torch.get_num_threads(), "rounds": args.rounds,
                                    "steps": args.steps, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
