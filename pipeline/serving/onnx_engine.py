"""The cascade on ONNX Runtime: :mod:`pipeline.serving.onnx_export`'s files run with real early exits.

The same algorithm as :func:`pipeline.routing.engine.run_cascade`, in NumPy around ONNX Runtime
sessions: at each module the rows still in the cascade are split by their predictor's choice, each
chosen path runs once on its group, the exit ensemble (when the model has one) folds in, and the rows
whose confidence reaches the threshold leave; later modules see only the rows that stay. The answers
are the rows of :func:`pipeline.routing.recognize.recognize_arrays` (class, confidence, exit, path per
module, MACs), and match the torch engine's up to float rounding (tests/serving/test_onnx.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.io import file_sha256
from pipeline.routing.operating_points import parse_points
from pipeline.serving.onnx_format import FORMAT, MANIFEST

NOT_REACHED = "-"


@dataclass(frozen=True)
class OnnxStage:
    sessions: tuple[Any, ...]  # one per path
    keys: tuple[str, ...]
    macs: np.ndarray  # (R,) int64
    threshold: np.float32
    predictor: Any | None
    predictor_macs: int


def _log_softmax(z: np.ndarray) -> np.ndarray:
    shifted = z - z.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def confidence(scores: np.ndarray, kind: str) -> np.ndarray:
    """(n, classes) -> (n,) as :func:`pipeline.models.modules.confidence`: max softmax or top-2 margin."""
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)
    if kind == "maxprob" or probs.shape[-1] < 2:
        return probs.max(axis=-1)
    top2 = -np.sort(-probs, axis=-1)[:, :2]
    return top2[:, 0] - top2[:, 1]


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read as an ONNX cascade manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} manifest (written by `cascade export --format onnx`)")
    for name, digest in (manifest.get("sha256") or {}).items():
        file = directory / name
        if not file.is_file() or file_sha256(file) != digest:
            raise ValueError(f"{file} is missing or does not match its sha256 in {path}")
    return manifest


class OnnxCascade:
    """An exported cascade on ONNX Runtime: ``recognize(images_uint8)`` -> one row per image."""

    def __init__(self, directory: str | os.PathLike[str], threads: int = 1) -> None:
        directory = Path(directory)
        manifest = _read_manifest(directory)
        try:
            meta = manifest["meta"]
            self.classes = tuple(str(c) for c in meta["classes"])
            self.image_shape = tuple(int(v) for v in meta["image_shape"])
            self.confidence_kind = str(meta["confidence_kind"])
            self.decay = float(meta["ensemble_decay"])
            self.mean = np.asarray(meta["mean"], dtype=np.float32).reshape(1, -1, 1, 1)
            self.std = np.asarray(meta["std"], dtype=np.float32).reshape(1, -1, 1, 1)
            self.stages = [self._stage(directory, s, threads) for s in manifest["stages"]]
            self.points = parse_points(meta.get("operating_points", []), len(self.stages))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{directory / MANIFEST} is invalid: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def _stage(directory: Path, entry: dict[str, Any], threads: int) -> OnnxStage:
        pred = entry["predictor"]
        return OnnxStage(
            sessions=tuple(_session(directory / p["file"], threads) for p in entry["paths"]),
            keys=tuple(str(p["key"]) for p in entry["paths"]),
            macs=np.asarray([int(p["macs"]) for p in entry["paths"]], dtype=np.int64),
            threshold=np.float32(entry["threshold"]),
            predictor=None if pred is None else _session(directory / pred["file"], threads),
            predictor_macs=0 if pred is None else int(pred["macs"]),
        )

    def preprocess(self, images_uint8: np.ndarray) -> np.ndarray:
        images = np.asarray(images_uint8)
        if images.dtype != np.uint8 or images.ndim != 4 or tuple(images.shape[1:]) != self.image_shape:
            raise ValueError(f"images must be uint8 (N, {', '.join(map(str, self.image_shape))}), "
                             f"got {images.dtype} {images.shape}")
        x = images.astype(np.float32) / np.float32(255.0)
        return np.ascontiguousarray((x - self.mean) / self.std)

    @staticmethod
    def _run_stage(stage: OnnxStage, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = h.shape[0]
        if stage.predictor is None:
            features, logits = stage.sessions[0].run(None, {"input": h})
            return features, logits, np.zeros(n, dtype=np.int64)
        choice = stage.predictor.run(None, {"input": h})[0].astype(np.int64)  # (n,)
        used = np.unique(choice)
        if len(used) == 1:
            features, logits = stage.sessions[int(used[0])].run(None, {"input": h})
            return features, logits, choice
        features = logits = None
        for r in used:
            rows = np.flatnonzero(choice == r)
            f, z = stage.sessions[int(r)].run(None, {"input": np.ascontiguousarray(h[rows])})
            if features is None or logits is None:
                features = np.empty((n, *f.shape[1:]), dtype=f.dtype)
                logits = np.empty((n, *z.shape[1:]), dtype=z.dtype)
            features[rows], logits[rows] = f, z
        return features, logits, choice

    def run(self, images_uint8: np.ndarray, *, exits: bool = True,
            thresholds: Sequence[float] | None = None) -> dict[str, np.ndarray]:
        """(N, C, H, W) uint8 -> pred, conf, exit_index (0-based), choices (N, K; -1 not reached), macs.
        ``exits=False`` runs every module on every image (the static path) and answers at the last;
        ``thresholds`` (K-1) replace the exported ones for this call (an operating point's)."""
        cut = self._thresholds(thresholds)
        h = self.preprocess(images_uint8)
        b, k_total = h.shape[0], len(self.stages)
        pred = np.full(b, -1, dtype=np.int64)
        conf = np.zeros(b, dtype=np.float32)
        exit_index = np.full(b, -1, dtype=np.int64)
        choices = np.full((b, k_total), -1, dtype=np.int64)
        macs = np.zeros(b, dtype=np.int64)
        active = np.arange(b)
        running = None
        for k, stage in enumerate(self.stages):
            if active.size == 0:
                break
            features, scores, choice = self._run_stage(stage, h)
            if self.decay > 0.0:
                log_p = _log_softmax(scores.astype(np.float32))
                running = log_p if running is None else np.float32(self.decay) * running + log_p
                scores = running / np.float32(sum(self.decay**j for j in range(k + 1)))
            choices[active, k] = choice
            macs[active] += stage.macs[choice] + stage.predictor_macs
            c = confidence(scores, self.confidence_kind)
            last = k == k_total - 1
            if last:
                leave = np.ones(c.shape, dtype=bool)
            else:
                leave = c >= cut[k] if exits else np.zeros(c.shape, dtype=bool)
            rows = active[leave]
            pred[rows] = scores[leave].argmax(axis=1)
            conf[rows] = c[leave]
            exit_index[rows] = k
            stay = np.flatnonzero(~leave)
            active = active[stay]
            h = np.ascontiguousarray(features[stay])
            if running is not None:
                running = running[stay]
        return {"pred": pred, "conf": conf, "exit_index": exit_index, "choices": choices, "macs": macs}

    def _thresholds(self, thresholds: Sequence[float] | None) -> list[np.float32]:
        """The exits' thresholds in float32 (as the exported ones compare), the call's or the model's."""
        if thresholds is None:
            return [stage.threshold for stage in self.stages]
        values = [float(t) for t in thresholds]
        if len(values) != len(self.stages) - 1 or any(np.isnan(values)):
            raise ValueError(f"{len(self.stages)} stages need {len(self.stages) - 1} thresholds (not NaN), "
                             f"got {list(thresholds)}")
        return [np.float32(t) for t in values] + [np.float32(np.inf)]

    def recognize(self, images_uint8: np.ndarray, *, exits: bool = True,
                  thresholds: Sequence[float] | None = None) -> list[dict[str, Any]]:
        """One row per image, as :func:`pipeline.routing.recognize.recognize_arrays` writes it."""
        out = self.run(images_uint8, exits=exits, thresholds=thresholds)
        keys = [stage.keys for stage in self.stages]
        return [
            {"class_index": int(p), "class_name": self.classes[p], "confidence": float(c), "exit": int(e) + 1,
             "subnets": [NOT_REACHED if r < 0 else keys[k][r] for k, r in enumerate(ch)], "macs": int(m)}
            for p, c, e, ch, m in zip(out["pred"].tolist(), out["conf"].tolist(), out["exit_index"].tolist(),
                                      out["choices"].tolist(), out["macs"].tolist(), strict=True)
        ]
