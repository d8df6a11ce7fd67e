"""The cascade as a registered model: the promotion gate, lineage tags, request payload decoding and
the register workflow. Pure logic lives here; every MLflow call goes through :mod:`pipeline.tracking`.

A request is a DataFrame with one image per row, in one of two documented forms:

- ``image``: base64-encoded PNG/JPEG bytes (any size; grey or colour), decoded, converted to the
  model's channels and resized to its input exactly as ``cascade recognize`` reads files;
- ``pixels``: a uint8 array (or nested lists) shaped (H, W) or (C, H, W) with C in {1, 3}, converted
  and resized the same way when its shape differs from the model's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from pipeline import tracking
from pipeline.config import _check, _get, section

if TYPE_CHECKING:
    import pandas as pd

    from pipeline.routing.package import LoadedCascade

CHAMPION, CHALLENGER = "champion", "challenger"
GATE_METRICS = ("accuracy", "mean_macs")
METRIC_TAG_PREFIX = "test."
LINEAGE_OUTS = ("data/prepared", "data/graded", "models/cascade")
# Column name -> logical type; tracking turns these into the MLflow signature. A row fills one input.
INPUT_COLUMNS = (("image", "string"), ("pixels", "any"))
OUTPUT_COLUMNS = (("class_index", "long"), ("class_name", "string"), ("confidence", "double"),
                  ("exit", "long"), ("subnets", "list[string]"), ("macs", "long"))
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[0-9]+))$")
_TAG_UNSAFE = re.compile(r"[^\w./ :-]")


@dataclass(frozen=True)
class RegisterConfig:
    model_name: str
    acc_tolerance: float  # accuracy points (as a fraction) a new champion may lose
    macs_tolerance: float  # relative growth of average MACs a new champion may add

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RegisterConfig:
        s = section(params, "register")
        cfg = cls(model_name=_get(s, "model_name", "register", str),
                  acc_tolerance=_get(s, "acc_tolerance", "register", float),
                  macs_tolerance=_get(s, "macs_tolerance", "register", float))
        _check(bool(re.fullmatch(r"[\w.-]+", cfg.model_name)), "register.model_name",
               "must be letters, digits, '_', '.' or '-'")
        _check(0.0 <= cfg.acc_tolerance <= 1.0, "register.acc_tolerance", "must be in [0, 1]")
        _check(0.0 <= cfg.macs_tolerance, "register.macs_tolerance", "must be >= 0")
        return cfg


# ----------------------------------------------------------------------------------------------- gate


def _finite(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def gate(candidate: Mapping[str, float], champion: Mapping[str, float] | None, acc_tolerance: float,
         macs_tolerance: float) -> tuple[bool, list[str]]:
    """Whether the candidate may become champion, with one reason per check.

    Passes when accuracy >= champion - ``acc_tolerance`` and average MACs <= champion x (1 +
    ``macs_tolerance``); the first version (no champion) passes. A champion without figures cannot
    be compared, so it is kept (move the alias by hand to replace it).
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
    floor = float(champion["accuracy"]) - acc_tolerance
    cap = float(champion["mean_macs"]) * (1.0 + macs_tolerance)
    acc_ok, macs_ok = acc >= floor - 1e-12, macs <= cap * (1 + 1e-12)  # exact ties pass despite rounding
    reasons = [
        f"accuracy {acc:.4f} {'>=' if acc_ok else '<'} {floor:.4f} (champion {champion['accuracy']:.4f} - "
        f"{acc_tolerance:g}): {'ok' if acc_ok else 'fail'}",
        f"mean MACs {macs:,.0f} {'<=' if macs_ok else '>'} {cap:,.0f} (champion {champion['mean_macs']:,.0f} "
        f"x {1 + macs_tolerance:g}): {'ok' if macs_ok else 'fail'}",
    ]
    return acc_ok and macs_ok, reasons


# -------------------------------------------------------------------------------------------- lineage


def _tag_key(text: str) -> str:
    return _TAG_UNSAFE.sub(".", text)  # MLflow tag keys allow letters, digits and _ - . / : space


def _params_hash(params: Any) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


def metric_tags(metrics: Mapping[str, float]) -> dict[str, str]:
    return {f"{METRIC_TAG_PREFIX}{k}": repr(float(v)) for k, v in metrics.items()}


def metrics_from_tags(tags: Mapping[str, str]) -> dict[str, float]:
    """The test metrics a version was tagged with (see :func:`metric_tags`); unparsable ones are left out."""
    out = {}
    for key, value in tags.items():
        if key.startswith(METRIC_TAG_PREFIX):
            try:
                out[key[len(METRIC_TAG_PREFIX):]] = float(value)
            except ValueError:
                continue
    return out


