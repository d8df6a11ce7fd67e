"""The train stage's workflow (``stages.train`` parses, relaunches under torchrun where asked, holds the
checkpoint lock and writes): module k's plan (:func:`plan_module`: its curriculum, the frozen routed
prefix of modules 1..k-1, the resolved recipe and its checkpoint key), its training
(:func:`train_planned`) and its outputs and metrics (:func:`finish_module`)
(docs/DESIGN.md "Stages and workflows"). It lives with routing: module k trains behind the routed
prefix."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
from pipeline.train.config import TrainConfig, epochs_note, sized_to, step_floor
from pipeline.train.inputs import curriculum, distillation_targets, initial_module, module_info, module_stats
from pipeline.train.lock import checkpoint_lock, lock_path
from pipeline.train.loop import TrainResult, train_module
from pipeline.train.outputs import (
    done_line,
    epoch_line,
    iteration_log,
    train_metrics,
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

OnEpoch = Callable[[int, dict, nn.Module, Any], None]  # (epoch, record, module, P(N))


class MetricsLog(Protocol):
    """Where training's metrics go: a stage's MLflow run (:class:`pipeline.registry.tracking.StageRun`)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def log_series(self, rows: Sequence[tuple[int, Mapping[str, float]]]) -> None: ...


@dataclass(frozen=True)
class TrainInputs:
    data: Path  # written by ingest
    graded: Path  # written by grade: the curriculum id lists
    profile: Path  # the cost model
    latency: Path  # profile's measured latencies (metrics only)
    models: Path  # m1..mK module directories: the prefix comes from here
    teacher: Path | None  # the baselines' directory (its more accurate net teaches), read only where kd > 0


@dataclass(frozen=True)
class ModulePlan:
    """Everything module k trains from, resolved before any training (so every rank agrees)."""

    k: int
    cfg: TrainConfig  # epochs raised to the step floor for this data
    key: str  # its checkpoint key
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
                "train_images": len(self.subset), "checkpoint_key": self.key}

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
    hard = hard_setting_applies(cfg.min_steps_hard, inputs.graded, len(meta["classes"]))
    cfg, notes = _resolved(cfg, name, len(subset), hard)
    mean, std = module_stats(k, train.images, inputs.models)  # measured for m1; later modules inherit m1's
    prefix = load_prefix(inputs.models, k, costs, mean, std)
    taught = distillation_targets(cfg, name, inputs.teacher, train.images, index, mean, std)  # None unless kd > 0
    soft = None if taught is None else taught[0]
    notes += [] if taught is None else [taught[1]]
    specs = model.for_input(int(meta["image_shape"][1])).specs  # module 1 strides on large images
    info = module_info(k, specs[k - 1], costs, len(meta["classes"]), prefix.mean, prefix.std)
    key_files = key_inputs(inputs.data, inputs.graded, inputs.profile, inputs.models, k,
                           inputs.teacher if soft is not None else None)
    key = checkpoint_key(k, cfg, info.to_json()["spec"], seed, key_files, code)
    return ModulePlan(k, cfg, key, seed, subset, calib, costs, prefix, soft, info, notes)


def train_planned(plan: ModulePlan, cache: Path, device: torch.device, precision: str,
                  on_epoch: OnEpoch | None = None) -> tuple[nn.Module, TrainResult]:
    """The module from its initial weights (``seed``), checkpointed in ``cache``; ``on_epoch`` None: a
    rank other than 0, training in lockstep, silent."""
    prefix_to(plan.prefix, device)
    module = initial_module(plan.info, plan.seed).to(device)  # torch.manual_seed(seed + k)
    log = {"progress": False} if on_epoch is None else {"on_epoch": on_epoch}
    result = train_module(module, plan.prefix, plan.subset.images, plan.subset.labels, plan.cfg,
                          checkpoint_dir=cache, **log, **plan.train_args(precision))
    return module, result


@dataclass(frozen=True)
class TrainedModule:
    module: nn.Module  # on the CPU
    result: TrainResult
    metrics: dict[str, Any]  # the metrics file

    def run_metrics(self) -> dict[str, float]:
        return {key: v for key, v in self.metrics.items() if isinstance(v, int | float)}

    def summary(self) -> str:
        return done_line(f"m{self.metrics['module']}", self.metrics)


def finish_module(plan: ModulePlan, module: nn.Module, result: TrainResult, out: Path, seconds: float,
                  epochs_ran: int, processes: int, device: torch.device) -> TrainedModule:
    """Write the trained module's outputs to ``out`` and read its exit on calib as on a CPU-only machine.
    ``epochs_ran``: the epochs this process trained (fewer after a resume)."""
    module.cpu()
    prefix_to(plan.prefix, torch.device("cpu"))
    write_train_outputs(out, module, plan.info, result)
    metrics = train_metrics(module, plan.prefix, plan.calib, plan.info, plan.cfg, result, plan.costs,
                            len(plan.subset), seconds, epochs_ran, processes, device)
    return TrainedModule(module, result, metrics)


@contextmanager
def module_checkpoints(plan: ModulePlan, root: Path, models: Path, main: bool) -> Iterator[Path]:
    """The module's checkpoint folder. Rank 0 (``main``) holds the module's checkpoint lock throughout (a
    live holder raises CheckpointLocked; a stale one is taken over) and first removes what killed runs
    left; and deletes it when the block ends without an error (the stage's output is committed by then)."""
    with ExitStack() as held:
        cache = checkpoint_cache(root, plan.name, plan.key)
        if main:
            held.enter_context(checkpoint_lock(lock_path(cache, plan.name),
                                               log=lambda line: print(f"train@{plan.name}: {line}", flush=True)))
        yield prepare_checkpoints(root, models / plan.name, plan.name, plan.key, clean=main)
        if main:
            discard_checkpoints(cache)


def run_module_training(plan: ModulePlan, cache: Path, device: torch.device, precision: str, out: Path,
                        processes: int, log: MetricsLog) -> TrainedModule:
    """Rank 0's training: each epoch logged (``log``, as it ends) and printed, then the module's outputs
    written to ``out`` (:func:`finish_module`) and P(N)'s iterations logged in batches."""
    ran: list[int] = []  # epochs trained by this process (fewer after a resume)

    def on_epoch(epoch: int, record: dict, _module: nn.Module, _prob: Any) -> None:
        ran.append(epoch)
        log.log_metrics({key: v for key, v in record.items() if isinstance(v, int | float)}, step=epoch)
        print(epoch_line(plan.name, plan.cfg.epochs, epoch, record), flush=True)

    started = time.perf_counter()
    module, result = train_planned(plan, cache, device, precision, on_epoch)
    seconds = time.perf_counter() - started
    distributed.finish()
    done = finish_module(plan, module, result, out, seconds, len(ran), processes, device)
    log.log_series(iteration_log(done.result.iterations))
    return done


def follow_rank0(plan: ModulePlan, cache: Path, device: torch.device, precision: str) -> None:
    """A rank other than 0: train in lockstep with rank 0, which alone writes and logs."""
    train_planned(plan, cache, device, precision)
    distributed.finish()
