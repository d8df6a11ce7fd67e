"""The cascade as a registered model: the promotion gate, lineage tags and the register workflow.
Pure logic lives here; every MLflow call goes through :mod:`pipeline.registry.mlflow_models` (models, aliases)
or :mod:`pipeline.registry.tracking` (runs, the store's lock), and request payloads
(decoding, the pyfunc model's answer) live in :mod:`pipeline.registry.payload`, re-exported here.

The dependencies run one way: ``register -> mlflow_models -> tracking`` and ``mlflow_models ->
payload`` (the pyfunc model class imports the payload module lazily); none of them imports this module.

Serving device: the pyfunc model loads the cascade on the device named by the environment variable
``CASCADE_DEVICE`` (``pipeline.registry.tracking.DEVICE_ENV``) of the serving process: ``cpu`` by default,
or ``auto`` | ``cuda`` | ``cuda:N`` (e.g. ``CASCADE_DEVICE=cuda mlflow models serve -m ...``).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pipeline.params.settings import schema_config, settings
from pipeline.registry import mlflow_models, tracking
from pipeline.registry.heal import CHALLENGER, CHAMPION, heal, mark_complete, pending_tags
from pipeline.registry.lineage import input_hashes, lineage_tags, metric_tags, metrics_from_tags
from pipeline.registry.payload import (  # re-exported: clients and bench import them from here
    INPUT_COLUMNS,
    OUTPUT_COLUMNS,
    decode_payload,
    encode_png,
    image_frame,
    png_b64,
    predict_frame,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CHALLENGER", "CHAMPION", "CLASSES_TAG", "INPUT_COLUMNS", "OUTPUT_COLUMNS", "Decision", "RegisterConfig",
           "accuracy_at", "class_set_mismatch", "curve_points", "decode_payload", "download_cascade", "encode_png",
           "gate",
           "image_frame", "input_hashes", "lineage_tags", "log_version", "metrics_from_tags",
           "parse_model_uri", "png_b64", "predict_frame", "promote", "register_cascade",
           "save_cascade_pyfunc"]

GATE_METRICS = ("accuracy", "mean_macs")
CURVE_TAG = "curve.test"  # the candidate's operating points, JSON [[mean_macs, accuracy], ...]
CLASSES_TAG = "data.classes"  # the class names the version answers with, JSON; the gate compares only equals
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[0-9]+))$")


AUTO_NAME = "auto"


def model_name_for(source: str) -> str:
    """The registered model's name when params say ``register.model_name: auto``: named after the data
    it learned, so models of other datasets never share a name (and a champion) by default.
    ``fashion-mnist[:dir]`` -> ``fashion-cascade`` (the name it always had), ``digits`` ->
    ``digits-cascade``, ``imagefolder:/data/flowers`` or ``idx:/data/flowers`` -> ``flowers-cascade``."""
    kind, _, where = source.partition(":")
    if kind == "fashion-mnist":
        stem = "fashion"
    elif where:
        stem = Path(where.rstrip("/\\")).name or kind
    else:
        stem = kind
    stem = re.sub(r"[^\w.-]+", "-", stem.lower()).strip("-.") or "model"
    return f"{stem}-cascade"


@schema_config("register")
class RegisterConfig:
    """The ``register`` section: the registered model's name (``auto``: from the data source) and the
    tolerances of the champion gate (accuracy as a fraction; relative growth of average MACs)."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RegisterConfig:
        s = settings(params, "register")  # checked by the schema (pattern, ranges)
        name = s.model_name
        if name == AUTO_NAME:
            name = model_name_for(str((params.get("data") or {}).get("source", "fashion-mnist")))
        return cls(**{**vars(s), "model_name": name})


# ----------------------------------------------------------------------------------------------- gate


