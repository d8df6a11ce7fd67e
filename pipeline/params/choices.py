"""The leaf of the config layer: the error a bad parameter raises and the allowed values that
:mod:`pipeline.params.config`, :mod:`pipeline.params.schema`, :mod:`pipeline.device` and the library check against.
It imports nothing from ``pipeline``, so those three depend on it and not on each other."""

from __future__ import annotations

# The allowed values of the params' enumerations, written once: the schema checks against them and the
# library modules that act on them import them from here (this module imports nothing heavy).
CURRICULA = ("weighted", "cumulative", "exclusive", "all")
SCHEDULES = ("cosine", "step", "constant")  # train.schedule (pipeline.train.config.learning_rate)
SAMPLERS = ("uniform", "probmodel")  # train.sampler
UTILITIES = ("rank", "elite", "softmax")  # train.utility (pipeline.search.probmodel)
PICKS = ("entropy", "greedy", "plain")  # train.pick (pipeline.search.picks)
CONFIDENCES = ("maxprob", "margin")  # model.confidence (pipeline.models.modules.confidence)
REFERENCES = ("last", "best")  # calibrate.reference (pipeline.routing.calibration)
SELECT_MODES = ("predictor", "testset")  # select.mode: a predictor per image, or the static choice
SELECT_SCORINGS = ("label", "p_right")  # select.scoring (pipeline.routing.predictor)
CALIBRATE_MODES = ("delta", "budget")  # calibrate.mode
SCORERS = ("pca-logreg", "knn")
PRECISIONS = ("fp32", "bf16")  # compute.precision (pipeline.device.autocast)
DEVICE_PATTERN = r"auto|cpu|cuda|cuda:\d+"  # compute.device (pipeline.device.resolve_device)


class ConfigError(ValueError):
    """A bad parameter; the message names its key."""
