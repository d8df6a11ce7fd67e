"""PNG plots (matplotlib, no display). Each function writes one file atomically."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from pipeline.io import atomic_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def score_histogram(path: str | os.PathLike[str], scores: np.ndarray, levels: np.ndarray, bins: int = 50) -> None:
    """Difficulty score histogram, one colour per level."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    edges = np.linspace(0.0, 1.0, bins + 1)
    for level in np.unique(levels):
        ax.hist(scores[levels == level], bins=edges, alpha=0.75, label=f"level {level}")
    ax.set_yscale("log")
    ax.set_xlabel("difficulty score = 1 - out-of-fold p(true class)")
    ax.set_ylabel("training images (log)")
    ax.set_title("Difficulty score by level")
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def level_examples(path: str | os.PathLike[str], images: np.ndarray, labels: np.ndarray, levels: np.ndarray,
                   classes: Sequence[str], per_level: int = 12, seed: int = 0) -> None:
    """A grid of example images per level (rows), titled with their class, to eyeball a split."""
    plt = _pyplot()
    rng = np.random.default_rng(seed)
    level_values = np.unique(levels)
    fig, axes = plt.subplots(len(level_values), per_level, figsize=(per_level * 0.9, len(level_values) * 1.1 + 0.3),
                             squeeze=False)
    for row, level in enumerate(level_values):
        members = np.flatnonzero(levels == level)
        chosen = rng.choice(members, size=min(per_level, len(members)), replace=False)
        for col in range(per_level):
            ax = axes[row, col]
            ax.axis("off")
            if col >= len(chosen):
                continue
            image = images[chosen[col]]  # (C, H, W)
            ax.imshow(image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0), cmap="gray")
            ax.set_title(str(classes[labels[chosen[col]]])[:10], fontsize=6)
        axes[row, 0].text(-0.3, 0.5, f"L{level}", transform=axes[row, 0].transAxes, ha="right", va="center")
    fig.suptitle("Example training images per difficulty level (L1 easiest)", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