def _finite(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def curve_points(evaluated: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The operating points ``(mean_macs, accuracy)`` of the evaluated cascade in evaluate's metrics:
    the cascade itself (``cascade``), each exit alone (``each_exit``: everything exits there) and,
    where present, the budget curve (``budget_curve``, top level or inside ``cascade``: one shared
    threshold swept over [0, 1]). Each is a setting of the same model's thresholds; rows without finite
    figures are skipped."""
    rows: list[Any] = [evaluated.get("cascade")]
    cascade = evaluated.get("cascade") if isinstance(evaluated.get("cascade"), Mapping) else {}
    for group in (evaluated.get("each_exit"), evaluated.get("budget_curve"), cascade.get("budget_curve")):
        if isinstance(group, Sequence) and not isinstance(group, str):
            rows.extend(group)
    points = []
    for row in rows:
        if isinstance(row, Mapping):
            macs, acc = _finite(row, "mean_macs"), _finite(row, "accuracy")
            if macs is not None and acc is not None:
                points.append((macs, acc))
    return sorted(set(points))


def accuracy_at(points: Sequence[tuple[float, float]], macs: float) -> float | None:
    """The accuracy a model with these operating points ``(mean_macs, accuracy)`` reaches at mean MACs
    ``macs``: linear interpolation along their Pareto frontier (sorted by MACs, each point more
    accurate than every cheaper one), flat beyond the most expensive frontier point; None below the
    cheapest point (no figure at that cost). Routing a share of the inputs with each of two settings
    reaches any point of the segment between them, so the figure is attainable, not extrapolated."""
    pts = sorted((float(m), float(a)) for m, a in points if math.isfinite(m) and math.isfinite(a))
    if not pts or macs < pts[0][0]:
        return None
    frontier: list[tuple[float, float]] = []
    for m, a in pts:
        if frontier and a <= frontier[-1][1]:
            continue  # no more accurate than a cheaper point: off the frontier
        if frontier and m == frontier[-1][0]:
            frontier[-1] = (m, a)
        else:
            frontier.append((m, a))
    for (m0, a0), (m1, a1) in zip(frontier, frontier[1:], strict=False):
        if m0 <= macs <= m1:
            return a0 + (a1 - a0) * (macs - m0) / (m1 - m0)
    return frontier[-1][1]


def gate(candidate: Mapping[str, float], champion: Mapping[str, float] | None, acc_tolerance: float,
         macs_tolerance: float, curve: Sequence[tuple[float, float]] = ()) -> tuple[bool, list[str]]:
    """Whether the candidate may become champion, with one reason per check.

    1. The first version (no champion) passes. A champion without figures cannot be compared, so it
       is kept (move the alias by hand to replace it).
    2. Accuracy: the candidate's accuracy >= champion - ``acc_tolerance``, always (a larger loss is
       never traded for a lower cost).
    3. Cost: average MACs <= champion x (1 + ``macs_tolerance``) passes. Above that cap the candidate is
       compared at equal cost: its accuracy at the champion's average MACs, interpolated on its
       operating points (``curve`` plus the candidate itself, see :func:`accuracy_at`), must be >=
       champion - ``acc_tolerance``, and its own accuracy must exceed the champion's (the extra MACs
       must buy accuracy). Without an operating point at or below the champion's MACs there is no
       equal-cost figure and the cap holds.
    """
    for key in GATE_METRICS:
        if _finite(candidate, key) is None:
            raise ValueError(f"candidate metric {key!r} is missing or not a finite number: "
                             f"{candidate.get(key)!r}")
    if champion is None:
        return True, ["no champion yet: the first version passes"]
    missing = [key for key in GATE_METRICS if _finite(champion, key) is None]
    if missing:
        return False, [f"the champion has no {' or '.join(missing)} to compare with: champion kept"]
    acc, macs = float(candidate["accuracy"]), float(candidate["mean_macs"])
    champ_acc, champ_macs = float(champion["accuracy"]), float(champion["mean_macs"])
    floor = champ_acc - acc_tolerance
    cap = champ_macs * (1.0 + macs_tolerance)
    acc_ok, macs_ok = acc >= floor - 1e-12, macs <= cap * (1 + 1e-12)  # exact ties pass despite rounding
    reasons = [
        f"accuracy {acc:.4f} {'>=' if acc_ok else '<'} {floor:.4f} (champion {champ_acc:.4f} - "
        f"{acc_tolerance:g}): {'ok' if acc_ok else 'fail'}",
        f"mean MACs {macs:,.0f} {'<=' if macs_ok else '>'} {cap:,.0f} (champion {champ_macs:,.0f} "
        f"x {1 + macs_tolerance:g}): {'ok' if macs_ok else 'over the cap, compared at equal cost'}",
    ]
    if macs_ok:
        return acc_ok, reasons
    points = [*curve, (macs, acc)]
    at_cost = accuracy_at(points, champ_macs)
    if at_cost is None:
        cheapest = min(m for m, _ in points)
        reasons.append(f"equal cost: no operating point at or below the champion's {champ_macs:,.0f} MACs "
                       f"(cheapest {cheapest:,.0f}): fail")
        return False, reasons
    same_ok, gain_ok = at_cost >= floor - 1e-12, acc > champ_acc
    reasons.append(f"equal cost: accuracy {at_cost:.4f} at the champion's {champ_macs:,.0f} MACs "
                   f"{'>=' if same_ok else '<'} {floor:.4f}, and {acc - champ_acc:+.4f} accuracy for "
                   f"{macs / champ_macs - 1:+.1%} MACs {'buys' if gain_ok else 'buys no'} accuracy: "
                   f"{'ok' if same_ok and gain_ok else 'fail'}")
    return acc_ok and same_ok and gain_ok, reasons


def class_set_mismatch(champion_tags: Mapping[str, str], classes: Sequence[str] | None,
                       champion_version: str | int) -> str | None:
    """Why a candidate cannot be compared with the champion at all, or None: the two were trained on
    different class sets (recorded in :data:`CLASSES_TAG`). A champion or candidate without the record
    (registered before it existed) is compared as before."""
    theirs = champion_tags.get(CLASSES_TAG)
    if classes is None or theirs is None:
        return None
    mine = json.dumps(list(classes))
    if mine == theirs:
        return None
    return (f"class set differs: champion v{champion_version} was trained on {theirs}, this version on "
            f"{mine}; not compared, champion kept (register a model of other classes under another "
            f"register.model_name)")


# --------------------------------------------------------------------------------------------- models


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/<name>@<alias>`` or ``models:/<name>/<version>`` -> (name, alias, version)."""
    match = _URI.match(uri)
    if not match:
        raise ValueError(f"model URI {uri!r} must be models:/<name>@<alias> or models:/<name>/<version>")
    return match["name"], match["alias"], match["version"]


