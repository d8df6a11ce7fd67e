"""GPU check: training throughput (images/s) of every module of the cascade in params.yaml, on CUDA and
on the CPU in one run, side by side, with the GPU's name. Each module trains behind its frozen,
randomly initialised prefix (modules 1..k-1 on their default paths), with the module's own train
settings (``train`` overlaid by ``modules.mK.train``) for ``--epochs`` epochs.

    python -m bench.gpu_check                       # both devices, 1 epoch, at most 4096 images
    python -m bench.gpu_check --device-only cpu --max-images 64 --batch-size 16   # a smoke test
    python -m bench.gpu_check --precision bf16 --out bench/out/gpu_check.json

Data: ``<data>/train.npz`` when it exists (images as ingest wrote them), else random uint8 images of
the shape in params ``data``. Prints a table and writes JSON (``--out``): per module, images/s on each
device and cuda/cpu. Never needed by the pipeline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.data.input_shape import resolve_input
from pipeline.device import device_name, resolve_device
from pipeline.models.cascade import build_modules, feature_shapes
from pipeline.models.config import ModelConfig
from pipeline.models.cost import fixed_macs, op_mac_table
from pipeline.models.profile import CostModel
from pipeline.params.config import ConfigError, DataConfig, deep_merge, load_params, section
from pipeline.train.config import TrainConfig
from pipeline.train.loop import train_module
from pipeline.train.prefix import Prefix

DEVICES = ("cpu", "cuda")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=Path, default=Path("params.yaml"),
                   help="params file (default: params.yaml)")
    p.add_argument("--data", type=Path, default=Path("data/prepared"),
                   help="ingest's output directory; random images when <data>/train.npz is missing")
    p.add_argument("--epochs", type=int, default=1, help="epochs per module and device (default 1)")
    p.add_argument("--max-images", type=int, default=4096, help="cap on training images (default 4096)")
    p.add_argument("--batch-size", type=int, default=None, help="override train.batch_size (default: params)")
    p.add_argument("--modules", default=None, help="comma-separated module keys, e.g. m1,m3 (default: all)")
    p.add_argument("--device-only", choices=DEVICES, default=None,
                   help="run on this device only (cpu: a smoke test on a machine without a GPU)")
    p.add_argument("--cuda-device", default="cuda", help="the CUDA device: cuda or cuda:N (default cuda)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="CUDA runs' precision (the CPU always runs fp32; default fp32)")
    p.add_argument("--warmup-images", type=int, default=1024,
                   help="untimed training on this many images first, per module and device (CUDA context, "
                        "cuDNN's algorithm choice, the allocator; default 1024, 0: none)")
    p.add_argument("--seed", type=int, default=0, help="weights, data order and random images (default 0)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON table here too")
    args = p.parse_args(argv)
    for name in ("epochs", "max_images", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def load_images(data: Path, params: dict[str, Any], max_images: int, seed: int
                ) -> tuple[np.ndarray, np.ndarray, int, str]:
    """(images (N, C, H, W) uint8, labels (N,), number of classes, where they came from)."""
    path = data / "train.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            images, labels = z["images"][:max_images], z["labels"][:max_images].astype(np.int64)
        meta = data / "meta.json"
        classes = len(json.loads(meta.read_text())["classes"]) if meta.is_file() else int(labels.max()) + 1
        return images, labels, classes, str(path)
    cfg = DataConfig.from_params(params)
    choice = resolve_input(cfg.source, cfg.image_size, cfg.channels)  # `auto` read from the data
    rng = np.random.default_rng(seed)
    shape = (max_images, choice.channels, choice.image_size, choice.image_size)
    return (rng.integers(0, 256, shape, dtype=np.uint8), rng.integers(0, 10, max_images).astype(np.int64), 10,
            "random")


def cost_model(modules: torch.nn.ModuleList, shapes: Sequence[Sequence[int]]) -> CostModel:
    """MACs of every module (what the cost-aware loss prices), no latencies."""
    rows = [{"fixed_macs": fixed_macs(m, shape), "op_macs": op_mac_table(m, shape),
             "default_arch": m.default_arch().key()} for m, shape in zip(modules, shapes, strict=False)]
    return CostModel({"modules": rows})


def train_config(params: dict[str, Any], name: str, epochs: int, batch_size: int | None, n: int,
                 seed: int) -> TrainConfig:
    merged = deep_merge(section(params, "train"), params["modules"][name].get("train") or {})
    merged.setdefault("seed", seed)
    cfg = TrainConfig.from_dict(merged)
    batch = min(batch_size or cfg.batch_size, n)  # at least one full batch (drop_last)
    # kd 0: the timings are of the module's own training step (no teacher is trained here)
    return dataclasses.replace(cfg, epochs=epochs, batch_size=batch, m=min(cfg.m, batch),
                               warmup_epochs=min(cfg.warmup_epochs, 0.5 * epochs), kd=0.0)


def time_module(k: int, spec: Any, images: np.ndarray, labels: np.ndarray, cfg: TrainConfig,
                device: torch.device, precision: str, seed: int) -> float:
    """Seconds to train module k (behind its frozen prefix) on ``device``."""
    modules = build_modules(spec, seed).to(device)
    shapes = feature_shapes(spec)
    costs = cost_model(modules.cpu(), shapes)
    modules.to(device)
    prefix = Prefix(tuple((modules[j], modules[j].default_arch()) for j in range(k - 1)),
                    tuple(float(v) for v in (images.astype(np.float32) / 255.0).mean(axis=(0, 2, 3))),
                    tuple(float(v) for v in (images.astype(np.float32) / 255.0).std(axis=(0, 2, 3))))
    if device.type == "cuda":
        torch.zeros(1, device=device).sum().item()  # CUDA context up before the clock starts
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    train_module(modules[k - 1], prefix, images, labels, cfg, cost_of=lambda a: costs.macs(k, a),
                 cost_max=costs.max_macs(k), exit_saving=costs.exit_saving(k), progress=False, precision=precision)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        params = load_params(args.params)
        model = ModelConfig.from_params(params)
        images, labels, classes, source = load_images(args.data, params, args.max_images, args.seed)
        devices = {name: resolve_device(name if name == "cpu" else args.cuda_device,
                                        key="--cuda-device" if name == "cuda" else "cpu")
                   for name in DEVICES if args.device_only in (None, name)}
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spec = model.cascade_spec(int(images.shape[1]), classes, int(images.shape[2]))
    names = model.names if args.modules is None else tuple(s.strip() for s in args.modules.split(","))
    unknown = [n for n in names if n not in model.names]
    if unknown:
        print(f"error: --modules {unknown} not in the cascade {list(model.names)}", file=sys.stderr)
        return 2
    n = len(images)
    rows = []
    for name in names:
        k = model.names.index(name) + 1
        cfg = train_config(params, name, args.epochs, args.batch_size, n, args.seed)
        row: dict[str, Any] = {"module": name, "kind": spec.modules[k - 1].kind, "batch_size": cfg.batch_size}
        for dev_name, device in devices.items():
            precision = args.precision if device.type == "cuda" else "fp32"
            warm = min(n, max(args.warmup_images, cfg.batch_size)) if args.warmup_images > 0 else 0
            if warm:  # untimed: the first steps on a device pay for its set-up, not for the module
                time_module(k, spec, images[:warm], labels[:warm], dataclasses.replace(cfg, epochs=1), device,
                            precision, args.seed)
            seconds = time_module(k, spec, images, labels, cfg, device, precision, args.seed)
            row[f"{dev_name}_seconds"] = round(seconds, 3)
            row[f"{dev_name}_images_per_s"] = round(n * args.epochs / seconds, 1)
        if len(devices) == 2:
            row["cuda_over_cpu"] = round(row["cuda_images_per_s"] / row["cpu_images_per_s"], 2)
        rows.append(row)
        print("  ".join(f"{key} {value}" for key, value in row.items()), flush=True)
    result = {"gpu": device_name(devices["cuda"]) if "cuda" in devices else None,
              "cuda_device": str(devices["cuda"]) if "cuda" in devices else None,
              "precision": args.precision if "cuda" in devices else "fp32",
              "torch": torch.__version__, "cpu_threads": torch.get_num_threads(), "images": n,
              "image_shape": list(images.shape[1:]), "data": source, "epochs": args.epochs, "modules": rows}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
