"""The cascade's cost model: per module, MACs of every (layer, op) and a measured latency table.

Written once by the ``profile`` stage (DVC caches it), read by training, search and evaluation, so
every reported cost comes from one place: MACs (deterministic) and milliseconds, side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes
from pipeline.models.cost import fixed_macs, measure_latency_table, op_mac_table, path_latency, path_macs
from pipeline.search.space import Arch


def profile_cascade(spec: CascadeSpec, *, seed: int, repeats: int, batch_sizes: tuple[int, ...] = (1, 64),
                    progress=None) -> dict[str, Any]:
    """Cost tables of every module of ``spec`` (weights do not matter: costs depend on shapes only)."""
    modules = build_modules(spec, seed)
    shapes = feature_shapes(spec)
    out = []
    with torch.no_grad():
        for k, (module, shape) in enumerate(zip(modules, shapes, strict=False), start=1):
            latency = measure_latency_table(module, shape, batch_sizes=batch_sizes, repeats=repeats, seed=seed)
            out.append({
                "module": k,
                "kind": spec.modules[k - 1].kind,
                "input_shape": list(shape),
                "output_shape": list(shapes[k]),
                "fixed_macs": fixed_macs(module, shape),
                "op_macs": op_mac_table(module, shape),
                "latency_ms": {str(b): t for b, t in latency.items()},
                "default_arch": module.default_arch().key(),
            })
            if progress is not None:
                progress.update(1)
    return {"batch_sizes": list(batch_sizes), "threads": torch.get_num_threads(), "modules": out}


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

    def latency_ms(self, k: int, arch: Arch, batch: int = 1) -> float:
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
