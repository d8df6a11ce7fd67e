"""Tiny on-disk inputs for the stage workflows (pipeline.workflows): an ingest-like data
directory (3 classes of 8x8 grey images, no test split unless asked, so a workflow that must not read
test cannot), the routing tests' three trained modules and their cost model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.io import Split, save_split, write_json
from pipeline.models.cascade import feature_shapes
from tests.routing.test_assemble import SPEC, costs, write_models

CLASSES = ("a", "b", "c")


def split(name: str, n: int, seed: int) -> Split:
    """Images whose class is the bright row band: learnable, cheap."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % len(CLASSES)
    images = rng.integers(0, 60, (n, 1, 8, 8)).astype(np.uint8)
    for i, y in enumerate(labels):
        images[i, 0, 3 * y:3 * y + 2] += 180
    return Split(name, images, labels.astype(np.int64), np.array([f"{name}{i}" for i in range(n)]))


def write_data(root: Path, sizes: dict[str, int] | None = None) -> Path:
    sizes = sizes or {"train": 48, "route": 24, "calib": 24}
    root.mkdir(parents=True)
    for seed, (name, n) in enumerate(sizes.items()):
        save_split(root / f"{name}.npz", split(name, n, seed))
    write_json(root / "meta.json", {"classes": list(CLASSES), "image_shape": [1, 8, 8],
                                    "splits": {name: {"count": n} for name, n in sizes.items()}})
    return root


def write_modules(root: Path) -> tuple[Path, Path]:
    """models/m1..m3 (the routing tests' cascade) and its cost model JSON."""
    models = write_models(root / "models")
    profile = root / "profile.json"
    table = costs().table
    for m, shape in zip(table["modules"], feature_shapes(SPEC), strict=False):  # one more: the last output
        m["input_shape"] = list(shape)  # what profile records and the train stage reads
    write_json(profile, table)
    return models, profile
