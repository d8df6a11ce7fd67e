"""The leaf of the config layer: the error a bad parameter raises and the allowed values that
:mod:`pipeline.params.config`, :mod:`pipeline.params.schema` and :mod:`pipeline.device` all check against.
It imports nothing from ``pipeline``, so those three depend on it and not on each other."""

from __future__ import annotations

CURRICULA = ("weighted", "cumulative", "exclusive", "all")
SCORERS = ("pca-logreg", "knn")
PRECISIONS = ("fp32", "bf16")  # compute.precision (pipeline.device.autocast)
DEVICE_PATTERN = r"auto|cpu|cuda|cuda:\d+"  # compute.device (pipeline.device.resolve_device)


class ConfigError(ValueError):
    """A bad parameter; the message names its key."""