def cascade_dir(model_root: str | os.PathLike[str]) -> Path:
    """The cascade model directory inside a downloaded MLflow model (its ``cascade`` artifact)."""
    root = Path(model_root)
    try:
        conf = yaml.safe_load((root / "MLmodel").read_text())
        rel = conf["flavors"]["python_function"]["artifacts"]["cascade"]["path"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        raise ValueError(f"{root} is not an MLflow model with a 'cascade' artifact") from None
    directory = root / rel
    if not (directory / "cascade.json").is_file():
        raise ValueError(f"{directory} holds no cascade.json")
    return directory


def download_cascade(uri: str, dst: str | os.PathLike[str] | None = None) -> Path:
    """A registered cascade (``models:/<name>@<alias>`` or ``/<version>``) as a local model directory,
    from the store ``MLFLOW_TRACKING_URI`` names (default: ``mlflow.db`` in the working directory)."""
    parse_model_uri(uri)
    return cascade_dir(mlflow_models.download_model_artifacts(uri, dst))


@dataclass(frozen=True)
class Decision:
    model_name: str
    version: int
    passed: bool
    reasons: list[str]
    candidate: dict[str, float]
    previous_champion: int | None
    previous_champion_metrics: dict[str, float] | None
    champion: int | None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "model_uri": f"models:/{self.model_name}/{self.version}"}


def log_version(model_dir: str | os.PathLike[str], example: pd.DataFrame) -> str:
    """Log the cascade as a pyfunc model in the active run (the slow part, outside any lock); returns
    its model URI. No version exists yet: :func:`promote` registers it, gated and tagged at once."""
    return mlflow_models.log_cascade_model(model_dir, example, INPUT_COLUMNS, OUTPUT_COLUMNS)


