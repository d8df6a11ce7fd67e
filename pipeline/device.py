"""Where torch runs: the ``compute`` section (:class:`ComputeConfig`), resolving ``compute.device`` to a
``torch.device``, the ``compute.precision`` autocast context, moving frozen prefixes and engine stages,
and whether a dataset fits on the device.

On the CPU with fp32 nothing here changes a result but the training layout (:func:`memory_format`,
which changes only float rounding): the same ops run on the same tensors. Saved weights and JSON stay
device-independent: callers save CPU copies (:func:`cpu_state_dict`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from pipeline.params.choices import DEVICE_PATTERN, PRECISIONS, ConfigError
from pipeline.params.settings import schema_config


class DeviceError(ConfigError, RuntimeError):
    """A requested device this machine does not have (a ConfigError, so stages report it in one line;
    a RuntimeError, because it depends on the machine, not only on the file)."""


def resolve_device(name: str, key: str = "compute.device") -> torch.device:
    """``auto`` -> cuda if available else cpu; ``cpu``; ``cuda``; ``cuda:N``. ``key`` names the setting
    in errors (``compute.device`` or a CLI flag such as ``--device``)."""
    if not isinstance(name, str) or re.fullmatch(DEVICE_PATTERN, name.strip()) is None:
        raise ConfigError(f"{key} must be auto, cpu, cuda or cuda:N (N an int >= 0), got {name!r}")
    name = name.strip()
    if name == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if name == "auto":
        return torch.device("cuda") if available else torch.device("cpu")
    if not available:
        raise DeviceError(f"{key} is {name!r} but CUDA is not available on this machine "
                          f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use auto or cpu")
    if name == "cuda":
        return torch.device("cuda")
    index, count = int(name.split(":", 1)[1]), torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"{key} is {name!r} but this machine has {count} CUDA device(s) "
                          f"(cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively: any CUDA device, or a CPU whose oneDNN has bf16 kernels
    (AVX512-BF16 or AMX); elsewhere bf16 is emulated, slower than fp32."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def check_precision(precision: str, device: torch.device, key: str = "compute.precision") -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"{key} must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16" and not native_bf16(device):
        raise ConfigError(f"{key} bf16 needs a CUDA device or a CPU with native bf16 (AVX512-BF16 or AMX), "
                          f"got {device} without it; use fp32")


@schema_config("compute")
class ComputeConfig:
    """Where torch runs (``compute``; optional: defaults ``auto`` and ``fp32``, so older params files
    still work). ``device``: auto (cuda if available, else cpu) | cpu | cuda | cuda:N, resolved to a
    ``torch.device`` by :func:`resolve_device` at run time (:meth:`resolve`; building the config checks
    only the spelling). ``precision``: fp32 | bf16 (bf16 autocast on CUDA or on a CPU with native bf16,
    checked by :meth:`resolve`)."""

    @classmethod
    def of(cls, device: str, precision: str = "fp32") -> ComputeConfig:
        """A checked config from the two strings (also what ``--device`` flags build)."""
        return cls.from_params({"compute": {"device": device, "precision": precision}})

    def resolve(self) -> torch.device:
        """The ``torch.device`` to run on (:func:`resolve_device`); bf16 on a device without native bf16
        (:func:`native_bf16`) is a :class:`ConfigError` naming ``compute.precision``."""
        device = resolve_device(self.device)
        check_precision(self.precision, device)
        return device


def autocast(device: torch.device, precision: str = "fp32") -> AbstractContextManager[Any]:
    """bf16 autocast on ``device`` (CUDA, or a CPU with native bf16) for ``bf16``; a no-op context for
    ``fp32`` (results as without it). Losses are computed on float32 logits either way (CPU autocast
    leaves ``log_softmax`` in bf16, where ``1 - 1e-6`` rounds to 1: docs/RESULTS.md "bf16 on the CPU")."""
    check_precision(precision, device)
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def fits_on_device(nbytes: int, device: torch.device, share: float = 0.5) -> bool:
    """Whether ``nbytes`` (e.g. a uint8 dataset) fit in ``share`` of the device's free memory. Always
    True on the CPU (the data is there already)."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    if device.type != "cuda":
        return True
    free, _total = torch.cuda.mem_get_info(device)
    return int(nbytes) <= share * free


