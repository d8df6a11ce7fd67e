"""The train stage's workflow (``stages.train`` parses, relaunches under torchrun where asked, holds the
checkpoint lock and writes): module k's plan (:func:`plan_module`: its curriculum, the frozen routed
prefix of modules 1..k-1, the resolved recipe, its tries and checkpoint keys), its training
(:func:`train_tries`) and the kept try's outputs and metrics (:func:`finish_module`)
(docs/DESIGN.md "Stages and workflows"). It lives with routing: module k trains behind the routed
prefix."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.data.difficulty import hard_setting_applies
from pipeline.device import prefix_to
from pipeline.io import Split, load_split, read_json
from pipeline.models.config import ModelConfig
from pipeline.models.profile import CostModel
from pipeline.models.store import ModuleInfo
from pipeline.routing.assemble import load_prefix
from pipeline.train import distributed
from pipeline.train.config import TrainConfig, best_try, epochs_note, sized_to, step_floor, tries_on
from pipeline.train.inputs import curriculum, distillation_targets, initial_module, module_info, module_stats
from pipeline.train.lock import checkpoint_lock, lock_path
from pipeline.train.loop import TrainResult, train_module
from pipeline.train.outputs import (
    done_line,
    epoch_line,
    iteration_log,
    train_metrics,
    tries_line,
    tries_record,
    write_train_outputs,
)
from pipeline.train.prefix import Prefix
from pipeline.train.resume import (
    checkpoint_cache,
    checkpoint_key,
    discard_checkpoints,
    key_inputs,
    prepare_checkpoints,
)

TryEpoch = Callable[[int, int, dict, nn.Module, Any], None]  # (try, epoch, record, module, P(N))
LogMetrics = Callable[..., None]  # (metrics, step=...): an MLflow run's log_metrics


@dataclass(frozen=True)
class TrainInputs:
    data: Path  # written by ingest
    graded: Path  # written by grade: the curriculum id lists
    profile: Path  # the cost model
    latency: Path  # profile's measured latencies (metrics only)
    models: Path  # m1..mK module directories: the prefix comes from here
    teacher: Path | None  # plain_large's directory, read only where distillation is on


@dataclass(frozen=True)
class ModulePlan:
    """Everything module k trains from, resolved before any training (so every rank agrees)."""

    k: int
    cfg: TrainConfig  # epochs raised to the step floor for this data
    tries: list[TrainConfig]  # one, or on hard data one per training seed
    keys: list[str]  # each try's checkpoint key
    seed: int  # the run's seed: the initial weights
    subset: Split  # the curriculum's training images
    calib: Split
    costs: CostModel
    prefix: Prefix  # modules 1..k-1, frozen, on their selected paths
    soft: np.ndarray | None  # distillation targets, or None
    info: ModuleInfo
    notes: list[str]  # what resolving the recipe changed, one line each

    @property
    def name(self) -> str:
        return f"m{self.k}"

    def run_params(self) -> dict[str, Any]:
        """What the MLflow run records of the plan."""
        return {"train": self.cfg.__dict__, "spec": self.info.to_json()["spec"], "module": self.k,
                "train_images": len(self.subset), "checkpoint_key": self.keys[0]}

    def train_args(self, precision: str) -> dict[str, Any]:
        k, costs = self.k, self.costs
        return dict(cost_of=lambda a: costs.macs(k, a), cost_max=costs.max_macs(k), exit_saving=costs.exit_saving(k),
                    precision=precision, soft_targets=self.soft)


def _resolved(cfg: TrainConfig, name: str, images: int, hard: bool) -> tuple[TrainConfig, list[str]]:
    """The recipe for this data (the step floor) and the line that says what changed."""
    sized, notes = sized_to(cfg, images, hard), []
    if sized.epochs != cfg.epochs:
        floor = step_floor(cfg.min_steps, cfg.min_steps_hard, hard)
        notes.append(epochs_note(f"train@{name}", cfg.epochs, sized.epochs, floor, images, cfg.batch_size, hard))
    return sized, notes


def plan_module(inputs: TrainInputs, model: ModelConfig, cfg: TrainConfig, seed: int, k: int,
                code: Sequence[Path]) -> ModulePlan:
    """Module k's plan; ``cfg``: its recipe as params give it; ``code``: the files its checkpoint key hashes."""
    name = f"m{k}"
    costs = CostModel.load(inputs.profile, inputs.latency)
    meta = read_json(inputs.data / "meta.json")
    train, calib = load_split(inputs.data, "train"), load_split(inputs.data, "calib")
    index, subset = curriculum(train, inputs.graded / f"{name}.txt")
    hard = hard_setting_applies(cfg.min_steps_hard or cfg.tries_hard > 1, inputs.graded,
                                len(meta["classes"]))
    cfg, notes = _resolved(cfg, name, len(subset), hard)
    mean, std = module_stats(k, train.images, inputs.models)  # measured for m1; later modules inherit m1's
    prefix = load_prefix(inputs.models, k, costs, mean, std)
    soft = distillation_targets(cfg, name, inputs.teacher, train.images, index, mean, std)  # None unless kd > 0
    specs = model.for_input(int(meta["image_shape"][1])).specs  # module 1 strides on large images
    info = module_info(k, specs[k - 1], costs, len(meta["classes"]), prefix.mean, prefix.std)
    tries = tries_on(cfg, hard)
    if len(tries) > 1:
        notes.append(tries_line(name, tries))
    key_files = key_inputs(inputs.data, inputs.graded, inputs.profile, inputs.models, k,
                           inputs.teacher if soft is not None else None)
    keys = [checkpoint_key(k, c, info.to_json()["spec"], seed, key_files, code) for c in tries]
    return ModulePlan(k, cfg, tries, keys, seed, subset, calib, costs, prefix, soft, info, notes)


