"""Answering with a loaded cascade (:func:`pipeline.routing.package.load_cascade`): images normalised as
in training (:func:`preprocess`), one row per image (class, confidence, exit, the path each module ran,
MACs: :func:`recognize_arrays`), and image files decoded, answered or named in an error entry
(:func:`recognize_files`, :func:`collect_image_paths`). The CLI, the pyfunc model and the REST server
all answer through these."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.data.sources import DEFAULT_MAX_PIXELS, IMAGE_SUFFIXES, DataError, decode_image_file
from pipeline.routing.engine import run_cascade
from pipeline.routing.package import CascadeMeta, LoadedCascade

NOT_REACHED = "-"
FIXED_PATH = "fixed"  # what a row names a fixed module's path (its Arch key is empty)


def preprocess(images_uint8: np.ndarray, meta: CascadeMeta) -> torch.Tensor:
    """uint8 (N, C, H, W) -> float32 (N, C, H, W), normalised exactly as in training."""
    images = np.asarray(images_uint8)
    if images.dtype != np.uint8 or images.ndim != 4 or tuple(images.shape[1:]) != meta.image_shape:
        raise ValueError(
            f"images must be uint8 (N, {', '.join(map(str, meta.image_shape))}), "
            f"got {images.dtype} {images.shape}"
        )
    x = torch.from_numpy(np.ascontiguousarray(images)).float() / 255.0  # (N, C, H, W)
    mean = torch.tensor(meta.mean, dtype=torch.float32).view(1, -1, 1, 1)  # (1, C, 1, 1)
    std = torch.tensor(meta.std, dtype=torch.float32).view(1, -1, 1, 1)  # (1, C, 1, 1)
    return (x - mean) / std


def _device_of(loaded: LoadedCascade) -> torch.device:
    param = next(loaded.stages[0].module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def recognize_arrays(
    loaded: LoadedCascade, images_uint8: np.ndarray, batch_size: int = 256,
    thresholds: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """One row per image: class, confidence, 1-based exit, chosen subnet per module (``fixed`` for a fixed
    module, ``-`` where the image left earlier), MACs spent. ``thresholds``: an operating point's, for
    this call (default: the stages' own)."""
    x = preprocess(images_uint8, loaded.meta).to(_device_of(loaded))
    out = run_cascade(loaded.stages, x, confidence_kind=loaded.meta.confidence_kind, batch_size=batch_size,
                      ensemble_decay=loaded.meta.ensemble_decay, thresholds=thresholds)
    keys = [[arch.key() or FIXED_PATH for arch in stage.candidates] for stage in loaded.stages]
    rows = []
    columns = (out.pred, out.conf, out.exit_index, out.choices, out.macs)
    for pred, conf, exit_k, choices, macs in zip(*(t.tolist() for t in columns), strict=True):
        rows.append({
            "class_index": int(pred),
            "class_name": loaded.meta.classes[pred],
            "confidence": float(conf),
            "exit": int(exit_k) + 1,
            "subnets": [NOT_REACHED if c < 0 else keys[k][c] for k, c in enumerate(choices)],
            "macs": int(macs),
        })
    return rows


def recognize_files(
    loaded: LoadedCascade, paths: Iterable[str | os.PathLike[str]], batch_size: int = 256, *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Rows (with ``path``) for the files that decode; ``{"path", "error"}`` for those that do not.

    One bad file never stops the others: any bit depth or mode is converted, and a file that is
    missing, empty, corrupt, not a PNG/JPEG or over ``max_pixels`` (width x height, read from its
    header before decoding) becomes an error entry. Files are decoded and run ``batch_size`` at a
    time, so a large folder needs bounded memory.
    """
    c, h, w = loaded.meta.image_shape
    if h != w:
        raise ValueError(f"recognize_files needs square model input, the model takes {h}x{w}")
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    pending: list[tuple[str, np.ndarray]] = []

    def flush() -> None:
        if pending:
            batch = np.stack([image for _, image in pending])  # (n, C, H, W)
            for (name, _), row in zip(pending, recognize_arrays(loaded, batch, batch_size), strict=True):
                rows.append({"path": name, **row})
            pending.clear()

    for path in paths:
        try:
            pending.append((str(path), decode_image_file(path, c, h, max_pixels=max_pixels)))
        except (DataError, OSError) as exc:
            errors.append({"path": str(path), "error": str(exc)})
        if len(pending) >= batch_size:
            flush()
    flush()
    return rows, errors


def collect_image_paths(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[dict[str, str]]]:
    """Files as given, folders expanded (recursively, sorted) to their PNG/JPEG files.

    A named file is kept whatever its suffix (decoding will say if it is not an image); a missing
    path or a folder without images becomes an error entry, like an undecodable file.
    """
    files: list[Path] = []
    errors: list[dict[str, str]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                errors.append({"path": str(path), "error": "folder holds no PNG/JPEG images"})
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            errors.append({"path": str(path), "error": "no such file or folder"})
    return files, errors
