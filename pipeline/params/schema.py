"""The declarative schema of ``params.yaml`` and :func:`check_params`, the one check of the whole
file and of every section a typed config reads (:func:`settings`, :func:`section_problems`): each key,
its type and range, unknown keys (with a "did you mean"), cross-key rules, every problem at once.
Stages run it first (``stages.common.params_of``), ``make repro`` before ``dvc repro``.

To add a key, add one line to its section's dict below (``DATA``, ``TRAIN``, ...), e.g.
``"utility": Str(choices=("perf", "acc"), default="perf", doc="...")``; ``required=True`` only for keys
the code reads without a default. A ``TRAIN`` key is allowed in ``modules.mK.train`` too. A rule across
keys goes into the section's ``rules`` (a function of its valid values yielding ``(key, message)``); a
new section is a new entry in ``SCHEMA``. Enumerations the library also defines are tested equal to it
(tests/params/test_schema.py). Types are strict: ``Int`` takes an int only (not a bool, ``"3"`` or
``2.5``), ``Number`` an int or finite float, ``Bool`` ``true``/``false`` (key types:
:mod:`pipeline.params.keys`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from pipeline.params.choices import CURRICULA, DEVICE_PATTERN, PRECISIONS, SCORERS
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
    defaults_of,
    unknown_keys,
    valid_values,
    value_problem,
)

# Mirrors of library enumerations (importing them would import torch); tests keep them equal.
KINDS = ("fixed", "supernet")  # pipeline.models.modules.KINDS
HEADS = ("pool_mlp", "gap")  # pipeline.models.modules.HEADS
# pipeline.models.ops.OPS
OPS = ("conv3", "conv5", "dw3", "dw5", "ir3_e3", "ir3_e6", "ir5_e3", "ir5_e6", "skip")
SCHEDULES = ("cosine", "step", "constant")  # pipeline.train.config.SCHEDULES
SAMPLERS = ("uniform", "probmodel")  # pipeline.train.config.SAMPLERS
UTILITIES = ("rank", "elite", "softmax")  # pipeline.search.probmodel.UTILITIES
PICKS = ("entropy", "greedy", "plain")  # pipeline.search.picks.PICKS
CONFIDENCES = ("maxprob", "margin")  # pipeline.models.modules.CONFIDENCE_KINDS
REFERENCES = ("last", "best")  # pipeline.routing.calibration.REFERENCES
SELECT_MODES = ("predictor", "testset")  # stages.select.MODES
SELECT_SCORINGS = ("label", "p_right")  # pipeline.routing.predictor.SCORINGS
CALIBRATE_MODES = ("delta", "budget")
HELD_OUT = ("pooled", "calib")  # pipeline.io.HELD_OUT
SOURCE_PATTERN = r"fashion-mnist(:.+)?|idx:.+|imagefolder:.+|digits"  # pipeline.data.sources.load_source

# ------------------------------------------------------------------------------------------ the schema

DATA = {
    "source": Str(required=True, pattern=SOURCE_PATTERN,
                  pattern_doc="fashion-mnist, fashion-mnist:<dir>, idx:<dir>, imagefolder:<dir> or digits"),
    "image_size": Int(required=True, ge=4, le=512, auto=True,
                      doc="auto: the images' median shorter side, at most 64 (pipeline.data.input_shape)"),
    "channels": Int(choices=(1, 3), default=1, auto=True, doc="auto: 3 if the images carry colour, else 1"),
    "val_fraction": Fraction(required=True),
    "route_fraction": Fraction(default=0.5),
    "test_fraction": Fraction(default=0.2),
    "max_train": Int(nullable=True, ge=20, default=None),
    "max_test": Int(nullable=True, ge=20, default=None),
    "max_pixels": Int(ge=1, default=16777216, doc="largest image (pixels) the decoder opens"),
}

VALIDATE = {
    "class_share_tolerance": Number(required=True, ge=0, le=1),
    "pixel_mean_min": Number(ge=0, le=255, default=0.0),
    "pixel_mean_max": Number(ge=0, le=255, default=255.0),
    "min_pixel_std": Number(ge=0, default=0.0),
    "max_duplicate_share": Number(ge=0, le=1, default=0.0),
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
    "curriculum": Str(choices=CURRICULA, default="cumulative"),
    "level_weight": Int(ge=1, le=10, default=2),
    "max_iter": Int(ge=1, default=200),
    "knn_neighbors": Int(ge=1, default=10),
}

TRACKING = {"experiment": Str(default="cascade")}

MODEL = {"confidence": Str(choices=CONFIDENCES, default="maxprob")}

PROFILE = {
    "repeats": Int(ge=1, default=20),
    "batch_sizes": List(Int(ge=1), unique=True, min_items=1, default=[1, 64]),
}


def _profile_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if "batch_sizes" in v and 1 not in v["batch_sizes"]:
        yield "batch_sizes", f"must include 1, got {v['batch_sizes']!r}"


# Where torch runs (pipeline.device.ComputeConfig).
COMPUTE = {
    "device": Str(default="auto", pattern=DEVICE_PATTERN,
                  pattern_doc="auto, cpu, cuda or cuda:N (N an int >= 0)"),
    "precision": Str(choices=PRECISIONS, default="fp32", doc="bf16: autocast on CUDA only"),
}


def _compute_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if v.get("precision") == "bf16" and v.get("device") == "cpu":
        yield "precision", "bf16 needs a CUDA device (compute.device is cpu); use fp32 on the CPU"


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
    "warmup_epochs": Number(ge=0, default=0.0),
    "crop_padding": Int(ge=0, default=0),
    "flip": Bool(default=False),
    "erase": Number(ge=0, le=1, default=0.0, doc="random erasing: probability per training image"),
    "lam": Number(ge=0, default=0.0),
    "mu": Number(ge=0, default=0.0),
    "seed": Int(ge=0, default=0, doc="default: the top-level seed"),
    "label_smoothing": Number(ge=0, lt=1, default=0.0),
    "sampler": Str(choices=SAMPLERS, default="probmodel"),
    "m": Int(ge=1, default=4),
    "pick": Str(choices=PICKS, default="entropy"),
    "pool_factor": Int(ge=1, default=8),
    "temperature": Number(gt=0, default=0.1),
    "smoothing": Number(ge=0, default=0.05),
    "step": Number(gt=0, le=1, default=0.1),
    "beta": Number(ge=0, default=0.01),
    "mi_eps": Number(gt=0, default=1e-3),
    "lambda_c": Number(ge=0, default=0.1),
    "sandwich": Bool(default=False),
    "distill": Number(ge=0, default=0.0),
    "utility": Str(choices=UTILITIES, default="rank"),
    "paired_perf": Bool(default=True),
    "kd": Number(ge=0, default=0.0,
                 doc="distillation from plain_large's probabilities (needs train's --teacher)"),
    "kd_hard": Number(ge=0, nullable=True, default=None,
                      doc="distillation's weight instead where grade found the data hard (null: kd)"),
    "kd_temperature": Number(gt=0, default=1.0),
    "tries_hard": Int(ge=1, le=10, default=1,
                      doc="where grade found the data hard: train this many times (train seed, +1, ...), keep "
                          "the one with the highest final training accuracy"),
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

CALIBRATE = {
    "mode": Str(choices=CALIBRATE_MODES, default="delta"),
    "delta": Number(ge=0, lt=1, default=0.003),
    "reference": Str(choices=REFERENCES, default="best"),
    "budget_macs": Number(nullable=True, gt=0, default=None),
    "grid": Int(ge=1, default=50),
    "ensemble_decays": List(Number(ge=0, le=1), unique=True, min_items=1, default=[0.0]),
    "bound_z": Number(ge=0, le=5, default=0.0,
                      doc="delta mode: the loss bound is its estimate + bound_z standard errors (0: the estimate)"),
    "held_out": Str(choices=HELD_OUT, default="calib",
                    doc="what thresholds are fitted on: pooled (route + calib) or calib"),
    "min_reach": Number(ge=0, lt=1, default=0.0,
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

BASELINES = {
    "small_width": Int(ge=1, default=8),
    "large_width": Int(ge=1, default=24),
    "epochs": Int(ge=1, default=8),
    "min_steps": Int(ge=0, default=0, doc="epochs raised to at least this many optimiser steps (small data)"),
    "min_steps_hard": Int(ge=0, default=0, doc="the step floor instead where grade found the data hard"),
    "batch_size": Int(ge=1, le=65536, default=128),
    "lr": Number(gt=0, default=0.1),
    "momentum": Number(ge=0, lt=1, default=0.9),
    "weight_decay": Number(ge=0, default=5e-4),
    "schedule": Str(choices=SCHEDULES, default="cosine"),
    "warmup_epochs": Number(ge=0, default=0.2),
    "crop_padding": Int(ge=0, default=2),
    "flip": Bool(default=True),
    "label_smoothing": Number(ge=0, lt=1, default=0.0),
    "grad_clip": Number(ge=0, default=0.0, doc="clip the gradients' global norm to this (0: off)"),
}


def _baselines_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if "small_width" in v and "large_width" in v and v["large_width"] < v["small_width"]:
        yield "large_width", f"must be >= small_width ({v['small_width']}), got {v['large_width']!r}"
    if "warmup_epochs" in v and "epochs" in v and not v["warmup_epochs"] < v["epochs"]:
        yield "warmup_epochs", f"must be < epochs ({v['epochs']}), got {v['warmup_epochs']!r}"


# modules.mK.spec (pipeline.models.modules.ModuleSpec)
MODULE_SPEC = {
    "kind": Str(required=True, choices=KINDS),
    "channels": Int(required=True, ge=1),
    "stride": Int(choices=(1, 2), default=1),
    "layers": Int(ge=0, default=1),
    "ops": List(Str(choices=OPS), unique=True, min_items=2, doc="supernet only"),
    "default_op": Str(choices=tuple(op for op in OPS if op != "skip"), doc="supernet only; one of ops"),
    "head": Str(choices=HEADS, default="pool_mlp"),
    "head_grid": Int(ge=1, default=4),
    "head_hidden": Int(ge=0, default=128),
}


SUPERNET_ONLY = ("ops", "default_op")


def _spec_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if v.get("kind") == "supernet":
        if "layers" in v and v["layers"] < 1:
            yield "layers", f"must be >= 1 for a supernet module, got {v['layers']!r}"
        if "ops" in v and "default_op" in v and v["default_op"] not in v["ops"]:
            yield "default_op", f"must be one of ops {v['ops']!r}, got {v['default_op']!r}"


MODULE_TRAIN = {name: replace(key, required=False) for name, key in TRAIN.items()}
MODULE_KEYS = ("after", "spec", "train")
# modules.mK.after: what module K stacks on, as the path train@mK depends on in dvc.yaml (DVC templating
# cannot compute "the previous module"): the prepared images for m1, the previous module's directory
# (train, search, select outputs) for every later one. Modules run in series, so it is fixed by K.
MODULE_INPUT = "data/prepared"
MODULES_DIR = "models/modules"


def module_after(k: int) -> str:
    """The value ``modules.mK.after`` must have."""
    return MODULE_INPUT if k == 1 else f"{MODULES_DIR}/m{k - 1}"


def _after_problem(name: str, after: Any, names: list[str], mkey: str) -> str | None:
    k = int(name[1:]) if re.fullmatch(r"m[1-9]\d*", name) else None
    if k is None:
        return None  # the m1..mK naming problem is reported already
    want = module_after(k)
    fix = f"write `after: {want}` ({'the images' if k == 1 else f'module m{k - 1}'}, what {name} stacks on)"
    if after is None:
        return f"{mkey}.after is missing: {fix}"
    if after == want:
        return None
    m = re.fullmatch(re.escape(MODULES_DIR) + r"/(m\d+)/?", str(after))
    if m and m.group(1) not in names:
        return (f"{mkey}.after stacks {name} on module {m.group(1)}, which is not in {names}: the cascade "
                f"runs its modules in series, {fix}")
    return f"{mkey}.after must be {want!r} (modules run in series: {fix}), got {after!r}"


def _check_modules(value: Any, key: str, params: Mapping[str, Any], partial: bool = False) -> list[str]:
    problems: list[str] = []
    if not isinstance(value, Mapping) or not value:
        return [f"{key} must be a non-empty mapping of modules m1..mK, got {value!r}"]
    names = [str(n) for n in value]
    expected = [f"m{k}" for k in range(1, len(names) + 1)]
    if names != expected:
        problems.append(f"{key} must be named m1..mK in order, got {names}")
    train = params.get("train") if isinstance(params.get("train"), Mapping) else {}
    train_valid = valid_values(train, TRAIN) if train else {}
    base_rules = set(_train_rules({**defaults_of(TRAIN), **train_valid}))
    for name, mod in value.items():
        mkey = f"{key}.{name}"
        if not isinstance(mod, Mapping):
            problems.append(f"{mkey} must be a mapping with 'spec' (and optionally 'train'), got {mod!r}")
            continue
        problems += unknown_keys(mod, MODULE_KEYS, mkey)
        after = _after_problem(str(name), mod.get("after"), names, mkey)
        if after and not (partial and "after" not in mod):  # a stage run by hand does not read it
            problems.append(after)
        spec = mod.get("spec")
        if "spec" not in mod:
            problems.append(f"{mkey}.spec is missing")
        elif isinstance(spec, Mapping) and spec.get("kind") == "fixed":
            for name_ in SUPERNET_ONLY:
                if name_ in spec:
                    problems.append(f"{mkey}.spec.{name_} is for supernet modules only (kind: fixed), "
                                    f"got {spec[name_]!r}")
            rest = {k: v for k, v in spec.items() if k not in SUPERNET_ONLY}
            fixed = {k: v for k, v in MODULE_SPEC.items() if k not in SUPERNET_ONLY}
            problems += check_section(rest, Section(fixed, rules=(_spec_rules,)), f"{mkey}.spec")
        else:
            if isinstance(spec, Mapping) and spec.get("kind") == "supernet":
                problems += [f"{mkey}.spec.{name_} is missing (required for a supernet module)"
                             for name_ in SUPERNET_ONLY if name_ not in spec]
            problems += check_section(spec, Section(MODULE_SPEC, rules=(_spec_rules,)), f"{mkey}.spec")
        override = mod.get("train")
        if override is None:
            override = {}
        if not isinstance(override, Mapping):
            problems.append(f"{mkey}.train must be a mapping of train overrides, got {override!r}")
            continue
        problems += check_section(override, Section(MODULE_TRAIN), f"{mkey}.train")
        # The rules across train keys hold for what module mK trains with: train overlaid by its override.
        merged = {**defaults_of(TRAIN), **train_valid, **valid_values(override, MODULE_TRAIN)}
        for k, message in _train_rules(merged):
            if k in override:
                problems.append(f"{mkey}.train.{k} {message}")
            elif (k, message) in base_rules:
                problems.append(f"train.{k} {message}")  # the same for every module: reported once
            else:
                problems.append(f"train.{k} {message} (for module {name}, with its {mkey}.train overrides)")
    levels = valid_values(params.get("grade") or {}, GRADE).get("levels") if isinstance(
        params.get("grade"), Mapping) else None
    if levels is not None and levels < len(value):
        problems.append(f"grade.levels must be >= the number of modules ({len(value)}): module k trains "
                        f"on the level-k id list, got {levels}")
    return problems


SCHEMA: dict[str, Key | Section | Custom] = {
    "seed": Int(ge=0, default=0),
    "data": Section(DATA),
    "validate": Section(VALIDATE, rules=(_validate_rules,)),
    "grade": Section(GRADE),
    "tracking": Section(TRACKING, required=False),
    "model": Section(MODEL, required=False),
    "modules": Custom(_check_modules),
    "profile": Section(PROFILE, required=False, rules=(_profile_rules,)),
    "compute": Section(COMPUTE, required=False, rules=(_compute_rules,)),
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
