"""Computation cost of a module path: MACs (deterministic) and a wall-clock lookup table.

Both are additive over a supernet's layers, so a path's cost is ``fixed + sum(table[layer][op])``:
measured once per (layer, op), then priced for any architecture without running it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from pipeline.models.modules import SupernetModule, eval_mode
from pipeline.search.space import Arch

Shape = Sequence[int]  # (C, H, W), no batch dimension
CostTable = Mapping[str, Mapping[str, float]]  # layer label -> op -> cost


def _device_dtype(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    param = next(module.parameters(), None)
    return (param.device, param.dtype) if param is not None else (torch.device("cpu"), torch.float32)


def _call(module: nn.Module, x: torch.Tensor, arch: Arch | None) -> Any:
    return module(x) if arch is None else module(x, arch)


def count_macs(module: nn.Module, input_shape: Shape, arch: Arch | None = None) -> int:
    """Multiply-accumulates per image of Conv2d (grouped too) and Linear layers that actually run.

    BN, ReLU, pooling, residual adds and biases are ignored: they are small, and this matches
    ``torch.utils.flop_counter`` (FLOPs = 2 * MACs). ``arch`` is passed to ``forward`` if given.
    """
    total = [0]

    def conv_hook(m: nn.Conv2d, _inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        total[0] += output.numel() * (m.in_channels // m.groups) * math.prod(m.kernel_size)

    def linear_hook(m: nn.Linear, _inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        total[0] += output.numel() * m.in_features

    handles = []
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
    device, dtype = _device_dtype(module)
    try:
        with eval_mode(module), torch.no_grad():
            _call(module, torch.zeros(1, *input_shape, device=device, dtype=dtype), arch)  # (1, C, H, W)
    finally:
        for handle in handles:
            handle.remove()
    return total[0]


def op_mac_table(module: nn.Module, input_shape: Shape) -> dict[str, dict[str, int]]:
    """MACs of every candidate op of every searchable layer; empty for a module without decisions."""
    if not isinstance(module, SupernetModule):
        return {}
    layer_shape = module.spec.output_shape(input_shape)
    return {
        label: {op: count_macs(layer[op], layer_shape) for op in layer}
        for label, layer in zip(module.space.labels, module.layers, strict=True)
    }


def fixed_macs(module: nn.Module, input_shape: Shape) -> int:
    """MACs every path pays: transition + exit head of a supernet, or the whole of any other module."""
    if not isinstance(module, SupernetModule):
        return count_macs(module, input_shape)
    layer_shape = module.spec.output_shape(input_shape)
    return count_macs(module.transition, input_shape) + count_macs(module.head, layer_shape)


def _path_sum(table: CostTable, fixed: float, arch: Arch) -> float:
    labels = [label for label, _ in arch.items]
    if sorted(labels) != sorted(table):
        raise ValueError(f"arch layers {labels} do not match the cost table's layers {sorted(table)}")
    return fixed + sum(table[label][op] for label, op in arch.items)


def path_macs(table: Mapping[str, Mapping[str, int]], fixed: int, arch: Arch) -> int:
    """MACs of one path, priced from the table (equals ``count_macs(module, shape, arch)``)."""
    return int(_path_sum(table, fixed, arch))


def path_latency(table: CostTable, fixed: float, arch: Arch) -> float:
    """Milliseconds of one path at one batch size: ``fixed + sum`` over the layers' chosen ops."""
    return float(_path_sum(table, fixed, arch))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, repeats: int, warmup: int) -> float:
    """Median wall time of ``fn(x)`` in ms; the median shrugs off scheduler hiccups."""
    for _ in range(warmup):
        fn(x)
    _sync(x.device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x)
        _sync(x.device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure_latency_table(
    module: nn.Module,
    input_shape: Shape,
    batch_sizes: Sequence[int] = (1, 64),
    repeats: int = 20,
    warmup: int = 2,
    seed: int = 0,
) -> dict[int, dict[str, Any]]:
    """Per batch size: ``{"fixed": ms, "layers": {label: {op: ms}}}`` (median over ``repeats``).

    A supernet's fixed part is transition + head; any other module is timed whole as "fixed".
    Keys are ints (JSON turns them into strings: convert back on load).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    device, dtype = _device_dtype(module)
    generator = torch.Generator().manual_seed(seed)
    table: dict[int, dict[str, Any]] = {}
    with eval_mode(module), torch.inference_mode():
        for batch in batch_sizes:
            x = torch.randn(batch, *input_shape, generator=generator).to(device, dtype)  # (B, C, H, W)
            if not isinstance(module, SupernetModule):
                table[batch] = {"fixed": _median_ms(module, x, repeats, warmup), "layers": {}}
                continue
            h = module.transition(x)  # (B, C', H', W')
            fixed = _median_ms(module.transition, x, repeats, warmup)
            fixed += _median_ms(module.head, h, repeats, warmup)
            layers = {
                label: {op: _median_ms(layer[op], h, repeats, warmup) for op in layer}
                for label, layer in zip(module.space.labels, module.layers, strict=True)
            }
            table[batch] = {"fixed": fixed, "layers": layers}
    return table
