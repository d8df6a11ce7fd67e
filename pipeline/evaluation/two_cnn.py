"""The two plain-CNN baselines chained (the two-CNN cascade): the small net runs first; an image leaves
there when its confidence reaches the threshold, else it also runs the large net and pays both costs.
The threshold is calibrated by the cascade's own rule (``calibrate_delta``): least mean MACs with
accuracy at least that of always running the large net minus ``delta``. The nets themselves (training,
storage, outputs) are :mod:`pipeline.train.baselines`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pipeline.routing.calibration import BOUND_Z, GRID, calibrate_delta, simulate_thresholds
from pipeline.train.baselines import LARGE, SMALL, TWO_CNN, Baselines, load_baselines, plain_outputs


def two_cnn_arrays(conf_small: Any, correct_small: Any, correct_large: Any, macs_small: float,
                   macs_large: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chain as the calibration's (N, 2) arrays: conf, correct, cumulative MACs.

    The second confidence column is never read (the last exit always answers): ones.
    """
    conf_small = np.asarray(conf_small)
    correct_small = np.asarray(correct_small, dtype=bool)
    correct_large = np.asarray(correct_large, dtype=bool)
    if conf_small.ndim != 1 or not conf_small.shape == correct_small.shape == correct_large.shape:
        raise ValueError(f"conf_small, correct_small and correct_large must share one shape (N,), got "
                         f"{conf_small.shape}, {correct_small.shape}, {correct_large.shape}")
    if not np.issubdtype(conf_small.dtype, np.floating):
        conf_small = conf_small.astype(np.float64)
    conf = np.stack([conf_small, np.ones_like(conf_small)], axis=1)  # (N, 2), conf_small's dtype
    correct = np.stack([correct_small, correct_large], axis=1)  # (N, 2)
    cum = np.empty(conf.shape, dtype=np.float64)  # (N, 2)
    cum[:, 0], cum[:, 1] = float(macs_small), float(macs_small) + float(macs_large)
    return conf, correct, cum


def two_cnn_threshold(conf_small: Any, correct_small: Any, correct_large: Any, macs_small: float,
                      macs_large: float, delta: float, grid: int | Sequence[Sequence[float]] = GRID,
                      z: float = BOUND_Z) -> float:
    """The small net's exit threshold by the cascade's rule: least mean MACs with the accuracy lost
    against always running the large net at most ``delta`` (bounded with ``z`` standard errors;
    ``NEVER`` = 1.01 if no early exit fits)."""
    thresholds, _ = calibrate_delta(*two_cnn_arrays(conf_small, correct_small, correct_large, macs_small,
                                                    macs_large), delta, grid, z=z,
                                    reference="last", min_reach=0.0)  # the large net is the reference
    return float(thresholds[0])


def two_cnn_result(conf: np.ndarray, correct: np.ndarray, cum: np.ndarray,
                   threshold: float) -> dict[str, float]:
    """Accuracy, mean MACs, threshold and share of images leaving at the small net, on (N, 2) arrays."""
    accuracy, mean_macs, counts = simulate_thresholds(conf, correct, cum, [threshold])
    return {"accuracy": float(accuracy), "mean_macs": float(mean_macs), "threshold": float(threshold),
            "small_exit_share": float(counts[0] / max(int(np.sum(counts)), 1))}


def _loaded(source: str | os.PathLike[str] | Baselines) -> Baselines:
    return source if isinstance(source, Baselines) else load_baselines(source)


def baseline_arrays(source: str | os.PathLike[str] | Baselines, images_uint8: np.ndarray,
                    labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both nets on a split, as the two-CNN chain's (N, 2) conf, correct and cumulative MACs."""
    b = _loaded(source)
    images_uint8 = np.asarray(images_uint8)
    if images_uint8.ndim != 4 or tuple(images_uint8.shape[1:]) != b.meta.image_shape:
        shape = ", ".join(map(str, b.meta.image_shape))
        raise ValueError(f"images must be (N, {shape}) as the baselines were trained on, "
                         f"got {images_uint8.shape}")
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))  # (N,)
    if y.shape != images_uint8.shape[:1]:
        raise ValueError(f"{len(images_uint8)} images but {len(y)} labels")
    logits_s, conf_s = plain_outputs(b.small, images_uint8, b.meta.mean, b.meta.std, b.meta.confidence_kind)
    logits_l, _ = plain_outputs(b.large, images_uint8, b.meta.mean, b.meta.std, b.meta.confidence_kind)
    correct_s = (logits_s.argmax(dim=-1) == y).numpy()  # (N,)
    correct_l = (logits_l.argmax(dim=-1) == y).numpy()  # (N,)
    return two_cnn_arrays(conf_s.numpy(), correct_s, correct_l, b.meta.macs_small, b.meta.macs_large)


def evaluate_baselines(source: str | os.PathLike[str] | Baselines, images_uint8: np.ndarray,
                       labels: np.ndarray) -> dict[str, dict[str, float]]:
    """Accuracy and mean MACs of each net and of the two chained (at the calibrated threshold)."""
    b = _loaded(source)
    return baseline_figures(b, baseline_arrays(b, images_uint8, labels))


def baseline_figures(b: Baselines, arrays: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[str, dict[str, float]]:
    """``evaluate_baselines`` from ``baseline_arrays``' (N, 2) conf, correct and cumulative MACs."""
    conf, correct, cum = arrays
    return {
        SMALL: {"accuracy": float(correct[:, 0].mean()), "mean_macs": float(b.meta.macs_small)},
        LARGE: {"accuracy": float(correct[:, 1].mean()), "mean_macs": float(b.meta.macs_large)},
        TWO_CNN: two_cnn_result(conf, correct, cum, b.meta.threshold),
    }
