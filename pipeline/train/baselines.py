"""Plain-CNN baselines for the cascade: a small and a large single-exit CNN, their training, storage
and outputs (the one more accurate on held-out images is also the distillation teacher,
:meth:`Baselines.teacher`, :func:`teacher_probabilities`).

``PlainCNN`` (:mod:`pipeline.models.modules`, where a run can also ship one alone) has the surface of
a fixed cascade module (``space``, ``default_arch()``, ``forward(x, arch) -> (features, logits)``),
so ``pipeline.train.loop.train_module`` trains it with an empty prefix and the cost-aware loss
turned off (``lam = mu = 0``: plain cross-entropy).

The two chained (the two-CNN cascade), with its threshold calibrated by the cascade's own rule, are
:mod:`pipeline.evaluation.two_cnn`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.models.cost import count_macs
from pipeline.models.modules import CONFIDENCE_KINDS, NO_ARCH, PlainCNN, confidence
from pipeline.params.settings import schema_config, settings
from pipeline.train.config import TrainConfig, epochs_for, step_floor
from pipeline.train.loop import train_module
from pipeline.train.paths import module_outputs
from pipeline.train.prefix import Prefix

SMALL, LARGE, TWO_CNN = "plain_small", "plain_large", "two_cnn_cascade"
META_FILE = "baselines.json"
FORMAT_VERSION = 1
EVAL_BATCH = 512

EpochCallback = Callable[[int, dict[str, Any], nn.Module, Any], None]


# ----------------------------------------------------------------------------------------- model


def plain_macs(module: PlainCNN, image_shape: Sequence[int]) -> int:
    """MACs per image of ``module`` on images of shape (C, H, W)."""
    return count_macs(module, tuple(int(v) for v in image_shape))


# ----------------------------------------------------------------------------------------- config


@schema_config("baselines", checked=True)
class BaselineConfig:
    """The ``baselines`` params section: the two widths and their training recipe, the same keys as the
    modules' ``train`` section (pipeline.params.schema.BASELINES takes them from TRAIN)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> BaselineConfig:
        """Build from the ``baselines`` section (None or {} = defaults), checked by the schema."""
        return cls(**vars(settings({"baselines": d}, "baselines")))

    def floor(self, hard: bool) -> int:
        """The step floor: ``min_steps``, or ``min_steps_hard`` on hard data (as the modules')."""
        return step_floor(self.min_steps, self.min_steps_hard, hard)

    def sized_to(self, images: int, hard: bool = False) -> BaselineConfig:
        """The recipe with its epochs raised to its step floor over ``images`` images."""
        return replace(self, epochs=epochs_for(self.epochs, self.floor(hard), images, self.batch_size))

    def train_config(self, seed: int) -> TrainConfig:
        """The recipe as a ``TrainConfig``: its keys, plain cross-entropy (lam = mu = 0)."""
        recipe = {k: v for k, v in self.section().items() if k not in ("small_width", "large_width")}
        return TrainConfig(**recipe, lam=0.0, mu=0.0, seed=seed)


# ----------------------------------------------------------------------------------------- training


def train_baseline(width: int, images_uint8: np.ndarray, labels: np.ndarray, mean: Sequence[float],
                   std: Sequence[float], num_classes: int, cfg: BaselineConfig, seed: int,
                   **options: Any) -> PlainCNN:
    """A ``PlainCNN`` of ``width`` trained on images (N, C, H, W) uint8, returned on the CPU in eval mode;
    ``options`` (``on_epoch``, ``progress``, ``device``, ``precision``) as :func:`train_single_exit` takes them."""
    return train_single_exit(lambda c: PlainCNN(width, c, num_classes), images_uint8, labels, mean, std, cfg,
                             seed, **options)


