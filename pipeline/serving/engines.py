"""The two engines a server can run the cascade on, behind one small interface.

``load_engine(model_dir, "torch" | "onnx")`` gives an :class:`Engine`: ``image_shape`` and ``classes``
(what requests are decoded to) and ``recognize(images_uint8, exits=True)`` -> one row per image
(class, confidence, exit, path per module, MACs). ``exits=False`` is the cascade's own static path:
every module runs on every image and the last one answers, which is what the early exit saves against.
The ONNX engine exports the model directory on first use into ``<model_dir>/../<name>.onnx`` unless an
exported directory is given (``cascade export --format onnx``).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pipeline.routing.operating_points import ACCURATE, OperatingPoint

ENGINES = ("torch", "onnx")
CASCADE_MANIFEST = "cascade.json"  # pipeline.routing.package.MANIFEST, named here without importing torch


class Engine(Protocol):
    image_shape: tuple[int, int, int]
    classes: tuple[str, ...]
    name: str
    points: tuple[OperatingPoint, ...]  # the model's operating points, accuracy-first first

    def recognize(self, images_uint8: np.ndarray, *, exits: bool = True,
                  thresholds: Sequence[float] | None = None) -> list[dict[str, Any]]: ...


def freeze_heap() -> int:
    """Move every object alive now (the imports, the loaded engine) out of the garbage collector's view;
    the number of objects frozen. A serving process holds about 220,000 of them after its imports, and a
    full collection walks them all: about 100 ms in which no request is answered, which read as p99 spikes
    under load (docs/DESIGN.md 'Serving'). Frozen objects are never collected, and nothing loaded at start
    is meant to be. Call it once a process has loaded what it serves, and before it forks (the children
    inherit the frozen heap, and their copy-on-write pages stay shared)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def served_points(recorded: Sequence[OperatingPoint], thresholds: Sequence[float]) -> tuple[OperatingPoint, ...]:
    """The points a server answers at: the model's recorded curve, or for a model calibrated before points
    were recorded, its own thresholds alone as ``accurate`` (no held-out cost known)."""
    return tuple(recorded) or (OperatingPoint(ACCURATE, tuple(float(t) for t in thresholds)),)


@dataclass
class TorchEngine:
    """The cascade on PyTorch (:func:`pipeline.routing.recognize.recognize_arrays`)."""

    loaded: Any
    static: Any  # the same stages with no exit taken before the last
    name: str = "torch"

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.loaded.meta.image_shape)

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.loaded.meta.classes)

    @property
    def points(self) -> tuple[OperatingPoint, ...]:
        return served_points(self.loaded.meta.operating_points, [s.threshold for s in self.loaded.stages[:-1]])

    def recognize(self, images_uint8: np.ndarray, *, exits: bool = True,
                  thresholds: Sequence[float] | None = None) -> list[dict[str, Any]]:
        from pipeline.routing.recognize import recognize_arrays

        if not exits:
            return recognize_arrays(self.static, images_uint8)
        return recognize_arrays(self.loaded, images_uint8, thresholds=thresholds)


@dataclass
class OnnxEngine:
    """The cascade on ONNX Runtime (:class:`pipeline.serving.onnx_engine.OnnxCascade`)."""

    cascade: Any
    name: str = "onnx"

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.cascade.image_shape)

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.cascade.classes)

    @property
    def points(self) -> tuple[OperatingPoint, ...]:
        return served_points(self.cascade.points, [float(s.threshold) for s in self.cascade.stages[:-1]])

    def recognize(self, images_uint8: np.ndarray, *, exits: bool = True,
                  thresholds: Sequence[float] | None = None) -> list[dict[str, Any]]:
        return self.cascade.recognize(images_uint8, exits=exits, thresholds=thresholds)


def is_onnx_dir(path: str | os.PathLike[str]) -> bool:
    from pipeline.serving.onnx_export import FORMAT, MANIFEST

    manifest = Path(path) / MANIFEST
    return manifest.is_file() and f'"{FORMAT}"' in manifest.read_text()[:4096]


def model_image_shape(model: str | os.PathLike[str]) -> tuple[int, int, int]:
    """The input (C, H, W) a model directory (a cascade's or its ONNX export) is served at, read from its
    manifest alone (no weights, no torch): what the HTTP fronts decode requests to."""
    import json

    from pipeline.serving.onnx_format import MANIFEST

    model = Path(model)
    path = model / (MANIFEST if is_onnx_dir(model) else CASCADE_MANIFEST)
    try:
        shape = tuple(int(v) for v in json.loads(path.read_text())["meta"]["image_shape"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: no image shape in its meta ({type(exc).__name__}: {exc})") from None
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"{path}: the image shape must be (C, H, W), got {shape}")
    return shape


def load_engine(model: str | os.PathLike[str], kind: str = "torch", *, threads: int = 1,
                onnx_dir: str | os.PathLike[str] | None = None) -> Engine:
    """An engine over a cascade model directory (or, for ``onnx``, an exported ONNX directory).

    ``threads`` bounds the engine's intra-op threads (torch's for the process; ONNX Runtime's per
    session): a server gets its parallelism from batching, not from threads fighting over cores.
    """
    if kind not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {kind!r}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    model = Path(model)
    if kind == "onnx":
        from pipeline.serving.onnx_engine import OnnxCascade
        from pipeline.serving.onnx_export import export_model_dir

        if not is_onnx_dir(model):
            target = Path(onnx_dir) if onnx_dir is not None else model.parent / f"{model.name}.onnx"
            if not is_onnx_dir(target):
                export_model_dir(model, target)
            model = target
        return OnnxEngine(OnnxCascade(model, threads=threads))
    import torch

    from pipeline.routing.calibration import NEVER
    from pipeline.routing.package import LoadedCascade, load_cascade
    from pipeline.routing.packaging import with_thresholds

    if is_onnx_dir(model):
        raise ValueError(f"{model} is an ONNX export: serve it with --engine onnx")
    torch.set_num_threads(threads)
    loaded = load_cascade(model)
    never = [NEVER] * (len(loaded.stages) - 1)
    return TorchEngine(loaded, LoadedCascade(with_thresholds(loaded.stages, never), loaded.meta))
