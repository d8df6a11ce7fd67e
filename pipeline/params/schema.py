"""The declarative schema of ``params.yaml`` and :func:`check_params`, the one check of the whole
file and of every section a typed config reads (:func:`settings`, :func:`section_problems`): each key,
its type and range, unknown keys (with a "did you mean"), cross-key rules, every problem at once.
Stages run it first (``stages.common.params_of``), ``make repro`` before ``dvc repro``.

To add a key, add one line to its section's dict below (``DATA``, ``TRAIN``, ...), e.g.
``"utility": Str(choices=("perf", "acc"), default="perf", doc="...")``; ``required=True`` only for keys
the code reads without a default. A ``TRAIN`` key is allowed in ``modules.mK.train`` too. A rule across
keys goes into the section's ``rules`` (a function of its valid values yielding ``(key, message)``); a
new section is a new entry in ``SCHEMA``. The ``modules`` section's keys and check are in
:mod:`pipeline.params.modules_schema`. Enumerations the library also defines are tested equal to it
(tests/params/test_schema.py). Types are strict: ``Int`` takes an int only (not a bool, ``"3"`` or
``2.5``), ``Number`` an int or finite float, ``Bool`` ``true``/``false`` (key types:
:mod:`pipeline.params.keys`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from pipeline.params.choices import (  # noqa: F401 (re-exported for the library's checks)
    CALIBRATE_MODES,
    CONFIDENCES,
    CURRICULA,
    DEVICE_PATTERN,
    PICKS,
    PRECISIONS,
    REFERENCES,
    SAMPLERS,
    SCHEDULES,
    SCORERS,
    SELECT_MODES,
    SELECT_SCORINGS,
    UTILITIES,
)
from pipeline.params.keys import (
    Bool,
    Custom,
    Fraction,
    Int,
    Key,
    List,
    Number,
    ParamsError,
    Section,
    Str,
    check_section,
    unknown_keys,
    valid_values,
    value_problem,
)
from pipeline.params.modules_schema import (  # noqa: F401 (KINDS, HEADS, OPS, MODULE_SPEC, module_after: re-exported)
    HEADS,
    KINDS,
    MODULE_SPEC,
    OPS,
    check_modules,
    module_after,
)

# A mirror of pipeline.io.HELD_OUT (io is a room of this layer, so neither imports the other); a test keeps them equal.
HELD_OUT = ("pooled", "calib")  # pipeline.io.HELD_OUT
SOURCE_PATTERN = r"fashion-mnist(:.+)?|idx:.+|imagefolder:.+|digits"  # pipeline.data.sources.load_source

# ------------------------------------------------------------------------------------------ the schema

DATA = {
    "source": Str(required=True, pattern=SOURCE_PATTERN,
                  pattern_doc="fashion-mnist, fashion-mnist:<dir>, idx:<dir>, imagefolder:<dir> or digits"),
    "image_size": Int(required=True, ge=4, le=512, auto=True,
                      doc="auto: the images' median shorter side, at most 64 (pipeline.data.input_shape)"),
    "channels": Int(choices=(1, 3), default="auto", auto=True, doc="auto: 3 if the images carry colour, else 1"),
    "val_fraction": Fraction(required=True),
    "route_fraction": Fraction(default=0.5),
    "test_fraction": Fraction(default=0.2),
    "max_train": Int(nullable=True, ge=20, default=None),
    "max_test": Int(nullable=True, ge=20, default=None),
    "max_pixels": Int(ge=1, default=16777216, doc="largest image (pixels) the decoder opens"),
}

VALIDATE = {
    "class_share_tolerance": Number(required=True, ge=0, le=1),
    "pixel_mean_min": Number(ge=0, le=255, default=1.0),
    "pixel_mean_max": Number(ge=0, le=255, default=254.0),
    "min_pixel_std": Number(ge=0, default=1.0),
    "max_duplicate_share": Number(ge=0, le=1, default=0.01),
}


def _validate_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if "pixel_mean_min" in v and "pixel_mean_max" in v and v["pixel_mean_min"] > v["pixel_mean_max"]:
        yield "pixel_mean_min", (f"must be <= pixel_mean_max ({v['pixel_mean_max']!r}), "
                                 f"got {v['pixel_mean_min']!r}")


GRADE = {
    "scorer": Str(choices=SCORERS, default="pca-logreg"),
    "pca_components": Int(ge=1, default=50),
    "folds": Int(ge=2, le=20, default=5),
    "levels": Int(required=True, ge=1, le=20),
    "curriculum": Str(choices=CURRICULA, default="weighted"),
    "level_weight": Int(ge=1, le=10, default=2),
    "max_iter": Int(ge=1, default=200),
    "knn_neighbors": Int(ge=1, default=10),
}

TRACKING = {"experiment": Str(default="cascade")}

MODEL = {"confidence": Str(choices=CONFIDENCES, default="maxprob")}

PROFILE = {
    "repeats": Int(ge=1, default=10),
    "batch_sizes": List(Int(ge=1), unique=True, min_items=1, default=[1, 64]),
}


def _profile_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if "batch_sizes" in v and 1 not in v["batch_sizes"]:
        yield "batch_sizes", f"must include 1, got {v['batch_sizes']!r}"


# Where torch runs (pipeline.device.ComputeConfig).
COMPUTE = {
    "device": Str(default="auto", pattern=DEVICE_PATTERN,
                  pattern_doc="auto, cpu, cuda or cuda:N (N an int >= 0)"),
    "precision": Str(choices=PRECISIONS, default="fp32",
                     doc="bf16: autocast on CUDA or on a CPU with native bf16 (AVX512-BF16, AMX)"),
}


# The common training settings (pipeline.train.config.TrainConfig); modules.mK.train overrides any of them.
TRAIN = {
    "epochs": Int(required=True, ge=1),
    "min_steps": Int(ge=0, default=0, doc="epochs raised to at least this many optimiser steps (small data)"),
    "min_steps_hard": Int(ge=0, default=0, doc="the step floor instead where grade found the data hard"),
    "batch_size": Int(required=True, ge=1, le=65536),  # beyond this a batch no longer fits in memory
    "lr": Number(required=True, gt=0),
    "momentum": Number(ge=0, lt=1, default=0.9),
    "weight_decay": Number(ge=0, default=5e-4),
    "schedule": Str(choices=SCHEDULES, default="cosine"),
    "warmup_epochs": Number(ge=0, default=0.2),
    "crop_padding": Int(ge=0, default=2),
    "flip": Bool(default=True),
    "erase": Number(ge=0, le=1, default=0.0, doc="random erasing: probability per training image"),
    "lam": Number(ge=0, default=0.5),
    "mu": Number(ge=0, default=0.2),
    "seed": Int(ge=0, default=0, doc="default: the top-level seed"),
    "label_smoothing": Number(ge=0, lt=1, default=0.0),
    "sampler": Str(choices=SAMPLERS, default="probmodel"),
    "m": Int(ge=1, default=4),
    "pick": Str(choices=PICKS, default="entropy"),
    "pool_factor": Int(ge=1, default=8),
    "temperature": Number(gt=0, default=0.1),
    "smoothing": Number(ge=0, default=0.005),
    "step": Number(gt=0, le=1, default=0.1),
    "beta": Number(ge=0, default=0.01),
    "mi_eps": Number(gt=0, default=1e-3),
    "lambda_c": Number(ge=0, default=0.1),
    "sandwich": Bool(default=True),
    "distill": Number(ge=0, default=0.0),
    "utility": Str(choices=UTILITIES, default="rank"),
    "paired_perf": Bool(default=True),
    "kd": Number(ge=0, default=0.0,
                 doc="distillation from the plain CNN more accurate on calib (needs train's --teacher)"),
    "kd_temperature": Number(gt=0, default=2.0),
    "grad_clip": Number(ge=0, default=0.0, doc="clip the gradients' global norm to this (0: off)"),
    "processes": Int(ge=1, default=1),
}


def _train_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if "warmup_epochs" in v and "epochs" in v and not v["warmup_epochs"] < v["epochs"]:
        yield "warmup_epochs", f"must be < epochs ({v['epochs']}), got {v['warmup_epochs']!r}"
    if "m" in v and "batch_size" in v and v["m"] > v["batch_size"]:
        yield "m", f"must be <= batch_size ({v['batch_size']}), got {v['m']!r}"
    if v.get("distill", 0) and v.get("sandwich") is not True:
        yield "distill", (f"must be 0 unless sandwich is true (the largest path is the teacher), "
                          f"got {v['distill']!r}")


SEARCH = {
    "samples": Int(ge=1, default=16),
    "pareto_max": Int(ge=1, default=3),
    "spread": Int(ge=0, default=0),  # 0, or >= 2: extra subnets across the whole cost range for the front
}

SELECT = {
    "mode": Str(choices=SELECT_MODES, default="predictor"),
    "delta": Number(ge=0, lt=1, default=0.003),
    "hidden": Int(ge=1, default=16),
    "epochs": Int(ge=1, default=30),
    "balanced": Bool(default=False),
    "fallback_tolerance": Number(ge=0, le=1, default=0.0),
    "max_macs_share": Number(gt=0, le=1, default=0.05),
    "scoring": Str(choices=SELECT_SCORINGS, default="label",
                   doc="label: the cheapest right candidate; p_right: each candidate's chance, cost-priced"),
    "pool": Int(ge=1, default=1, doc="the predictor pools its input to pool x pool before its MLP"),
}

CALIBRATE = {  # in this order in every cascade manifest's params.calibrate (pipeline.routing.package)
    "mode": Str(choices=CALIBRATE_MODES, default="delta"),
    "delta": Number(ge=0, lt=1, default=0.003),
    "budget_macs": Number(nullable=True, gt=0, default=None),
    "grid": Int(ge=1, default=50),
    "reference": Str(choices=REFERENCES, default="best"),
    "ensemble_decays": List(Number(ge=0, le=1), unique=True, min_items=1, default=[0.0, 0.25, 0.5, 1.0]),
    "bound_z": Number(ge=0, le=5, default=1.0,
                      doc="delta mode: the loss bound is its estimate + bound_z standard errors (0: the estimate)"),
    "held_out": Str(choices=HELD_OUT, default="pooled",
                    doc="what thresholds are fitted on: pooled (route + calib) or calib"),
    "min_reach": Number(ge=0, lt=1, default=0.06,
                        doc="thresholds send at least this share of the held-out images to every module"),
}


def _search_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if v.get("spread") == 1:
        yield "spread", "must be 0 or at least 2 (the cheapest and the largest path)"


def _calibrate_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if v.get("mode") == "budget" and v.get("budget_macs") is None:
        yield "budget_macs", "is required (a number > 0) when calibrate.mode is budget"


REGISTER = {
    "model_name": Str(required=True, pattern=r"[\w.-]+", pattern_doc="letters, digits, '_', '.' or '-'"),
    "acc_tolerance": Number(required=True, ge=0, le=1),
    "macs_tolerance": Number(required=True, ge=0),
}

# The baselines' recipe: the modules' training keys (TRAIN), with defaults where TRAIN requires a value.
_BASELINE_RECIPE = ("epochs", "min_steps", "min_steps_hard", "batch_size", "lr", "momentum", "weight_decay",
                    "schedule", "warmup_epochs", "crop_padding", "flip", "label_smoothing", "grad_clip")
_BASELINE_DEFAULTS = {"epochs": 12, "batch_size": 128, "lr": 0.1}

BASELINES = {
    "small_width": Int(ge=1, default=8),
    "large_width": Int(ge=1, default=24),
    **{key: replace(TRAIN[key], required=False, default=_BASELINE_DEFAULTS.get(key, TRAIN[key].default))
       for key in _BASELINE_RECIPE},
}


def _baselines_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if "small_width" in v and "large_width" in v and v["large_width"] < v["small_width"]:
        yield "large_width", f"must be >= small_width ({v['small_width']}), got {v['large_width']!r}"
    if "warmup_epochs" in v and "epochs" in v and not v["warmup_epochs"] < v["epochs"]:
        yield "warmup_epochs", f"must be < epochs ({v['epochs']}), got {v['warmup_epochs']!r}"


def _check_modules(value: Any, key: str, params: Mapping[str, Any], partial: bool = False) -> list[str]:
    grade = params.get("grade")
    levels = valid_values(grade, GRADE).get("levels") if isinstance(grade, Mapping) else None
    return check_modules(value, key, params, train_keys=TRAIN, train_rules=_train_rules, levels=levels,
                         partial=partial)


SCHEMA: dict[str, Key | Section | Custom] = {
    "seed": Int(ge=0, default=0),
    "data": Section(DATA),
    "validate": Section(VALIDATE, rules=(_validate_rules,)),
    "grade": Section(GRADE),
    "tracking": Section(TRACKING, required=False),
    "model": Section(MODEL, required=False),
    "modules": Custom(_check_modules),
    "profile": Section(PROFILE, required=False, rules=(_profile_rules,)),
    "compute": Section(COMPUTE, required=False),  # bf16 is checked against the device at run time
    "train": Section(TRAIN),  # its cross-key rules run per module on the merged config (_check_modules)
    "search": Section(SEARCH, rules=(_search_rules,)),
    "select": Section(SELECT),
    "calibrate": Section(CALIBRATE, rules=(_calibrate_rules,)),
    "register": Section(REGISTER),
    "baselines": Section(BASELINES, required=False, rules=(_baselines_rules,)),
}

def params_problems(params: Any, *, partial: bool = False) -> list[str]:
    """Every problem of ``params`` as one message each, naming the dotted key and the bad value.

    ``partial``: a missing section that is required is not a problem (the stage that reads it says so);
    what is present is checked in full."""
    if not isinstance(params, Mapping):
        return [f"the params file must hold a mapping at the top level, got {params!r}"]
    problems = unknown_keys(params, SCHEMA, "")
    for name, schema in SCHEMA.items():
        if name not in params:
            if not partial and schema.required:
                problems.append(f"{name} is missing (a required section)")
            continue
        value = params[name]
        if isinstance(schema, Key):
            problem = value_problem(schema, value)
            if problem:
                problems.append(f"{name} {problem}")
        elif isinstance(schema, Section):
            if value is None and not schema.required:
                continue
            problems += check_section(value, schema, name)
        else:
            problems += schema.check(value, name, params, partial=partial)
    return list(dict.fromkeys(problems))  # one message per problem, in order


def check_params(params: Any, *, partial: bool = False, source: str = "params") -> None:
    """Raise :class:`ParamsError` (a :class:`~pipeline.params.config.ConfigError`) listing every problem."""
    problems = params_problems(params, partial=partial)
    if problems:
        raise ParamsError(problems, source)