def train_single_exit(
    build: Callable[[int], nn.Module],
    images_uint8: np.ndarray,
    labels: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    cfg: BaselineConfig,
    seed: int,
    *,
    on_epoch: EpochCallback | None = None,
    progress: bool = True,
    device: torch.device | None = None,
    precision: str = "fp32",
) -> nn.Module:
    """A single-exit net ``build(in_channels)`` (a ``PlainCNN``, or one of the field's nets of
    :mod:`pipeline.models.anchors`) trained by the baselines' recipe on images (N, C, H, W) uint8, returned
    on the CPU in eval mode.

    Initial weights come from ``seed`` in a forked RNG (the caller's global RNG is untouched); data
    order and augmentation from ``seed`` too, so the same inputs give bitwise-identical weights on CPU.
    ``device`` (default: the CPU) is where it trains (weights initialised on the CPU, then moved);
    ``precision`` (``compute.precision``) is passed on to ``train_module``."""
    images_uint8 = np.asarray(images_uint8)
    if images_uint8.ndim != 4 or images_uint8.dtype != np.uint8:
        raise ValueError(f"images must be uint8 (N, C, H, W), got {images_uint8.dtype} {images_uint8.shape}")
    image_shape = tuple(int(v) for v in images_uint8.shape[1:])  # (C, H, W)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build(image_shape[0])
    macs = count_macs(module, image_shape)
    labels = np.asarray(labels, dtype=np.int64)  # (N,)
    module.to(torch.device("cpu") if device is None else device)
    train_module(module, Prefix((), tuple(mean), tuple(std)), images_uint8, labels, cfg.train_config(seed),
                 cost_of=lambda _arch: macs, cost_max=macs, exit_saving=0.0,
                 on_epoch=on_epoch, progress=progress, precision=precision)
    return module.cpu().eval()


# ----------------------------------------------------------------------------------------- outputs


