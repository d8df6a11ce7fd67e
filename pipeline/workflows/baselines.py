"""The baselines stage's workflow (``stages.baselines`` parses, calls :func:`train_baselines`, writes and
prints): the small and the large plain CNN trained on the whole train split, read on the held-out images,
and the two chained (small first) calibrated there by the cascade's own rule
(docs/DESIGN.md "Stages and workflows").
Never reads the test split."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.data.difficulty import hard_setting_applies
from pipeline.device import ComputeConfig
from pipeline.evaluation.two_cnn import two_cnn_arrays, two_cnn_result, two_cnn_threshold
from pipeline.io import Split, load_held_out, load_split, read_json
from pipeline.params.config import CalibrateConfig
from pipeline.train.baselines import (
    LARGE,
    SMALL,
    TWO_CNN,
    BaselineConfig,
    BaselinesMeta,
    PlainCNN,
    plain_macs,
    plain_outputs,
    train_baseline,
)
from pipeline.train.config import epochs_note

SEED_OFFSETS = {SMALL: 101, LARGE: 102}  # each net's training seed: the run's seed plus this
EpochLog = Callable[[str, int, dict[str, Any]], None]  # (net, epoch, the epoch's record)


@dataclass(frozen=True)
class BaselinesResult:
    nets: dict[str, PlainCNN]  # SMALL, LARGE -> the trained net (on the CPU)
    record: BaselinesMeta  # what the model directory records (no timings: identical runs, identical bytes)
    metrics: dict[str, Any]  # the metrics file: each net's and the chain's figures, with training seconds
    note: str | None  # why the epochs were raised (small data), or None

    def run_metrics(self) -> dict[str, float]:
        return {f"{name}_{key}": v for name in (SMALL, LARGE, TWO_CNN) for key, v in self.metrics[name].items()}

    def lines(self) -> list[str]:
        out = [f"baselines: {name} (width {f['width']}, {f['macs']:,} MACs): calib accuracy "
               f"{f['calib_accuracy']:.4f}, trained in {f['train_seconds']} s"
               for name, f in ((n, self.metrics[n]) for n in (SMALL, LARGE))]
        f = self.metrics[TWO_CNN]
        return [*out, f"baselines: {TWO_CNN} (threshold {f['threshold']:.4f}): calib accuracy "
                      f"{f['calib_accuracy']:.4f} at {f['calib_mean_macs']:,.0f} MACs; "
                      f"{f['small_exit_share']:.1%} leave at the small net"]


def sized_config(cfg: BaselineConfig, train_images: int, graded: Path,
                 classes: int) -> tuple[BaselineConfig, str | None]:
    """``cfg`` with its epochs raised to its step floor on small data, and the note saying so (or None)."""
    hard = hard_setting_applies(cfg.min_steps_hard, graded, classes)
    sized = cfg.sized_to(train_images, hard)
    if sized.epochs == cfg.epochs:
        return sized, None
    return sized, epochs_note("baselines", cfg.epochs, sized.epochs, cfg.floor(hard), train_images, cfg.batch_size,
                              hard)


def _net_figures(net: PlainCNN, width: int, held_out: Split, norm: tuple, kind: str, image_shape: tuple,
                 seconds: float) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """One trained net read on the held-out images: its figures, confidences and right answers ((N,) each)."""
    logits, conf = plain_outputs(net, held_out.images, *norm, kind)  # (N, K), (N,)
    correct = (logits.argmax(dim=-1) == torch.from_numpy(held_out.labels)).numpy()
    figures = {"width": width, "macs": plain_macs(net, image_shape), "calib_accuracy": float(correct.mean()),
               "train_seconds": round(seconds, 1)}
    return figures, conf.numpy(), correct


def _chain(figures: dict, conf: dict, correct: dict, cal: CalibrateConfig) -> tuple[float, dict[str, Any]]:
    """The two nets chained (small first), its threshold fitted by the cascade's rule."""
    inputs = (conf[SMALL], correct[SMALL], correct[LARGE], figures[SMALL]["macs"], figures[LARGE]["macs"])
    threshold = two_cnn_threshold(*inputs, float(cal.delta), cal.grid, float(cal.bound_z))
    chain = two_cnn_result(*two_cnn_arrays(*inputs), threshold)
    return threshold, {"threshold": threshold, "calib_accuracy": chain["accuracy"],
                       "calib_mean_macs": chain["mean_macs"], "small_exit_share": chain["small_exit_share"]}


def train_baselines(data: Path, graded: Path, cfg: BaselineConfig, cal: CalibrateConfig, kind: str, seed: int,
                    compute: ComputeConfig, on_epoch: EpochLog | None = None) -> BaselinesResult:
    """Train both nets (seeds ``seed + SEED_OFFSETS``) on ``data``'s train split and calibrate their chain on
    the held-out images (``cal.held_out``, ``cal.delta``, ``cal.grid``, ``cal.bound_z``); ``kind``: how
    confidence is read. The nets come back on the CPU whatever ``compute`` trained them on."""
    classes = len(read_json(data / "meta.json")["classes"])
    train, held_out = load_split(data, "train"), load_held_out(data, cal.held_out)
    image_shape = tuple(int(v) for v in train.images.shape[1:])  # (C, H, W)
    cfg, note = sized_config(cfg, len(train), graded, classes)
    # Normalisation statistics of the training images, as the train stage computes them for module 1.
    pixels = train.images.astype(np.float32) / 255.0
    norm = tuple(tuple(stat(axis=(0, 2, 3)).round(4).tolist()) for stat in (pixels.mean, pixels.std))  # mean, std
    device = compute.resolve()  # training runs there; the nets come back on the CPU
    nets, figures, conf, correct = {}, {}, {}, {}
    for name, width in ((SMALL, cfg.small_width), (LARGE, cfg.large_width)):
        started = time.perf_counter()
        nets[name] = train_baseline(
            width, train.images, train.labels, *norm, classes, cfg, seed + SEED_OFFSETS[name],
            on_epoch=None if on_epoch is None else lambda e, r, _m, _p, name=name: on_epoch(name, e, r),
            device=device, precision=compute.precision)
        figures[name], conf[name], correct[name] = _net_figures(nets[name], width, held_out, norm, kind,
                                                                image_shape, time.perf_counter() - started)
    threshold, figures[TWO_CNN] = _chain(figures, conf, correct, cal)
    metrics = {**figures, "calib_images": len(held_out), "train_images": len(train), "epochs": cfg.epochs,
               "delta": cal.delta, "grid": cal.grid, "confidence": kind}
    calib_record = {key: ({k: v for k, v in metrics[key].items() if k != "train_seconds"}
                          if isinstance(metrics[key], dict) else metrics[key])
                    for key in (SMALL, LARGE, TWO_CNN, "calib_images", "delta", "grid")}
    record = BaselinesMeta(cfg.small_width, cfg.large_width, image_shape[0], classes, image_shape, *norm,
                           figures[SMALL]["macs"], figures[LARGE]["macs"], threshold, kind, calib=calib_record)
    return BaselinesResult(nets, record, metrics, note)