def promote(cfg: RegisterConfig, model_uri: str, candidate: Mapping[str, float], tags: Mapping[str, str],
            *, curve: Sequence[tuple[float, float]] = (), root: str | os.PathLike[str] = ".",
            record: Callable[[Decision], None] | None = None,
            classes: Sequence[str] | None = None, veto: str | None = None,
            log: Callable[[str], None] = print) -> Decision:
    """Gate the model at ``model_uri`` against the current champion, register it and move the aliases,
    as one critical section.

    Under :func:`pipeline.registry.tracking.registry_lock` (an inter-process file lock of the store) it reads
    the champion, runs :func:`gate`, registers the model as a new version that carries every tag from
    its creation (``tags``, e.g. :func:`lineage_tags`, plus the candidate's metrics and ``curve``, which
    later gates read, and the decision), points ``challenger`` at it, moves ``champion`` to it if it
    passed, and calls ``record(decision)`` (the stage writes ``register.json`` there). So concurrent
    runs on one store each gate against the champion the previous one left, exactly one version is
    champion, and every recorded decision agrees with the registry when it is recorded. A version is
    created tagged incomplete and tagged complete once its aliases are set; first of all, versions a
    killed run left incomplete are finished or removed (:func:`pipeline.registry.heal.heal`, one
    ``log`` line each), so a rerun after a kill at any moment leaves every version complete. ``veto``:
    a reason the version may not be champion whatever the gate says (evaluate found it dominated by
    another model of its run): it is registered as challenger, the reason first among its gate reasons."""
    with tracking.registry_lock(root):
        heal(cfg.model_name, root=root, log=log)
        previous = mlflow_models.get_version_by_alias(cfg.model_name, CHAMPION, root=root)
        previous_metrics = None if previous is None else metrics_from_tags(previous["tags"])
        mismatch = None if previous is None else class_set_mismatch(previous["tags"], classes, previous["version"])
        if mismatch is not None:
            passed, reasons = False, [mismatch]
        else:
            passed, reasons = gate(candidate, previous_metrics, cfg.acc_tolerance, cfg.macs_tolerance, curve)
        if veto is not None:
            passed, reasons = False, [veto, *reasons]
        decision_tags = {"gate": "passed" if passed else "failed", "gate.reasons": " | ".join(reasons)}
        if classes is not None:
            decision_tags[CLASSES_TAG] = json.dumps(list(classes))
        if curve:
            decision_tags[CURVE_TAG] = json.dumps([[m, a] for m, a in curve])
        before = None if previous is None else int(previous["version"])
        version = mlflow_models.register_version(cfg.model_name, model_uri,
                                                 {**tags, **metric_tags(candidate), **decision_tags,
                                                  **pending_tags(before)})
        mlflow_models.set_alias(cfg.model_name, CHALLENGER, version, root=root)
        if passed:
            mlflow_models.set_alias(cfg.model_name, CHAMPION, version, root=root)
        mark_complete(cfg.model_name, version, root=root)
        decision = Decision(cfg.model_name, int(version), passed, reasons, dict(candidate), before,
                            previous_metrics, int(version) if passed else before)
        if record is not None:
            record(decision)
    return decision


def register_cascade(model_dir: str | os.PathLike[str], cfg: RegisterConfig, candidate: Mapping[str, float],
                     tags: Mapping[str, str], example: pd.DataFrame, *, root: str | os.PathLike[str] = ".",
                     curve: Sequence[tuple[float, float]] = (),
                     record: Callable[[Decision], None] | None = None) -> Decision:
    """Log the cascade in the active run (:func:`log_version`, outside the lock: it is the slow part),
    then gate, register and tag it and move the aliases (:func:`promote`, under the lock)."""
    return promote(cfg, log_version(model_dir, example), candidate, tags, curve=curve, root=root, record=record)


def save_cascade_pyfunc(model_dir: str | os.PathLike[str], path: str | os.PathLike[str],
                        example: pd.DataFrame) -> Path:
    """The registered form of a cascade, saved locally (``mlflow models serve -m PATH`` serves it; on a
    GPU with ``CASCADE_DEVICE=cuda`` in the server's environment)."""
    return mlflow_models.save_cascade_model(model_dir, path, example, INPUT_COLUMNS, OUTPUT_COLUMNS)