def plain_outputs(module: nn.Module, images_uint8: np.ndarray, mean: Sequence[float], std: Sequence[float],
                  kind: str = "maxprob") -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (N, K) and confidence (N,) of ``module`` on images (N, C, H, W) uint8, no augmentation."""
    logits, _ = module_outputs(module, Prefix((), tuple(mean), tuple(std)), images_uint8, NO_ARCH, EVAL_BATCH)
    logits = logits.float()  # on the CPU; float32 also after a bf16 autocast run (a no-op otherwise)
    return logits, confidence(logits, kind)  # (N, K), (N,)


# ----------------------------------------------------------------------------------------- storage


@dataclass(frozen=True)
class BaselinesMeta:
    """What ``baselines.json`` records beside the two state dicts."""

    small_width: int
    large_width: int
    in_channels: int
    num_classes: int
    image_shape: tuple[int, int, int]  # (C, H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    macs_small: int
    macs_large: int
    threshold: float
    confidence_kind: str
    calib: dict[str, Any]  # calib-split figures (accuracies, MACs, delta, grid, ...)

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_shape", tuple(int(v) for v in self.image_shape))
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if len(self.image_shape) != 3 or self.image_shape[0] != self.in_channels:
            raise ValueError(f"image_shape must be (C, H, W) with C = in_channels = {self.in_channels}, "
                             f"got {self.image_shape}")
        if self.confidence_kind not in CONFIDENCE_KINDS:
            raise ValueError(f"confidence_kind must be one of {CONFIDENCE_KINDS}, "
                             f"got {self.confidence_kind!r}")

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BaselinesMeta:
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"unsupported format {d.get('format')!r} (expected {FORMAT_VERSION})")
        return cls(**{f.name: d[f.name] for f in fields(cls)})


@dataclass
class Baselines:
    """The two trained nets (eval mode) and their record."""

    small: PlainCNN
    large: PlainCNN
    meta: BaselinesMeta

    def by_name(self, name: str) -> tuple[PlainCNN, int]:
        """The net called ``name`` (``plain_small`` or ``plain_large``) and its MACs per image."""
        if name == SMALL:
            return self.small, self.meta.macs_small
        if name == LARGE:
            return self.large, self.meta.macs_large
        raise ValueError(f"no plain CNN called {name!r} (have {SMALL}, {LARGE})")

    def teacher(self) -> tuple[str, PlainCNN, str]:
        """The distillation teacher: the net more accurate on the held-out (calib) images, ``plain_large``
        on a tie; its name, the net and a line saying why. A net stuck near chance (a plain CNN that never
        left its plateau) would teach its own mistakes (docs/DESIGN.md "Your own data", the teacher)."""
        accuracy = {name: float(self.meta.calib[name]["calib_accuracy"]) for name in (SMALL, LARGE)}
        name = SMALL if accuracy[SMALL] > accuracy[LARGE] else LARGE
        other = LARGE if name == SMALL else SMALL
        why = f"calib accuracy {accuracy[name]:.4f}, {other} {accuracy[other]:.4f}"
        return name, self.by_name(name)[0], why


def save_baselines(directory: str | os.PathLike[str], small: PlainCNN, large: PlainCNN,
                   meta: BaselinesMeta) -> None:
    """Write ``plain_small.pt``, ``plain_large.pt`` (state dicts) and ``baselines.json`` into ``directory``
    (created if needed; wrap it in ``atomic_path(..., is_dir=True)`` for an all-or-nothing write)."""
    for name, module, width in ((SMALL, small, meta.small_width), (LARGE, large, meta.large_width)):
        expected = (width, meta.in_channels, meta.num_classes)
        if (module.width, module.in_channels, module.num_classes) != expected:
            raise ValueError(f"{name}: module (width {module.width}, {module.in_channels} channels, "
                             f"{module.num_classes} classes) does not match its record")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, module in ((SMALL, small), (LARGE, large)):
        torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, directory / f"{name}.pt")
    (directory / META_FILE).write_text(json.dumps(meta.to_json(), indent=2) + "\n")


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"baseline weights {path} are missing; run the baselines stage first")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types (RuntimeError, UnpicklingError, EOFError...)
        raise ValueError(f"baseline weights {path} are unreadable or corrupt: {exc}") from None
    if not isinstance(state, dict):
        raise ValueError(f"baseline weights {path} do not hold a state dict")
    return state


def load_baselines(directory: str | os.PathLike[str]) -> Baselines:
    """Read what ``save_baselines`` wrote; the nets come back on CPU in eval mode."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"baselines record {meta_path} is missing; run the baselines stage first")
    try:
        meta = BaselinesMeta.from_json(json.loads(meta_path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"baselines record {meta_path} is unreadable or incomplete: {exc!r}") from None
    nets = []
    records = ((SMALL, meta.small_width, meta.macs_small), (LARGE, meta.large_width, meta.macs_large))
    for name, width, macs in records:
        path = directory / f"{name}.pt"
        module = PlainCNN(width, meta.in_channels, meta.num_classes)
        try:
            module.load_state_dict(_load_state(path))
        except RuntimeError as exc:  # missing / unexpected keys, wrong shapes
            raise ValueError(f"baseline weights {path} do not fit a width-{width} PlainCNN: {exc}") from None
        if plain_macs(module, meta.image_shape) != macs:
            raise ValueError(f"{meta_path}: recorded MACs of {name} ({macs}) differ from the net's")
        nets.append(module.eval())
    return Baselines(nets[0], nets[1], meta)


def teacher_probabilities(module: nn.Module, images_uint8: np.ndarray, mean: Sequence[float],
                          std: Sequence[float], temperature: float = 1.0) -> np.ndarray:
    """Soft targets (N, K) float32 for distillation: softmax(logits / temperature) of ``module`` on
    each image, averaged with the same on its mirror image (training flips images, so the target is
    the teacher's flip-averaged view and does not depend on which of the two the student sees)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    images_uint8 = np.asarray(images_uint8)
    prefix = Prefix((), tuple(mean), tuple(std))
    probs = []
    for view in (images_uint8, np.ascontiguousarray(images_uint8[..., ::-1])):
        logits, _ = module_outputs(module, prefix, view, NO_ARCH, EVAL_BATCH)  # (N, K)
        probs.append(torch.softmax(logits.double() / temperature, dim=-1))
    soft = (probs[0] + probs[1]) / 2
    return (soft / soft.sum(dim=-1, keepdim=True)).float().numpy()