def train_tries(plan: ModulePlan, caches: Sequence[Path], device: torch.device, precision: str,
                on_epoch: TryEpoch | None = None) -> list[tuple[nn.Module, TrainResult]]:
    """Every try from the same initial weights (``seed``), checkpointed in its cache; ``on_epoch`` None:
    a rank other than 0, training in lockstep, silent."""
    prefix_to(plan.prefix, device)
    trained = []
    for t, (cfg, cache) in enumerate(zip(plan.tries, caches, strict=True)):
        module = initial_module(plan.info, plan.seed).to(device)  # torch.manual_seed(seed + k): every try alike
        log = {"progress": False} if on_epoch is None else {"on_epoch": functools.partial(on_epoch, t)}
        result = train_module(module, plan.prefix, plan.subset.images, plan.subset.labels, cfg, checkpoint_dir=cache,
                              **log, **plan.train_args(precision))
        trained.append((module, result))
    return trained


@dataclass(frozen=True)
class TrainedModule:
    module: nn.Module  # the kept try, on the CPU
    result: TrainResult
    metrics: dict[str, Any]  # the metrics file
    lines: list[str]  # which try was kept, where there were several

    def run_metrics(self) -> dict[str, float]:
        return {key: v for key, v in self.metrics.items() if isinstance(v, int | float)}

    def summary(self) -> str:
        return done_line(f"m{self.metrics['module']}", self.metrics)


def finish_module(plan: ModulePlan, trained: list[tuple[nn.Module, TrainResult]], out: Path, seconds: float,
                  epochs_ran: int, processes: int, device: torch.device) -> TrainedModule:
    """Keep the try with the highest final training accuracy, write its outputs to ``out`` and read its exit
    on calib as on a CPU-only machine. ``epochs_ran``: the epochs this process trained over the tries."""
    accuracies = [result.history[-1]["train_acc"] for _, result in trained]
    kept = best_try(accuracies)
    module, result = trained[kept]
    module.cpu()
    prefix_to(plan.prefix, torch.device("cpu"))
    write_train_outputs(out, module, plan.info, result)
    metrics = train_metrics(module, plan.prefix, plan.calib, plan.info, plan.tries[kept], result, plan.costs,
                            len(plan.subset), seconds, epochs_ran, processes, device)
    lines = []
    if len(plan.tries) > 1:
        record, line = tries_record(plan.name, plan.tries, accuracies, kept,
                                    len(plan.tries) * plan.cfg.epochs - epochs_ran)
        metrics.update(record)
        lines.append(line)
    return TrainedModule(module, result, metrics, lines)


@contextmanager
def module_checkpoints(plan: ModulePlan, root: Path, models: Path, main: bool) -> Iterator[list[Path]]:
    """Each try's checkpoint folder. Rank 0 (``main``) holds the module's checkpoint lock throughout (a
    live holder raises CheckpointLocked; a stale one is taken over) and first removes what killed runs
    left, never another try's checkpoints; and deletes them when the block ends without an error (the
    stage's output is committed by then)."""
    with ExitStack() as held:
        if main:
            cache = checkpoint_cache(root, plan.name, plan.keys[0])
            held.enter_context(checkpoint_lock(lock_path(cache, plan.name),
                                               log=lambda line: print(f"train@{plan.name}: {line}", flush=True)))
        caches = [prepare_checkpoints(root, models / plan.name, plan.name, key, clean=main, keep=plan.keys)
                  for key in plan.keys]
        yield caches
        for cache in caches if main else ():
            discard_checkpoints(cache)


def run_module_training(plan: ModulePlan, caches: Sequence[Path], device: torch.device, precision: str, out: Path,
                        processes: int, log: LogMetrics) -> TrainedModule:
    """Rank 0's training: every try, each epoch logged (``log``) and printed, then the kept try's outputs
    written to ``out`` (:func:`finish_module`), P(N)'s iterations logged and the kept try named."""
    ran: list[int] = []  # epochs trained by this process, over the tries (fewer after a resume)

    def on_epoch(t: int, epoch: int, record: dict, _module: nn.Module, _prob: Any) -> None:
        ran.append(epoch)
        log({key: v for key, v in record.items() if isinstance(v, int | float)}, step=t * plan.cfg.epochs + epoch)
        label = plan.name if len(plan.tries) == 1 else f"{plan.name} try {t + 1}/{len(plan.tries)}"
        print(epoch_line(label, plan.cfg.epochs, epoch, record), flush=True)

    started = time.perf_counter()
    trained = train_tries(plan, caches, device, precision, on_epoch)
    seconds = time.perf_counter() - started
    distributed.finish()
    done = finish_module(plan, trained, out, seconds, len(ran), processes, device)
    for step, values in iteration_log(done.result.iterations):
        log(values, step=step)
    for line in done.lines:
        print(line, flush=True)
    return done


def follow_rank0(plan: ModulePlan, caches: Sequence[Path], device: torch.device, precision: str) -> None:
    """A rank other than 0: train in lockstep with rank 0, which alone writes and logs."""
    train_tries(plan, caches, device, precision)
    distributed.finish()
