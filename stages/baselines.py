"""Train the plain-CNN baselines on the whole `train` split: a small and a large single-exit CNN
(widths from `baselines`), and calibrate the two of them chained (small first) on the `calib` split
by the cascade's own rule (`calibrate.delta`, `calibrate.grid`, `model.confidence`). Writes both nets
and their record to one model directory, and calib-split metrics. Never reads the test split."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.data.difficulty import hard_setting_applies
from pipeline.device import ComputeConfig
from pipeline.evaluation.two_cnn import two_cnn_arrays, two_cnn_result, two_cnn_threshold
from pipeline.io import atomic_path, load_held_out, load_split, read_json, write_json
from pipeline.params.config import TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.train.baselines import (
    LARGE,
    SMALL,
    TWO_CNN,
    BaselineConfig,
    BaselinesMeta,
    PlainCNN,
    calibration_settings,
    plain_macs,
    plain_outputs,
    save_baselines,
    train_baseline,
)
from pipeline.train.config import epochs_note
from stages.common import cli, params_of, parser

SEED_OFFSETS = {SMALL: 101, LARGE: 102}


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("baselines", __doc__)
    p.add_argument("--data", type=Path, default=Path("data/prepared"), help="directory written by ingest")
    p.add_argument("--out", type=Path, default=Path("models/baselines"),
                   help="model directory of the baselines")
    p.add_argument("--metrics", type=Path, default=Path("metrics/baselines.json"), help="metrics JSON")
    p.add_argument("--graded", type=Path, default=Path("data/graded"),
                   help="directory written by grade: its scores say whether the data is hard (min_steps_hard)")
    args = p.parse_args(argv)
    params = params_of(args)
    cfg = BaselineConfig.from_dict(params.get("baselines"))
    delta, grid, kind, bound_z, held_out = calibration_settings(params)
    compute = ComputeConfig.from_params(params)
    device = compute.resolve()  # training runs there; the nets come back (and are saved) on the CPU
    seed = params.get("seed", 0)  # checked with the params file: an int >= 0
    meta = read_json(args.data / "meta.json")
    num_classes = len(meta["classes"])
    train, calib = load_split(args.data, "train"), load_held_out(args.data, held_out)
    image_shape = tuple(int(v) for v in train.images.shape[1:])  # (C, H, W)
    hard = hard_setting_applies(cfg.min_steps_hard, args.graded, num_classes)
    sized = cfg.sized_to(len(train), hard)  # small data: epochs raised to the step floor
    if sized.epochs != cfg.epochs:
        print(epochs_note("baselines", cfg.epochs, sized.epochs, cfg.floor(hard), len(train), cfg.batch_size, hard))
    cfg = sized
    # Normalisation statistics of the training images, as the train stage computes them for module 1.
    pixels = train.images.astype(np.float32) / 255.0
    mean = tuple(pixels.mean(axis=(0, 2, 3)).round(4).tolist())
    std = tuple(pixels.std(axis=(0, 2, 3)).round(4).tolist())
    widths = {SMALL: cfg.small_width, LARGE: cfg.large_width}
    calib_labels = torch.from_numpy(calib.labels)
    nets: dict[str, PlainCNN] = {}
    figures: dict[str, dict[str, Any]] = {}
    conf: dict[str, np.ndarray] = {}  # name -> (N,) calib confidence
    correct: dict[str, np.ndarray] = {}  # name -> (N,) bool, calib prediction right
    run_params = {"baselines": asdict(cfg), "seed": seed,
                  "calibrate": {"delta": delta, "grid": grid, "bound_z": bound_z, "held_out": held_out},
                  "confidence": kind, "train_images": len(train)}
    with stage_run("baselines", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params=run_params) as run:
        for name, width in widths.items():
            def on_epoch(epoch: int, record: dict, _module: torch.nn.Module, _model: Any,
                         name: str = name) -> None:
                run.log_metrics({f"{name}_{key}": v for key, v in record.items()
                                 if isinstance(v, (int, float))}, step=epoch)
                print(f"baselines@{name} epoch {epoch}/{cfg.epochs}: loss {record['loss']:.4f} "
                      f"acc {record['train_acc']:.4f} {record['images_per_s']:.0f} img/s", flush=True)

            started = time.perf_counter()
            net = train_baseline(width, train.images, train.labels, mean, std, num_classes, cfg,
                                 seed + SEED_OFFSETS[name], on_epoch=on_epoch, device=device,
                                 precision=compute.precision)
            seconds = time.perf_counter() - started
            logits, net_conf = plain_outputs(net, calib.images, mean, std, kind)  # (N, K), (N,)
            nets[name], conf[name] = net, net_conf.numpy()
            correct[name] = (logits.argmax(dim=-1) == calib_labels).numpy()
            figures[name] = {"width": width, "macs": plain_macs(net, image_shape),
                             "calib_accuracy": float(correct[name].mean()),
                             "train_seconds": round(seconds, 1)}
        macs_small, macs_large = figures[SMALL]["macs"], figures[LARGE]["macs"]
        chain_inputs = (conf[SMALL], correct[SMALL], correct[LARGE], macs_small, macs_large)
        threshold = two_cnn_threshold(*chain_inputs, delta, grid, bound_z)
        chain = two_cnn_result(*two_cnn_arrays(*chain_inputs), threshold)
        figures[TWO_CNN] = {"threshold": threshold, "calib_accuracy": chain["accuracy"],
                            "calib_mean_macs": chain["mean_macs"],
                            "small_exit_share": chain["small_exit_share"]}
        metrics = {**figures, "calib_images": len(calib), "train_images": len(train), "epochs": cfg.epochs,
                   "delta": delta, "grid": grid, "confidence": kind}
        # The model record keeps no timings (they stay in the metrics file), so identical inputs give a
        # byte-identical models/baselines and dvc.lock.
        calib_record = {key: ({k: v for k, v in metrics[key].items() if k != "train_seconds"}
                              if isinstance(metrics[key], dict) else metrics[key])
                        for key in (SMALL, LARGE, TWO_CNN, "calib_images", "delta", "grid")}
        record = BaselinesMeta(cfg.small_width, cfg.large_width, image_shape[0], num_classes, image_shape,
                               mean, std, macs_small, macs_large, threshold, kind, calib=calib_record)
        with atomic_path(args.out, is_dir=True) as tmp:
            save_baselines(tmp, nets[SMALL], nets[LARGE], record)
        write_json(args.metrics, metrics)
        run.log_metrics({f"{name}_{key}": v for name in (SMALL, LARGE, TWO_CNN)
                         for key, v in figures[name].items()})
        run.log_artifact(args.metrics)
    for name in (SMALL, LARGE):
        f = figures[name]
        print(f"baselines: {name} (width {f['width']}, {f['macs']:,} MACs): calib accuracy "
              f"{f['calib_accuracy']:.4f}, trained in {f['train_seconds']} s")
    f = figures[TWO_CNN]
    print(f"baselines: {TWO_CNN} (threshold {f['threshold']:.4f}): calib accuracy {f['calib_accuracy']:.4f} "
          f"at {f['calib_mean_macs']:,.0f} MACs; {f['small_exit_share']:.1%} leave at the small net")


if __name__ == "__main__":
    raise SystemExit(main())
