"""Where the cascade's last exit stops, and what limits it (docs/RESULTS.md "Where the last exit stops"),
side by side in one run.

    dvc repro train@m2                       # the pipeline's modules 1 and 2 (or a full repro)
    python -m bench.archive.ceiling                  # every part: about 35 min on the 2-core machine
    python -m bench.archive.ceiling --part m3        # only module 3 variants (about 12 min)
    python -m bench.archive.ceiling --part distill   # module 1 distilled from plain_large (about 5 min)

Plain PyTorch on cached features. The trained modules before the one under test are frozen (as in
the pipeline), so their outputs on the training images, and on the same images flipped, are
computed once; each candidate module then trains on them with plain cross-entropy, per image a
random flip (one of the two cached views) and a random shift of the feature map by up to
``--shift`` cells (zero padding: the input-side crop's counterpart). Each variant is scored on
``calib`` and, for information, on ``test``: alone, and in the exit ensemble with the frozen exits
before it (decays 0.25 and 0.5, as ``calibrate.ensemble_decays``).

The training recipe is the pipeline's (:func:`recipe`, a ``TrainConfig``): the optimizer of
``pipeline.train.loop.make_optimizer`` (Nesterov SGD, momentum 0.9, weight decay 5e-4 on the weights
and none on BatchNorm and biases), the lr of each step from ``pipeline.train.config.learning_rate``
(cosine from 0.1 to 0, no warmup), batch 128, and for distillation the pipeline's step loss: CE plus
``kd`` times ``pipeline.train.steps.soft_target_loss`` against the teacher's probabilities at
``kd_temperature``. The figures in ``docs/results/ceiling_all.json`` and ``ceiling_distill.json``
(docs/RESULTS.md) were produced before this change by the bench's older loop (weight decay on every
parameter; distillation as (1 - w) CE + w T^2 KL) until re-run.

Parts:
- ``m3``: module 3 variants behind the pipeline's modules 1 and 2 (``--models``): the cheapest path
  of the params' supernet (transition and head, what P(N) selected) for E and 2E epochs, two
  conv3 layers at the same width, double width, and a stride-1 module at 14x14.
- ``m2``: module 2 variants behind the pipeline's module 1 (the params' module 2 retrained here,
  double width, one more layer), each followed by the same small module 3 (64 channels, stride 2,
  no layers): does a stronger module 2 lift what module 3 can reach?
- ``joint``: the params' modules 1 and 2 and module 3's cheapest path trained together end to end
  from the raw images (crop and flip as ``train``; the sum of the three exits' losses): if its last
  exit is no better than the sequential one, freezing earlier modules is not what limits.
- ``distill`` (only when asked): the params' module 1 trained from the raw images with plain
  cross-entropy and distilled (Hinton et al., as the pipeline's ``train.kd``: CE + kd T^2 KL at
  temperature T) from the run's plain_large baseline (``--baselines``), whose logits on the training
  images and their mirror images are computed once: can the strongest model that exists before
  train@m1 lift exit 1?

``--max-train`` and ``--epochs`` shrink the run for a smoke test (the README says which settings
its figures used). The result goes to ``--out`` (default ``bench/out/ceiling.json``; the committed runs
are ``docs/results/ceiling_all.json`` and ``ceiling_distill.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.report import report_parts
from pipeline.io import Split, load_split
from pipeline.models.config import ModelConfig
from pipeline.models.cost import count_macs
from pipeline.models.modules import NO_ARCH, ModuleSpec, build_module
from pipeline.models.store import load_module
from pipeline.params.config import load_params
from pipeline.routing.engine import combine_exits
from pipeline.train.baselines import load_baselines, plain_outputs
from pipeline.train.config import TrainConfig, learning_rate, module_train_config
from pipeline.train.data import ImageBatches, epoch_seed, random_crop
from pipeline.train.loop import make_optimizer
from pipeline.train.steps import soft_target_loss

DECAYS = (0.25, 0.5)
BATCH = 128


@dataclasses.dataclass(frozen=True)
class Views:
    """A frozen prefix's outputs: train (as is and flipped), calib and test features, and the
    earlier exits' logits on calib and test (K, N, classes) for the exit ensemble."""

    train: torch.Tensor
    train_flipped: torch.Tensor
    calib: torch.Tensor
    test: torch.Tensor
    calib_logits: tuple[torch.Tensor, ...] = ()
    test_logits: tuple[torch.Tensor, ...] = ()