def lineage_tags(root: str | os.PathLike[str], dvc_lock_path: str | os.PathLike[str],
                 metrics: Mapping[str, float], outs: Sequence[str] = LINEAGE_OUTS) -> dict[str, str]:
    """Tags that trace a version back to its commit, data and params: the git commit, the ``dvc.lock``
    md5 of each output in ``outs`` (``dvc.out.<path>``), a hash of each stage's params
    (``dvc.params.<stage>``; equal hashes mean equal params) and the test metrics."""
    tags = {"git_commit": tracking.git_commit(root)}
    path = Path(dvc_lock_path)
    try:
        lock = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        lock = None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(lock, dict) or not isinstance(lock.get("stages"), dict):
        tags["dvc.lock"] = "missing"
    else:
        tags["dvc.lock"] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        for stage, entry in sorted(lock["stages"].items()):
            if not isinstance(entry, dict):
                continue
            for out in entry.get("outs") or []:
                if isinstance(out, dict) and out.get("path") in outs and "md5" in out:
                    tags[_tag_key(f"dvc.out.{out['path']}")] = str(out["md5"])
            if entry.get("params"):
                tags[_tag_key(f"dvc.params.{stage}")] = _params_hash(entry["params"])
    tags.update(metric_tags(metrics))
    return tags


# -------------------------------------------------------------------------------------------- payload


def _decoders() -> tuple[Any, Any, Any]:
    with warnings.catch_warnings():  # torchvision flags its decoders as deprecated in favour of torchcodec
        warnings.simplefilter("ignore", DeprecationWarning)
        from torchvision.io import ImageReadMode, decode_image, encode_png
    return ImageReadMode, decode_image, encode_png


def encode_png(image: np.ndarray) -> bytes:
    """uint8 (C, H, W) -> PNG bytes (for input examples and clients)."""
    import torch

    _, _, encode = _decoders()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return encode(torch.from_numpy(np.ascontiguousarray(image))).numpy().tobytes()


def _fit(image: Any, shape: Sequence[int]) -> np.ndarray:
    """uint8 tensor (c, h, w) -> uint8 array of ``shape``: channels converted, then resized (bilinear,
    antialiased) as :func:`pipeline.data.sources.resize_batch` does."""
    import torch
    from torchvision.transforms.v2 import functional as F

    c, h, w = shape
    if image.shape[0] != c and c == 1:  # ITU-R 601 luma, rounded: a grey RGB image keeps its values
        weights = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
        image = (image.float() * weights).sum(dim=0, keepdim=True).round().clamp(0, 255).to(torch.uint8)
    elif image.shape[0] != c:
        image = image.expand(c, -1, -1)
    if tuple(image.shape[1:]) != (h, w):
        image = F.resize(image[None], [h, w], antialias=True)[0]
    return image.contiguous().numpy()


def _b64_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("ascii", errors="replace")
    if not isinstance(value, str):
        raise ValueError(f"image must be a base64 string, got {type(value).__name__}")
    if value.startswith("data:") and "," in value:
        value = value.split(",", 1)[1]  # a data URI: data:image/png;base64,....
    try:
        data = base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("image is not valid base64") from None
    if not data:
        raise ValueError("image is empty")
    return data


def _decode_image(value: Any, shape: Sequence[int]) -> np.ndarray:
    import torch

    read_mode, decode, _ = _decoders()
    data = torch.frombuffer(bytearray(_b64_bytes(value)), dtype=torch.uint8)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            image = decode(data, mode=read_mode.GRAY if shape[0] == 1 else read_mode.RGB)  # (C, H, W)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"image cannot be decoded as PNG/JPEG: {str(exc).splitlines()[0]}") from None
    return _fit(image, shape)


