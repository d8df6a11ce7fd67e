"""The cascade's cost model: per module, MACs of every (layer, op) and a measured latency table.

Written once by the ``profile`` stage, read by training, search and evaluation, so every reported
cost comes from one place. The stage splits the table (:func:`split_profile`): the deterministic part
(shapes, MACs, default paths) is its DVC output ``models/profile.json``, identical between runs; the
measured part (milliseconds, thread count) goes to a metrics file and MLflow, never to a DVC output,
and is laid back over the costs by :meth:`CostModel.load` where it exists. Without it, latencies are
None (nothing the pipeline decides depends on them: they are reported only).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes
from pipeline.models.cost import fixed_macs, measure_latency_table, op_mac_table, path_latency, path_macs
from pipeline.search.space import Arch


def profile_cascade(spec: CascadeSpec, *, seed: int, repeats: int, batch_sizes: tuple[int, ...] = (1, 64),
                    progress=None, device: torch.device | None = None) -> dict[str, Any]:
    """Cost tables of every module of ``spec`` (weights do not matter: costs depend on shapes only).
    MACs are counted on the CPU; latencies are measured on ``device`` (default: the CPU), which the
    measured part of the table records (``device``)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    modules = build_modules(spec, seed)
    shapes = feature_shapes(spec)
    out = []
    with torch.no_grad():
        for k, (module, shape) in enumerate(zip(modules, shapes, strict=False), start=1):
            macs, op_macs = fixed_macs(module, shape), op_mac_table(module, shape)
            latency = measure_latency_table(module.to(device), shape, batch_sizes=batch_sizes, repeats=repeats,
                                            seed=seed)
            out.append({
                "module": k,
                "kind": spec.modules[k - 1].kind,
                "input_shape": list(shape),
                "output_shape": list(shapes[k]),
                "fixed_macs": macs,
                "op_macs": op_macs,
                "latency_ms": {str(b): t for b, t in latency.items()},
                "default_arch": module.default_arch().key(),
            })
            if progress is not None:
                progress.update(1)
    return {"batch_sizes": list(batch_sizes), "threads": torch.get_num_threads(), "device": str(device),
            "modules": out}


LATENCY_FILE = Path("metrics") / "profile_latency.json"  # default, relative to the repository root
MEASURED_KEYS = ("latency_ms",)  # per module: wall-clock measurements
MEASURED_TOP = ("threads", "device")  # of the whole table: the conditions of the measurement


def split_profile(table: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(deterministic costs, measured latencies) of a :func:`profile_cascade` table. The first holds
    no timing (byte-identical between runs on any machine); the second holds ``threads``,
    ``batch_sizes`` and per module ``{"module": k, "latency_ms": ...}``."""
    costs = {k: copy.deepcopy(v) for k, v in table.items() if k not in MEASURED_TOP}
    measured: dict[str, Any] = {k: table[k] for k in MEASURED_TOP if k in table}
    measured["batch_sizes"] = list(table.get("batch_sizes", []))
    measured["modules"] = []
    for m in costs.get("modules", []):
        measured["modules"].append({"module": m["module"], **{k: m.pop(k) for k in MEASURED_KEYS if k in m}})
    return costs, measured


def merge_profile(costs: Mapping[str, Any], measured: Mapping[str, Any] | None) -> dict[str, Any]:
    """Inverse of :func:`split_profile` (``measured`` None: the costs alone)."""
    table = copy.deepcopy(dict(costs))
    if not measured:
        return table
    table.update({k: measured[k] for k in MEASURED_TOP if k in measured})
    by_module = {m["module"]: m for m in measured.get("modules", [])}
    for m in table.get("modules", []):
        m.update({k: v for k, v in by_module.get(m["module"], {}).items() if k != "module"})
    return table


@dataclass(frozen=True)
class CostModel:
    """Read-only view of the profile: the cost of any path of any module (k is 1-based)."""

    table: Mapping[str, Any]

    def _m(self, k: int) -> Mapping[str, Any]:
        return self.table["modules"][k - 1]

    @property
    def n_modules(self) -> int:
        return len(self.table["modules"])

    def macs(self, k: int, arch: Arch) -> int:
        m = self._m(k)
        return path_macs(m["op_macs"], m["fixed_macs"], arch) if m["op_macs"] else int(m["fixed_macs"])

    @classmethod
    def load(cls, profile: str | os.PathLike[str],
             latency: str | os.PathLike[str] | None = None) -> CostModel:
        """The costs of ``profile`` with the measured latencies of ``latency`` laid over them, when
        that file exists (see :func:`split_profile`)."""
        import json

        costs = json.loads(Path(profile).read_text())
        measured = None
        if latency is not None and Path(latency).is_file():
            measured = json.loads(Path(latency).read_text())
        return cls(merge_profile(costs, measured))

    def has_latency(self, k: int) -> bool:
        return "latency_ms" in self._m(k)

    def latency_ms(self, k: int, arch: Arch, batch: int = 1) -> float | None:
        """Measured milliseconds of a path, or None when the profile carries no measurement."""
        if not self.has_latency(k) or str(batch) not in self._m(k)["latency_ms"]:
            return None
        lat = self._m(k)["latency_ms"][str(batch)]
        return path_latency(lat["layers"], lat["fixed"], arch) if lat["layers"] else float(lat["fixed"])

    def max_macs(self, k: int) -> int:
        m = self._m(k)
        return int(m["fixed_macs"] + sum(max(ops.values()) for ops in m["op_macs"].values()))

    def min_macs(self, k: int) -> int:
        m = self._m(k)
        return int(m["fixed_macs"] + sum(min(ops.values()) for ops in m["op_macs"].values()))

    def default_arch(self, k: int) -> Arch:
        return Arch.from_key(self._m(k)["default_arch"])

    def exit_saving(self, k: int) -> float:
        """s_k: the share of the cascade's cost (default paths) that an exit at module k saves."""
        costs = [self.macs(j, self.default_arch(j)) for j in range(1, self.n_modules + 1)]
        return float(sum(costs[k:]) / sum(costs))
