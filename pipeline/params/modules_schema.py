"""The ``modules`` section of ``params.yaml``: the cascade's modules m1..mK in series, each an ``after``
(what it stacks on), a ``spec`` (its architecture: :class:`pipeline.models.modules.ModuleSpec`) and
``train`` overrides of the common ``train`` section. :func:`check_modules` is the section's check; the
whole file's schema (:mod:`pipeline.params.schema`) runs it with its ``TRAIN`` keys and rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from pipeline.params.keys import (
    Int,
    Key,
    List,
    Section,
    Str,
    check_section,
    defaults_of,
    unknown_keys,
    valid_values,
)

# Mirrors of library enumerations (importing them would import torch); tests keep them equal.
KINDS = ("fixed", "supernet")  # modules.mK.kind (pipeline.models.modules imports it)
HEADS = ("pool_mlp", "gap")  # modules.mK.head
# pipeline.models.ops.OPS
OPS = ("conv3", "conv5", "dw3", "dw5", "ir3_e3", "ir3_e6", "ir5_e3", "ir5_e6", "skip")

Rules = Callable[[Mapping[str, Any]], Iterator[tuple[str, str]]]  # a section's cross-key rules


# modules.mK.spec (pipeline.models.modules.ModuleSpec)
MODULE_SPEC = {
    "kind": Str(required=True, choices=KINDS),
    "channels": Int(required=True, ge=1),
    "stride": Int(choices=(1, 2), default=1),
    "layers": Int(ge=0, default=1),
    "ops": List(Str(choices=OPS), unique=True, min_items=2, doc="supernet only"),
    "default_op": Str(choices=tuple(op for op in OPS if op != "skip"),
                      doc="a supernet's default path op (one of ops); a fixed module's layers' op (default conv3)"),
    "head": Str(choices=HEADS, default="pool_mlp"),
    "head_grid": Int(ge=1, default=4),
    "head_hidden": Int(ge=0, default=128),
    "pools": Int(ge=0, default=0, doc="fixed only: a 2x2 max pool before each of the first `pools` layers"),
}


SUPERNET_ONLY = ("ops",)
SUPERNET_REQUIRES = ("ops", "default_op")


def _spec_rules(v: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if v.get("kind") == "supernet":
        if "layers" in v and v["layers"] < 1:
            yield "layers", f"must be >= 1 for a supernet module, got {v['layers']!r}"
        if "ops" in v and "default_op" in v and v["default_op"] not in v["ops"]:
            yield "default_op", f"must be one of ops {v['ops']!r}, got {v['default_op']!r}"
        if v.get("pools"):
            yield "pools", f"is for fixed modules only (a supernet prices its layers at one size), got {v['pools']!r}"
    elif isinstance(v.get("pools"), int) and isinstance(v.get("layers", 1), int) and v["pools"] > v.get("layers", 1):
        yield "pools", f"must be <= layers ({v.get('layers', 1)}): each pool precedes a layer, got {v['pools']!r}"


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


def _spec_problems(mod: Mapping[str, Any], mkey: str) -> list[str]:
    """Module ``mkey``'s ``spec``: present, fixed keys only for a fixed module, a supernet's required keys."""
    spec = mod.get("spec")
    if "spec" not in mod:
        return [f"{mkey}.spec is missing"]
    if isinstance(spec, Mapping) and spec.get("kind") == "fixed":
        problems = [f"{mkey}.spec.{name_} is for supernet modules only (kind: fixed), got {spec[name_]!r}"
                    for name_ in SUPERNET_ONLY if name_ in spec]
        rest = {k: v for k, v in spec.items() if k not in SUPERNET_ONLY}
        fixed = {k: v for k, v in MODULE_SPEC.items() if k not in SUPERNET_ONLY}
        return problems + check_section(rest, Section(fixed, rules=(_spec_rules,)), f"{mkey}.spec")
    problems = []
    if isinstance(spec, Mapping) and spec.get("kind") == "supernet":
        problems += [f"{mkey}.spec.{name_} is missing (required for a supernet module)"
                     for name_ in SUPERNET_REQUIRES if name_ not in spec]
    return problems + check_section(spec, Section(MODULE_SPEC, rules=(_spec_rules,)), f"{mkey}.spec")


def _train_problems(mod: Mapping[str, Any], name: str, mkey: str, module_train: dict[str, Key],
                    train_valid: Mapping[str, Any], base_rules: set, *, train_keys: dict[str, Key],
                    train_rules: Rules) -> list[str]:
    """Module ``mkey``'s ``train`` overrides: known keys, and the rules across train keys on what the
    module trains with (``train`` overlaid by its override); a rule ``train`` itself breaks is named there."""
    override = mod.get("train")
    if override is None:
        override = {}
    if not isinstance(override, Mapping):
        return [f"{mkey}.train must be a mapping of train overrides, got {override!r}"]
    problems = check_section(override, Section(module_train), f"{mkey}.train")
    merged = {**defaults_of(train_keys), **train_valid, **valid_values(override, module_train)}
    for k, message in train_rules(merged):
        if k in override:
            problems.append(f"{mkey}.train.{k} {message}")
        elif (k, message) in base_rules:
            problems.append(f"train.{k} {message}")  # the same for every module: reported once
        else:
            problems.append(f"train.{k} {message} (for module {name}, with its {mkey}.train overrides)")
    return problems


def check_modules(value: Any, key: str, params: Mapping[str, Any], *, train_keys: dict[str, Key], train_rules: Rules,
                  levels: int | None, partial: bool = False) -> list[str]:
    """Every problem of the ``modules`` section ``value``: the names m1..mK, each module's ``after``,
    ``spec`` (fixed or supernet keys) and ``train`` overrides, checked against ``train_keys`` (the schema's
    train keys) and, merged over ``params``' ``train``, against ``train_rules``; ``levels`` (grade's, when
    valid) must cover the modules. ``partial``: a stage run by hand need not give ``after``."""
    module_train = {name: replace(k, required=False) for name, k in train_keys.items()}
    problems: list[str] = []
    if not isinstance(value, Mapping) or not value:
        return [f"{key} must be a non-empty mapping of modules m1..mK, got {value!r}"]
    names = [str(n) for n in value]
    expected = [f"m{k}" for k in range(1, len(names) + 1)]
    if names != expected:
        problems.append(f"{key} must be named m1..mK in order, got {names}")
    train = params.get("train") if isinstance(params.get("train"), Mapping) else {}
    train_valid = valid_values(train, train_keys) if train else {}
    base_rules = set(train_rules({**defaults_of(train_keys), **train_valid}))
    for name, mod in value.items():
        mkey = f"{key}.{name}"
        if not isinstance(mod, Mapping):
            problems.append(f"{mkey} must be a mapping with 'spec' (and optionally 'train'), got {mod!r}")
            continue
        problems += unknown_keys(mod, MODULE_KEYS, mkey)
        after = _after_problem(str(name), mod.get("after"), names, mkey)
        if after and not (partial and "after" not in mod):  # a stage run by hand does not read it
            problems.append(after)
        problems += _spec_problems(mod, mkey)
        problems += _train_problems(mod, str(name), mkey, module_train, train_valid, base_rules,
                                    train_keys=train_keys, train_rules=train_rules)
    if levels is not None and levels < len(value):
        problems.append(f"grade.levels must be >= the number of modules ({len(value)}): module k trains "
                        f"on the level-k id list, got {levels}")
    return problems
