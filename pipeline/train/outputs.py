"""What the ``train`` stage writes and logs for a trained module: its deterministic outputs (no timings:
identical runs write identical files), the exit's accuracy on the calib split on the module's path, and
the metrics (timings included: the metrics file and MLflow only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.io import Split, write_json
from pipeline.models.profile import CostModel
from pipeline.models.store import ModuleInfo, save_module
from pipeline.search.space import Arch
from pipeline.train.config import TrainConfig
from pipeline.train.loop import TrainResult, history_frame_records
from pipeline.train.paths import evaluate_path
from pipeline.train.prefix import Prefix

ITERATION_KEYS = ("entropy", "mi", "best_perf", "mean_perf")  # method B's per-iteration figures MLflow gets


def epochs_trained(out: Path) -> int:
    """How many epochs the module in ``out`` (a train stage's output directory) trained: the rows of its
    ``history.csv``, one per epoch (``min_steps`` may have raised the configured epochs)."""
    with open(out / "history.csv") as fh:
        return sum(1 for line in fh if line.strip()) - 1


def write_train_outputs(out: Path, module: torch.nn.Module, info: ModuleInfo, result: TrainResult) -> None:
    """The stage's deterministic outputs: module, ``history.csv`` (timings dropped),
    ``iterations.csv`` (method B), ``prob_model.json``."""
    save_module(out, module, info)
    pd.DataFrame(history_frame_records(result.history)).to_csv(out / "history.csv", index=False)
    if result.iterations:
        pd.DataFrame(result.iterations).to_csv(out / "iterations.csv", index=False)
    if result.prob_model is not None:
        write_json(out / "prob_model.json", result.prob_model.as_dict())


def epoch_line(name: str, epochs: int, epoch: int, record: dict[str, Any]) -> str:
    """The line the stage prints after each epoch."""
    return (f"train@{name} epoch {epoch}/{epochs}: loss {record['loss']:.4f} acc {record['train_acc']:.4f}"
            f" {record['images_per_s']:.0f} img/s")


def done_line(name: str, metrics: dict[str, Any]) -> str:
    """The line the stage prints when it is done (from its metrics)."""
    return (f"train@{name}: calib exit accuracy {metrics['calib_exit_acc']:.4f} on path "
            f"{metrics['calib_path'] or '(fixed)'} ({metrics['path_macs']:,} MACs), "
            f"{metrics['images_per_s']} img/s")


def iteration_log(iterations: list[dict[str, Any]], most: int = 400) -> list[tuple[int, dict[str, float]]]:
    """Method B's per-iteration records thinned to about ``most`` (every n-th), as (iteration,
    ``iter_<key>`` metrics) for MLflow; non-finite values are left out."""
    return [(int(it["iteration"]),
             {f"iter_{key}": v for key, v in it.items() if key in ITERATION_KEYS and np.isfinite(v)})
            for it in iterations[:: max(1, len(iterations) // most)]]


def trained_path(module: torch.nn.Module, result: TrainResult) -> Arch:
    """The path the module is judged on: P(N)'s most likely one (method B), else the module's default."""
    return module.default_arch() if result.prob_model is None else result.prob_model.most_likely()


def calib_exit(module: torch.nn.Module, prefix: Prefix, images: np.ndarray, labels: np.ndarray,
               result: TrainResult) -> tuple[Arch, dict[str, float]]:
    """The trained path and its exit's accuracy, CE and confidence on the calib split."""
    arch = trained_path(module, result)
    return arch, evaluate_path(module, prefix, images, labels, arch, 512)


def train_metrics(module: torch.nn.Module, prefix: Prefix, calib: Split, info: ModuleInfo, cfg: TrainConfig,
                  result: TrainResult, costs: CostModel, train_images: int, seconds: float, epochs_ran: int,
                  processes: int, device: torch.device | str) -> dict[str, Any]:
    """The stage's metrics file: sizes, wall-clock figures (``epochs_ran``: the epochs this process
    trained, fewer after a resume), the trained path's exit on the calib split (:func:`calib_exit`),
    that path's cost and latency."""
    k = info.k
    arch, exit_eval = calib_exit(module, prefix, calib.images, calib.labels, result)
    return {
        "module": k, "kind": info.spec.kind, "train_images": train_images, "epochs": cfg.epochs,
        "seconds": round(seconds, 1),
        "images_per_s": round(train_images * epochs_ran / max(seconds, 1e-9), 1),
        "resumed_after_epoch": cfg.epochs - epochs_ran,
        "calib_exit_acc": exit_eval["acc"], "calib_exit_conf_mean": exit_eval["conf_mean"],
        "calib_path": arch.key(), "path_macs": costs.macs(k, arch),
        "path_latency_ms_b1": costs.latency_ms(k, arch, 1),
        "path_latency_ms_b64": costs.latency_ms(k, arch, 64),
        "final_train_acc": result.history[-1]["train_acc"], "sampler": cfg.sampler,
        "processes": processes, "device": str(device), "kd": cfg.kd,
    }