@dataclasses.dataclass(frozen=True)
class Soft:
    """A teacher's logits on the training images (N, K), as is and flipped (the two cached views),
    and the pipeline's ``kd`` and ``kd_temperature``: loss = CE + kd T^2 KL(teacher_T || net_T)."""

    train: torch.Tensor
    train_flipped: torch.Tensor
    kd: float
    temperature: float


def recipe(epochs: int, seed: int, batch: int = BATCH, soft: Soft | None = None) -> TrainConfig:
    """The bench's training settings as the pipeline's ``TrainConfig``: lr 0.1, cosine to 0 without
    warmup, momentum 0.9, weight decay 5e-4, plain cross-entropy (lam = mu = 0), and ``soft``'s
    distillation weight and temperature (kd 0: none)."""
    return TrainConfig(epochs=epochs, batch_size=batch, lr=0.1, momentum=0.9, weight_decay=5e-4,
                       schedule="cosine", warmup_epochs=0.0, lam=0.0, mu=0.0, seed=seed,
                       kd=0.0 if soft is None else soft.kd,
                       kd_temperature=1.0 if soft is None else soft.temperature)


def step_loss(logits: torch.Tensor, labels: torch.Tensor, cfg: TrainConfig,
              soft: torch.Tensor | None = None) -> torch.Tensor:
    """The pipeline's loss of a fixed module's step at lam = mu = 0 (``pipeline.train.steps``): CE on the
    labels plus ``cfg.kd`` times its distillation term against ``soft`` (B, K), a teacher's
    probabilities at ``cfg.kd_temperature``."""
    loss = F.cross_entropy(logits, labels)
    if soft is not None and cfg.kd > 0:
        loss = loss + cfg.kd * soft_target_loss(logits, soft, cfg.kd_temperature)
    return loss


