"""Benchmark: training throughput (images/s) of every module of the default cascade on this machine,
each behind its (randomly initialised, frozen) prefix, for both supernet samplers and both memory
layouts of training (``channels_last``, the default, and ``contiguous``), side by side in one run;
the layouts alternate per row, so a noisy neighbour hits both alike.

    python -m bench.train_throughput [--params params.yaml] [--steps 30] [--out bench/out/train_throughput.json]

Reads only the module specs and train settings from params; uses random uint8 images of the
configured size, so it needs no data. Full-run figures (per stage, real data) are in metrics/train_mK.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.data.input_shape import resolve_input
from pipeline.device import MEMORY_FORMATS
from pipeline.models.cascade import build_modules, feature_shapes
from pipeline.models.config import ModelConfig
from pipeline.models.cost import count_macs
from pipeline.params.config import DataConfig, deep_merge, load_params
from pipeline.train.config import TrainConfig
from pipeline.train.loop import train_module
from pipeline.train.prefix import Prefix


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--steps", type=int, default=30, help="optimisation steps timed per module and sampler")
    p.add_argument("--out", type=Path, default=Path("bench/out/train_throughput.json"))
    args = p.parse_args(argv)
    params = load_params(args.params)
    cfg, model = DataConfig.from_params(params), ModelConfig.from_params(params)
    data = resolve_input(cfg.source, cfg.image_size, cfg.channels)  # `auto` read from the data
    spec = model.cascade_spec(data.channels, 10, data.image_size)
    shapes = feature_shapes(spec)
    rows = []
    for k, name in enumerate(model.names, start=1):
        cfg = TrainConfig.from_dict(deep_merge(params["train"], params["modules"][name].get("train") or {}))
        n = cfg.batch_size * args.steps
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (n, data.channels, data.image_size, data.image_size), dtype=np.uint8)
        labels = rng.integers(0, 10, n)
        samplers = ("uniform", "probmodel") if spec.modules[k - 1].kind == "supernet" else ("-",)
        for sampler, layout in ((s, f) for s in samplers for f in MEMORY_FORMATS):
            modules = build_modules(spec, seed=0)
            prefix = Prefix(tuple((modules[j], modules[j].default_arch()) for j in range(k - 1)))
            module = modules[k - 1]
            macs = count_macs(module, shapes[k - 1], module.default_arch())
            run_cfg = dataclasses.replace(cfg, epochs=1, sampler=sampler if sampler != "-" else cfg.sampler,
                                          kd=0.0)  # the training step alone, without a teacher's soft targets
            if not rows:  # untimed warm-up in each layout: oneDNN builds its kernels on first use
                for warm in MEMORY_FORMATS:
                    train_module(build_modules(spec, seed=0)[k - 1], prefix, images[:4 * cfg.batch_size],
                                 labels[:4 * cfg.batch_size], run_cfg, cost_of=lambda a: 1.0, cost_max=1.0,
                                 exit_saving=0.5, progress=False, layout=warm)
            start = time.perf_counter()
            train_module(module, prefix, images, labels, run_cfg, cost_of=lambda a: 1.0, cost_max=1.0,
                         exit_saving=0.5, progress=False, layout=layout)
            seconds = time.perf_counter() - start
            rows.append({"module": name, "kind": spec.modules[k - 1].kind, "sampler": sampler,
                         "layout": layout, "default_path_macs": macs, "images_per_s": round(n / seconds, 1),
                         "seconds": round(seconds, 2)})
            print(f"{name} {spec.modules[k - 1].kind:8s} {sampler:9s} {layout:13s} {n / seconds:8.1f} img/s  "
                  f"(default path {macs / 1e6:.2f} M MACs, {args.steps} steps of {cfg.batch_size})", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    ratios = {f"{r['module']} {r['sampler']}": round(r["images_per_s"] / c["images_per_s"], 2)
              for r, c in zip(rows[::2], rows[1::2], strict=True)}  # channels_last / contiguous
    for key, ratio in ratios.items():
        print(f"{key}: channels_last {ratio:.2f}x the throughput of contiguous")
    args.out.write_text(json.dumps({"threads": torch.get_num_threads(), "rows": rows,
                                    "channels_last_over_contiguous": ratios}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