def device_name(device: torch.device) -> str:
    """A readable name of the device: the GPU model on CUDA, ``cpu`` otherwise."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def to_device(modules: Iterable[nn.Module | None], device: torch.device) -> None:
    """Move modules in place (``nn.Module.to``); None entries are skipped. A no-op on the CPU for
    modules already there (the same parameter tensors stay)."""
    for module in modules:
        if module is not None:
            module.to(device)


def prefix_to(prefix: Any, device: torch.device) -> Any:
    """Move the frozen modules of a ``pipeline.train.prefix.Prefix`` in place; returns the prefix."""
    to_device((m for m, _ in prefix.stages), device)
    return prefix


def stages_to(stages: Iterable[Any], device: torch.device) -> list[Any]:
    """Move each engine ``Stage``'s module and predictor in place; returns the stages as a list."""
    stages = list(stages)
    for stage in stages:
        to_device((stage.module, stage.predictor), device)
    return stages


MEMORY_FORMATS = ("channels_last", "contiguous")

# PyTorch's channels_last BatchNorm kernel on the CPU vectorises over channels, and at narrow widths that do
# not fill its vectors it runs a slow path: a plain CNN's training step at 4, 6 or 12 channels ran 1.4-1.7x
# faster with those norms in the standard layout (two copies around each) and channels_last everywhere else.
# At 8 channels the copies cost what they save; from 16 on they gain little or lose (20: 1.11x; 16, 24, 28,
# 36 and ShuffleNetV2's 58 and 116: 0.7-0.8x). So inside :func:`memory_format` a norm narrower than 16
# channels whose width is not a multiple of 8 reads and writes the standard layout (docs/RESULTS.md
# "BatchNorm layers of odd widths").
NORM_CHANNEL_MULTIPLE = 8
NORM_NARROW_BELOW = 16


def _standard_layout_in(_norm: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and x.dim() == 4 and x.device.type == "cpu":
        return (x.contiguous(), *args[1:])  # (B, C, H, W), standard strides
    return None


def _channels_last_out(_norm: nn.Module, _args: tuple[Any, ...], out: Any) -> Any:
    if isinstance(out, torch.Tensor) and out.dim() == 4 and out.device.type == "cpu":
        return out.contiguous(memory_format=torch.channels_last)  # (B, C, H, W), channels_last strides
    return None


def standard_layout_hooks(norm: nn.Module) -> list[Any]:
    """Hooks (their removable handles) that make ``norm`` read and write the standard layout on the CPU
    and hand its output on in channels_last."""
    return [norm.register_forward_pre_hook(_standard_layout_in), norm.register_forward_hook(_channels_last_out)]


def odd_width_norms(modules: Iterable[nn.Module]) -> list[nn.BatchNorm2d]:
    """The BatchNorm2d layers of ``modules`` narrower than :data:`NORM_NARROW_BELOW` channels whose width
    is not a multiple of :data:`NORM_CHANNEL_MULTIPLE`: those :func:`memory_format` runs in the standard
    layout on the CPU."""
    return [m for module in modules for m in module.modules() if isinstance(m, nn.BatchNorm2d)
            and m.num_features < NORM_NARROW_BELOW and m.num_features % NORM_CHANNEL_MULTIPLE != 0]


@contextlib.contextmanager
def memory_format(modules: Iterable[nn.Module], name: str = "channels_last",
                  standard_norms: bool = True) -> Any:
    """Run the block with the modules' 4-D weights in ``name`` layout, and put them back in the
    standard (contiguous) layout after it, whatever happens. Only the layout changes, never a value:
    ``channels_last`` (NHWC) lets oneDNN's and cuDNN's convolution kernels skip a layout conversion
    per call (1.3-1.7x training throughput on the 2-core CPU, ``python -m bench.train_throughput``);
    results then differ from ``contiguous`` at float rounding level, and are deterministic either way.
    With ``channels_last`` and ``standard_norms``, the BatchNorm layers of :func:`odd_width_norms` run on
    the CPU in the standard layout, through hooks removed on exit."""
    if name not in MEMORY_FORMATS:
        raise ValueError(f"memory format must be one of {MEMORY_FORMATS}, got {name!r}")
    modules = list(modules)
    hooks = []
    if name == "channels_last":
        for module in modules:
            module.to(memory_format=torch.channels_last)
        for norm in odd_width_norms(modules) if standard_norms else ():
            hooks += standard_layout_hooks(norm)
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        for module in modules:
            module.to(memory_format=torch.contiguous_format)


def as_memory_format(x: torch.Tensor, name: str) -> torch.Tensor:
    """A 4-D batch in the layout of :func:`memory_format` (``contiguous``: as it is)."""
    return x.contiguous(memory_format=torch.channels_last) if name == "channels_last" and x.dim() == 4 else x


def cpu_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with every tensor on the CPU (what gets saved, whatever the device). For a
    module on the CPU it is ``state_dict()`` itself, so saved files stay byte-identical."""
    state = module.state_dict()
    for key, value in list(state.items()):
        if value.device.type != "cpu":
            state[key] = value.cpu()
    return state