def _decode_pixels(value: Any, shape: Sequence[int]) -> np.ndarray:
    import torch

    try:
        array = np.asarray(value)
    except ValueError:
        array = np.asarray([], dtype=object)  # ragged nested lists
    if array.dtype == object or array.dtype.kind not in "iu" or array.ndim not in (2, 3):
        raise ValueError(f"pixels must be integers shaped (H, W) or (C, H, W), got "
                         f"{array.dtype} {array.shape}")
    if array.ndim == 2:
        array = array[None]
    if array.shape[0] not in (1, 3) or min(array.shape[1:]) < 1:
        raise ValueError(f"pixels must be shaped (H, W) or (C, H, W) with C 1 or 3, got {array.shape}")
    if array.min() < 0 or array.max() > 255:
        raise ValueError(f"pixels must lie in 0..255, got {array.min()}..{array.max()}")
    return _fit(torch.from_numpy(array.astype(np.uint8)), shape)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def decode_payload(frame: pd.DataFrame, image_shape: Sequence[int]) -> np.ndarray:
    """A request DataFrame -> uint8 (N, C, H, W) for the model; a bad row raises a ValueError naming it."""
    c, h, w = (int(v) for v in image_shape)
    columns = [name for name, _ in INPUT_COLUMNS if name in frame.columns]
    if not columns:
        raise ValueError(f"the payload needs a column 'image' (base64 PNG/JPEG) or 'pixels' (uint8 arrays); "
                         f"got columns {list(map(str, frame.columns))}")
    images = []
    for row in range(len(frame)):
        given = [(col, frame[col].iloc[row]) for col in columns if not _missing(frame[col].iloc[row])]
        if len(given) != 1:
            raise ValueError(f"row {row}: give exactly one of {' or '.join(columns)}, got {len(given)}")
        col, value = given[0]
        try:
            decode = _decode_image if col == "image" else _decode_pixels
            images.append(decode(value, (c, h, w)))
        except ValueError as exc:
            raise ValueError(f"row {row}: {exc}") from None
    return np.stack(images) if images else np.zeros((0, c, h, w), dtype=np.uint8)  # (N, C, H, W)


def image_frame(images: np.ndarray) -> pd.DataFrame:
    """uint8 (N, C, H, W) images -> a request DataFrame of base64 PNGs (the ``image`` form)."""
    import pandas as pd

    return pd.DataFrame({"image": [base64.b64encode(encode_png(im)).decode("ascii") for im in images]})


def predict_frame(loaded: LoadedCascade, frame: pd.DataFrame, batch_size: int = 256) -> pd.DataFrame:
    """The pyfunc model's answer: one row per request row, the same as :func:`recognize_arrays`."""
    import pandas as pd

    from pipeline.routing.package import recognize_arrays

    images = decode_payload(frame, loaded.meta.image_shape)  # (N, C, H, W)
    rows = recognize_arrays(loaded, images, batch_size) if len(images) else []
    return pd.DataFrame(rows, columns=[name for name, _ in OUTPUT_COLUMNS])


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
    return cascade_dir(tracking.download_model_artifacts(uri, dst))


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


def register_cascade(model_dir: str | os.PathLike[str], cfg: RegisterConfig, candidate: Mapping[str, float],
                     tags: Mapping[str, str], example: pd.DataFrame, *, root: str | os.PathLike[str] = "."
                     ) -> Decision:
    """Log and register the cascade in the active run, tag it (``tags``, e.g. :func:`lineage_tags`, plus
    the candidate's metrics, which the next gate reads), point ``challenger`` at it and move
    ``champion`` to it if it passes the gate against the champion it found."""
    previous = tracking.get_version_by_alias(cfg.model_name, CHAMPION, root=root)
    previous_metrics = None if previous is None else metrics_from_tags(previous["tags"])
    passed, reasons = gate(candidate, previous_metrics, cfg.acc_tolerance, cfg.macs_tolerance)
    version = tracking.log_cascade_model(model_dir, cfg.model_name, example, INPUT_COLUMNS, OUTPUT_COLUMNS)
    decision_tags = {"gate": "passed" if passed else "failed", "gate.reasons": " | ".join(reasons)}
    tracking.set_version_tags(cfg.model_name, version, {**tags, **metric_tags(candidate), **decision_tags},
                              root=root)
    tracking.set_alias(cfg.model_name, CHALLENGER, version, root=root)
    if passed:
        tracking.set_alias(cfg.model_name, CHAMPION, version, root=root)
    before = None if previous is None else int(previous["version"])
    return Decision(cfg.model_name, int(version), passed, reasons, dict(candidate), before, previous_metrics,
                    int(version) if passed else before)


def png_b64(path: str | os.PathLike[str]) -> str:
    """A file's bytes as base64 text: what a client puts in the ``image`` column."""
    return base64.b64encode(Path(path).read_bytes()).decode("ascii")



def save_cascade_pyfunc(model_dir: str | os.PathLike[str], path: str | os.PathLike[str],
                        example: pd.DataFrame) -> Path:
    """The registered form of a cascade, saved locally (``mlflow models serve -m PATH`` serves it)."""
    return tracking.save_cascade_model(model_dir, path, example, INPUT_COLUMNS, OUTPUT_COLUMNS)
