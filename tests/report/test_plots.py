from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.report.plots import level_examples, wrapped_label


def test_a_long_class_name_is_wrapped_not_cut() -> None:
    assert wrapped_label("lucky seven") == "lucky\nseven"
    assert wrapped_label("Shirt") == "Shirt"
    assert wrapped_label("extraordinarily").replace("\n", "") == "extraordinarily"


def test_level_examples_writes_a_png(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (30, 1, 8, 8), dtype=np.uint8)
    labels, levels = rng.integers(0, 2, 30), np.repeat([1, 2, 3], 10)
    out = tmp_path / "examples.png"
    level_examples(out, images, labels, levels, ["lucky seven", "T-shirt/top"], per_level=4)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