def run_batched(net: nn.Module, x: torch.Tensor, batch: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """(features as float16, logits) of a frozen module on ``x``, in eval mode, batch by batch."""
    net.eval()
    feats, logits = [], []
    with torch.no_grad():
        for s in range(0, len(x), batch):
            h, out = net(x[s:s + batch].float(), NO_ARCH)
            feats.append(h.half())
            logits.append(out)
    return torch.cat(feats), torch.cat(logits)


def normalised(split: Split, mean: Sequence[float], std: Sequence[float], flip: bool = False) -> torch.Tensor:
    batches = ImageBatches(split.images, split.labels, 4096, mean=mean, std=std)
    x = torch.cat([xb for xb, _ in batches])  # (N, C, H, W)
    return x.flip(-1) if flip else x


def next_views(net: nn.Module, views: Views) -> Views:
    """The views after one more frozen module: its features, its logits appended."""
    tr, _ = run_batched(net, views.train)
    trf, _ = run_batched(net, views.train_flipped)
    ca, lc = run_batched(net, views.calib)
    te, lt = run_batched(net, views.test)
    return Views(tr, trf, ca, te, (*views.calib_logits, lc), (*views.test_logits, lt))


def fit_on_views(net: nn.Module, views: Views, labels: torch.Tensor, epochs: int, shift: int, seed: int,
                 batch: int = BATCH, soft: Soft | None = None) -> float:
    """Train ``net`` (forward -> (features, logits)) on cached views with the pipeline's recipe
    (:func:`recipe`), with plain cross-entropy or, given ``soft``, distillation from the teacher's
    answer on the same view; returns the seconds taken."""
    cfg = recipe(epochs, seed, batch, soft)
    opt = make_optimizer(net, cfg)
    probs = None  # the teacher's probabilities (N, K) per view at kd_temperature, as the pipeline takes them
    if soft is not None:
        probs = [torch.softmax(t.float() / cfg.kd_temperature, dim=-1)
                 for t in (soft.train, soft.train_flipped)]
    n = len(labels)
    per_epoch, step = n // batch, 0
    start = time.perf_counter()
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(epoch_seed(seed, epoch))
        order = torch.randperm(n, generator=g)
        flipped = torch.rand(n, generator=g) < 0.5
        net.train()
        for s in range(0, n - batch + 1, batch):
            idx = order[s:s + batch]
            view = flipped[idx, None, None, None]
            x = torch.where(view, views.train_flipped[idx], views.train[idx]).float()
            x = random_crop(x, shift, g)
            for group in opt.param_groups:
                group["lr"] = learning_rate(cfg, step, per_epoch)
            logits = net(x, NO_ARCH)[1]
            teacher = None  # (B, K): the teacher's probabilities on the view shown
            if probs is not None:
                teacher = torch.where(view[:, :, 0, 0], probs[1][idx], probs[0][idx])
            loss = step_loss(logits, labels[idx], cfg, teacher)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
    net.eval()
    return time.perf_counter() - start


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return round(100.0 * (logits.argmax(-1) == labels).float().mean().item(), 2)


def scores(last: torch.Tensor, earlier: Sequence[torch.Tensor], labels: torch.Tensor, name: str) -> dict:
    """Accuracy of the last exit alone and in the exit ensemble with the earlier exits."""
    row = {name: accuracy(last, labels)}
    stacked = torch.stack([*earlier, last], dim=1)  # (N, K, classes)
    for decay in DECAYS:
        row[f"{name} ens {decay}"] = accuracy(combine_exits(stacked, decay)[:, -1], labels)
    return row


def evaluate_variant(net: nn.Module, views: Views, y_calib: torch.Tensor, y_test: torch.Tensor) -> dict:
    _, lc = run_batched(net, views.calib)
    _, lt = run_batched(net, views.test)
    return {**scores(lc, views.calib_logits, y_calib, "calib"),
            **scores(lt, views.test_logits, y_test, "test")}


def cheapest_fixed(spec: ModuleSpec) -> ModuleSpec:
    """A supernet's cheapest path (every layer ``skip``) as a fixed module: transition and head."""
    return dataclasses.replace(spec, kind="fixed", layers=0, ops=(), default_op="")


def module_variants(spec: ModuleSpec, epochs: int) -> dict[str, tuple[ModuleSpec, int]]:
    """Part m3: fixed modules in module 3's place (from the params' supernet spec)."""
    base = cheapest_fixed(spec)
    wide = 2 * spec.channels
    return {
        f"cheapest path ({spec.channels} ch, transition + head), {epochs} ep": (base, epochs),
        f"cheapest path, {2 * epochs} ep": (base, 2 * epochs),
        f"+ 2 conv3 at {spec.channels} ch": (dataclasses.replace(base, layers=2), epochs),
        f"{wide} ch + 1 conv3 (stride {spec.stride})":
            (dataclasses.replace(base, channels=wide, layers=1), epochs),
        f"{spec.channels} ch + 1 conv3 at stride 1": (dataclasses.replace(base, stride=1, layers=1), epochs),
    }


def m2_variants(spec: ModuleSpec, epochs: int) -> dict[str, tuple[ModuleSpec, int]]:
    """Part m2: module 2 variants (each followed by the same small module 3)."""
    return {
        f"params' module 2 ({spec.channels} ch, {spec.layers} conv3)": (spec, epochs),
        f"{2 * spec.channels} ch": (dataclasses.replace(spec, channels=2 * spec.channels), epochs),
        f"{spec.layers + 1} conv3": (dataclasses.replace(spec, layers=spec.layers + 1), epochs),
    }


def macs(spec: ModuleSpec, in_shape: Sequence[int], n_classes: int) -> int:
    return count_macs(build_module(spec, in_shape[0], n_classes), tuple(in_shape), NO_ARCH)


def part_modules(variants: dict[str, tuple[ModuleSpec, int]], in_shape, n_classes, views: Views, labels,
                 y_calib, y_test, shift: int, seed: int,
                 then: Callable[[nn.Module, ModuleSpec], dict] | None = None) -> list[dict]:
    rows = []
    for k, (name, (spec, epochs)) in enumerate(variants.items()):
        torch.manual_seed(seed + k)
        net = build_module(spec, in_shape[0], n_classes)
        seconds = fit_on_views(net, views, labels, epochs, shift, seed)
        row = {"variant": name, "macs": macs(spec, in_shape, n_classes), "epochs": epochs,
               "seconds": round(seconds), **evaluate_variant(net, views, y_calib, y_test)}
        if then is not None:
            row.update(then(net, spec))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def joint_net(specs: Sequence[ModuleSpec], in_channels: int, n_classes: int) -> nn.ModuleList:
    mods, c = [], in_channels
    for spec in specs:
        mods.append(build_module(spec, c, n_classes))
        c = spec.channels
    return nn.ModuleList(mods)


def part_joint(specs: Sequence[ModuleSpec], train: Split, calib: Split, test: Split, mean, std,
               epochs: int, crop: int, seed: int) -> list[dict]:
    """The modules trained together end to end (sum of the exits' losses), scored per exit."""
    torch.manual_seed(seed)
    net = joint_net(specs, train.images.shape[1], int(train.labels.max()) + 1)
    cfg = dataclasses.replace(recipe(epochs, seed), crop_padding=crop, flip=True)
    batches = ImageBatches(train.images, train.labels, cfg.batch_size, mean=mean, std=std, shuffle=True,
                           crop_padding=cfg.crop_padding, flip=cfg.flip, drop_last=True, seed=cfg.seed)
    opt = make_optimizer(net, cfg)
    step = 0
    start = time.perf_counter()
    for epoch in range(epochs):
        net.train()
        for x, y in batches.epoch(epoch):
            for group in opt.param_groups:
                group["lr"] = learning_rate(cfg, step, len(batches))
            loss = torch.zeros(())
            for module in net:
                x, logits = module(x, NO_ARCH)
                loss = loss + F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
    seconds = time.perf_counter() - start
    net.eval()
    row: dict = {"variant": f"modules 1-3 trained jointly, {epochs} ep", "seconds": round(seconds)}
    for split in (calib, test):
        x, logits = normalised(split, mean, std), []
        for module in net:
            x, out = run_batched(module, x)
            logits.append(out)
        y = torch.from_numpy(split.labels)
        for k, out in enumerate(logits, start=1):
            row[f"{split.name} exit {k}"] = accuracy(out, y)
        row.update(scores(logits[-1], logits[:-1], y, split.name))
    print(json.dumps(row), flush=True)
    return [row]


def distill_variants(teacher: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Soft | None]:
    """Part distill: module 1 with plain cross-entropy (the control) and distilled from the teacher."""
    return {"cross-entropy (control)": None,
            "distilled from plain_large, kd 0.5, T 4": Soft(*teacher, kd=0.5, temperature=4.0),
            "distilled from plain_large, kd 0.9, T 4": Soft(*teacher, kd=0.9, temperature=4.0)}


def part_distill(spec: ModuleSpec, raw: Views, teacher: tuple[torch.Tensor, torch.Tensor], n_classes: int,
                 labels: torch.Tensor, y_calib: torch.Tensor, y_test: torch.Tensor, epochs: int, crop: int,
                 seed: int) -> list[dict]:
    """Module 1 (the params' spec) trained from the raw images, without and with the teacher."""
    in_shape = tuple(raw.train.shape[1:])
    rows = []
    for name, soft in distill_variants(teacher).items():
        torch.manual_seed(seed)
        net = build_module(spec, in_shape[0], n_classes)
        seconds = fit_on_views(net, raw, labels, epochs, crop, seed, soft=soft)
        rows.append({"variant": name, "macs": macs(spec, in_shape, n_classes), "epochs": epochs,
                     "seconds": round(seconds), **evaluate_variant(net, raw, y_calib, y_test)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("m3", "m2", "joint", "all", "distill"), default="all",
                   help="all = m3, m2 and joint; distill runs only when asked")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--data", type=Path, default=Path("data/prepared"))
    p.add_argument("--models", type=Path, default=Path("models/modules"),
                   help="the trained m1 and m2 come from here")
    p.add_argument("--epochs", type=int, default=0, help="epochs per module (0: the params' own)")
    p.add_argument("--max-train", type=int, default=0, help="first N training images only (0: all)")
    p.add_argument("--shift", type=int, default=1, help="random feature-map shift, in cells")
    p.add_argument("--baselines", type=Path, default=Path("models/baselines"),
                   help="part distill: the teacher (plain_large) comes from here")
    p.add_argument("--out", type=Path, default=Path("bench/out/ceiling.json"))
    args = p.parse_args(argv)
    params = load_params(args.params)
    seed = int(params.get("seed", 0))
    config = ModelConfig.from_params(params)
    specs = config.specs
    epochs_of = [args.epochs or module_train_config(params, name, seed).epochs for name in params["modules"]]
    train, calib, test = (load_split(args.data, s) for s in ("train", "calib", "test"))
    if args.max_train:
        train = train.subset(np.arange(min(args.max_train, len(train))))
    n_classes = len(json.loads((args.data / "meta.json").read_text())["classes"])
    y_train, y_calib, y_test = (torch.from_numpy(s.labels) for s in (train, calib, test))
    m1, info = load_module(args.models / "m1" / "train")
    mean, std = info.mean, info.std
    out: dict = {"settings": {"epochs": epochs_of, "max_train": len(train), "shift": args.shift,
                              "threads": torch.get_num_threads(), "models": str(args.models)}}
    if args.part in ("m3", "m2", "all", "distill"):
        raw = Views(normalised(train, mean, std), normalised(train, mean, std, flip=True),
                    normalised(calib, mean, std), normalised(test, mean, std))
    crop = int(params["train"].get("crop_padding", 2))
    if args.part == "distill":
        base = load_baselines(args.baselines)

        def teacher_logits(images: np.ndarray) -> torch.Tensor:  # (N, K), the baseline's own normalisation
            return plain_outputs(base.large, images, base.meta.mean, base.meta.std)[0]

        flipped = np.ascontiguousarray(train.images[..., ::-1])  # (N, C, H, W) mirrored left-right
        teacher = (teacher_logits(train.images), teacher_logits(flipped))
        out["teacher"] = {"plain_large test": accuracy(teacher_logits(test.images), y_test)}
        out["distill"] = part_distill(specs[0], raw, teacher, n_classes, y_train, y_calib, y_test,
                                      epochs_of[0], crop, seed)
    if args.part in ("m3", "m2", "all"):
        after_m1 = next_views(m1, raw)
        in2 = tuple(after_m1.train.shape[1:])
    if args.part in ("m3", "all"):
        m2, _ = load_module(args.models / "m2" / "train")
        after_m2 = next_views(m2, after_m1)
        out["m3"] = part_modules(module_variants(specs[2], epochs_of[2]), tuple(after_m2.train.shape[1:]),
                                 n_classes, after_m2, y_train, y_calib, y_test, args.shift, seed)
    small_m3 = cheapest_fixed(specs[2])  # the module 3 behind each module 2 variant, and in the joint net
    if args.part in ("m2", "all"):

        def then(net: nn.Module, spec: ModuleSpec) -> dict:
            views = next_views(net, after_m1)
            m3 = build_module(small_m3, spec.channels, n_classes)
            fit_on_views(m3, views, y_train, epochs_of[2], args.shift, seed)
            return {f"then m3 {k}": v for k, v in evaluate_variant(m3, views, y_calib, y_test).items()}

        out["m2"] = part_modules(m2_variants(specs[1], epochs_of[1]), in2, n_classes, after_m1, y_train,
                                 y_calib, y_test, 2 * args.shift, seed, then)
    if args.part in ("joint", "all"):
        out["joint"] = part_joint((specs[0], specs[1], small_m3), train, calib, test, mean, std,
                                  max(epochs_of[:2]), crop, seed)
    report_parts(out, ("m3", "m2", "joint", "distill"), args.out, args.part)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
