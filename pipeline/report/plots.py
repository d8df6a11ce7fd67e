"""PNG plots (matplotlib, no display). Each function writes one file atomically."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence

import numpy as np

from pipeline.io import atomic_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str | os.PathLike[str]) -> None:
    """Write the figure as PNG atomically and free it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


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
    _save(plt, fig, path)


def wrapped_label(name: str, width: int = 10) -> str:
    """A class name on lines of at most ``width`` characters (whole words where they fit), so a narrow
    title shows all of it: ``"lucky seven"`` -> ``"lucky\\nseven"``."""
    return "\n".join(textwrap.wrap(name, width)) or name


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
            ax.set_title(wrapped_label(str(classes[labels[chosen[col]]])), fontsize=6)
        axes[row, 0].text(-0.3, 0.5, f"L{level}", transform=axes[row, 0].transAxes, ha="right", va="center")
    fig.suptitle("Example training images per difficulty level (L1 easiest)", fontsize=9)
    fig.tight_layout()
    _save(plt, fig, path)


def pareto_plot(path: str | os.PathLike[str], rows: Sequence[dict], front: Sequence[dict], target: dict,
                title: str) -> None:
    """Accuracy vs MACs of evaluated candidates, with the Pareto front and the target marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([r["macs"] / 1e6 for r in rows], [r["acc"] for r in rows], s=18, alpha=0.6, label="candidates")
    ax.plot([r["macs"] / 1e6 for r in front], [r["acc"] for r in front], "o-", color="C3", label="Pareto set")
    ax.scatter([target["macs"] / 1e6], [target["acc"]], marker="*", s=160, color="C2", label="target (best perf)",
               zorder=3)
    ax.set_xlabel("MACs per image (millions)")
    ax.set_ylabel("exit accuracy")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    _save(plt, fig, path)


def search_curves(path: str | os.PathLike[str], table, title: str) -> None:
    """Entropy of P and mutual information between successive P per training iteration."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    axes[0].plot(table["iteration"], table["entropy"])
    axes[0].set_ylabel("entropy of P (nats)")
    axes[1].plot(table["iteration"], table["mi"], lw=0.6)
    axes[1].set_ylabel("MI(P(i-1), P(i))")
    for ax in axes:
        ax.set_xlabel("iteration")
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, path)


def budget_plot(path: str | os.PathLike[str], curves: dict[str, Sequence[dict]], points: dict[str, dict]) -> None:
    """Accuracy vs average MACs: budget curves (thresholds fitted on calib per budget, read on test) and
    single operating points."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rows in curves.items():
        ax.plot([r["mean_macs"] / 1e6 for r in rows], [r["accuracy"] for r in rows], ".-", label=name, alpha=0.8)
    for i, (name, pt) in enumerate(points.items()):
        ax.scatter([pt["mean_macs"] / 1e6], [pt["accuracy"]], s=70, marker="osD^*"[i % 5], label=name, zorder=3)
    ax.set_xlabel("average MACs per image (millions)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Budget curve")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(plt, fig, path)


def anytime_plot(path: str | os.PathLike[str], exits: Sequence[dict]) -> None:
    """Accuracy of each exit alone, against the MACs needed to reach it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([e["mean_macs"] / 1e6 for e in exits], [e["accuracy"] for e in exits], "o-")
    for e in exits:
        ax.annotate(f"exit {e['exit']}", (e["mean_macs"] / 1e6, e["accuracy"]), textcoords="offset points",
                    xytext=(4, -10), fontsize=8)
    ax.set_xlabel("MACs to reach the exit (millions)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Anytime curve: accuracy per exit")
    fig.tight_layout()
    _save(plt, fig, path)


def confusion_plot(path: str | os.PathLike[str], confusion: np.ndarray, classes: Sequence[str]) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 6))
    shares = confusion / np.maximum(confusion.sum(1, keepdims=True), 1)
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(classes)), [str(c)[:12] for c in classes], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(classes)), [str(c)[:12] for c in classes], fontsize=8)
    for i in range(len(classes)):
        for j in range(len(classes)):
            if confusion[i, j]:
                ax.text(j, i, str(confusion[i, j]), ha="center", va="center", fontsize=6,
                        color="white" if shares[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("Confusion matrix (test)")
    fig.tight_layout()
    _save(plt, fig, path)
