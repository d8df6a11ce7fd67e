"""Train module k of the cascade on its curriculum set, behind the frozen modules 1..k-1 (their
selected paths produce its input). Fixed modules train with the cost-aware exit loss; supernet
modules train single-path, sampled uniformly or by method B's probability model. Writes the module,
per-epoch/iteration history (no timings: identical runs write identical files) and, as metrics, the
exit's accuracy on the calib split and the wall-clock figures.

Resumable: the full training state is checkpointed after every epoch in ``.cache/train/mK-<key>/``,
outside the stage's DVC output (which ``dvc repro`` deletes before running the stage); the key hashes
everything the stage's result depends on (module index, resolved train config, module spec, seed,
the input files, the training code). A killed run re-run with the same inputs resumes after the last
complete epoch and ends bitwise-identical to an uninterrupted run; the folder is deleted when the
stage succeeds. One run per module at a time: ``.cache/train/mK.lock`` names its holder (a second run
is refused, exit 5; a lock whose process is gone is taken over, saying so). Stale
``models/modules/mK/.train.*`` temporary folders of killed runs are removed at start."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch

from pipeline.codegraph import ROOT, closure
from pipeline.data.difficulty import hard_setting_applies
from pipeline.device import ComputeConfig, prefix_to
from pipeline.io import atomic_path, load_split, read_json, write_json
from pipeline.models.config import ModelConfig
from pipeline.models.profile import LATENCY_FILE, CostModel
from pipeline.params.config import ConfigError, RunConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.routing.assemble import load_prefix
from pipeline.train import distributed
from pipeline.train.config import best_try, epochs_note, kd_on, module_train_config, sized_to, step_floor, tries_on
from pipeline.train.inputs import curriculum, distillation_targets, initial_module, module_info, module_stats
from pipeline.train.lock import CheckpointLocked, checkpoint_lock, lock_path
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
from pipeline.train.resume import (
    checkpoint_cache,
    checkpoint_key,
    discard_checkpoints,
    key_inputs,
    prepare_checkpoints,
)
from stages.common import StageFailed, cli, module_number, params_of, parser

CODE = tuple(closure("stages.train"))  # every project file this stage runs (its dvc.yaml code deps)


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("train", __doc__)
    p.add_argument("--module", type=module_number, required=True, help="module key mK or number k (1-based)")
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest")
    p.add_argument("--graded", type=Path, required=True, help="directory written by grade (id lists)")
    p.add_argument("--profile", type=Path, required=True, help="cost model JSON written by profile")
    p.add_argument("--models", type=Path, required=True, help="directory holding m1..mK module directories")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON")
    p.add_argument("--latency", type=Path, default=None,
                   help=f"measured latency JSON of profile (default: <root>/{LATENCY_FILE}; metrics only)")
    p.add_argument("--teacher", type=Path, default=None,
                   help="baselines directory whose plain_large is the distillation teacher of a module with "
                        "train.kd > 0 (read only then; README 'Distillation')")
    args = p.parse_args(argv)
    params = params_of(args)
    k, name = args.module, f"m{args.module}"
    model_cfg = ModelConfig.from_params(params)
    if not 1 <= k <= len(model_cfg.specs):
        raise ConfigError(f"--module {k}: the cascade has modules 1..{len(model_cfg.specs)}")
    seed = RunConfig.from_params(params).seed
    cfg = module_train_config(params, name, seed)
    if cfg.processes > 1 and not distributed.launched_by_torchrun():  # data-parallel: rerun as N ranks
        if distributed.run_ranks(cfg.processes, "stages.train", argv, f"train@{name}") != 0:
            raise StageFailed(f"train@{name}: the {cfg.processes}-process torchrun run failed (see above)")
        return
    compute = ComputeConfig.from_params(params)
    device = distributed.local_device(compute.resolve())
    world = distributed.init_from_env(device)
    costs = CostModel.load(args.profile, args.latency or args.root / LATENCY_FILE)
    meta = read_json(args.data / "meta.json")
    train, calib = load_split(args.data, "train"), load_split(args.data, "calib")
    index, subset = curriculum(train, args.graded / f"m{k}.txt")
    hard = hard_setting_applies(cfg.min_steps_hard or cfg.kd_hard is not None or cfg.tries_hard > 1, args.graded,
                                len(meta["classes"]))
    sized = sized_to(cfg, len(subset), hard)  # small data: epochs raised to the step floor
    if sized.epochs != cfg.epochs and world.main:
        floor = step_floor(cfg.min_steps, cfg.min_steps_hard, hard)
        print(epochs_note(f"train@{name}", cfg.epochs, sized.epochs, floor, len(subset), cfg.batch_size, hard))
    if kd_on(cfg, hard) != cfg.kd and world.main:
        print(f"train@{name}: distillation weight {kd_on(cfg, hard)} instead of {cfg.kd} (kd_hard: grade found "
              "the data hard)")
    cfg = replace(sized, kd=kd_on(cfg, hard))
    mean, std = module_stats(k, train.images, args.models)  # measured for m1; later modules inherit m1's
    prefix = load_prefix(args.models, k, costs, mean, std)
    soft = distillation_targets(cfg, name, args.teacher, train.images, index, mean, std)  # None unless kd > 0
    specs = model_cfg.for_input(int(meta["image_shape"][1])).specs  # module 1 strides on large images
    info = module_info(k, specs[k - 1], costs, len(meta["classes"]), prefix.mean, prefix.std)
    tries = tries_on(cfg, hard)  # one config, or on hard data one per training seed
    if len(tries) > 1 and world.main:
        print(tries_line(name, tries), flush=True)
    inputs = key_inputs(args.data, args.graded, args.profile, args.models, k,
                        args.teacher if soft is not None else None)
    keys = [checkpoint_key(k, c, info.to_json()["spec"], seed, inputs, (ROOT / code for code in CODE)) for c in tries]
    with ExitStack() as held:
        if world.main:  # rank 0 holds the module's checkpoint lock until the stage ends; a stale one is taken over
            try:
                held.enter_context(checkpoint_lock(lock_path(checkpoint_cache(args.root, name, keys[0]), name),
                                                   log=lambda line: print(f"train@{name}: {line}", flush=True)))
            except CheckpointLocked as exc:
                raise StageFailed(f"train@{name}: {exc}") from None
        caches = [prepare_checkpoints(args.root, args.models / name, name, key, clean=world.main, keep=keys)
                  for key in keys]  # rank 0 cleans what killed runs left, never another try's checkpoints
        distributed.barrier()  # rank 0 has cleaned up before any rank reads a checkpoint
        prefix_to(prefix, device)
        train_args = dict(cost_of=lambda a: costs.macs(k, a), cost_max=costs.max_macs(k),
                          exit_saving=costs.exit_saving(k), precision=compute.precision, soft_targets=soft)
        if not world.main:  # the other ranks train in lockstep with rank 0, which alone writes and logs
            for c, cache in zip(tries, caches, strict=True):
                train_module(initial_module(info, seed).to(device), prefix, subset.images, subset.labels, c,
                             progress=False, checkpoint_dir=cache, **train_args)
            distributed.finish()
            return
        with stage_run(f"train@{name}", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                       params={"train": cfg.__dict__, "spec": info.to_json()["spec"], "module": k,
                               "train_images": len(subset), "checkpoint_key": keys[0]}) as run, \
                atomic_path(args.models / name / "train", is_dir=True) as tmp:
            ran: list[int] = []  # epochs trained by this process, over the tries (fewer after a resume)
            trained: list[tuple[torch.nn.Module, TrainResult]] = []
            started = time.perf_counter()
            for t, (c, cache) in enumerate(zip(tries, caches, strict=True)):
                label = name if len(tries) == 1 else f"{name} try {t + 1}/{len(tries)}"

                def on_epoch(epoch: int, record: dict, mod: torch.nn.Module, prob_model, t=t, label=label) -> None:
                    ran.append(epoch)
                    run.log_metrics({key: v for key, v in record.items() if isinstance(v, (int, float))},
                                    step=t * cfg.epochs + epoch)
                    print(epoch_line(label, cfg.epochs, epoch, record), flush=True)

                module = initial_module(info, seed).to(device)  # torch.manual_seed(seed + k): every try alike
                trained.append((module, train_module(module, prefix, subset.images, subset.labels, c,
                                                     on_epoch=on_epoch, checkpoint_dir=cache, **train_args)))
            seconds = time.perf_counter() - started
            distributed.finish()
            accuracies = [result.history[-1]["train_acc"] for _, result in trained]
            kept = best_try(accuracies)
            module, result = trained[kept]
            module.cpu()  # outputs and the calib evaluation as on a CPU-only machine
            prefix_to(prefix, torch.device("cpu"))
            write_train_outputs(tmp, module, info, result)
            for step, values in iteration_log(result.iterations):
                run.log_metrics(values, step=step)
            metrics = train_metrics(module, prefix, calib, info, tries[kept], result, costs, len(subset), seconds,
                                    len(ran), world.size, device)
            if len(tries) > 1:
                record, line = tries_record(name, tries, accuracies, kept, len(tries) * cfg.epochs - len(ran))
                metrics.update(record)
                print(line, flush=True)
            write_json(args.metrics, metrics)
            run.log_metrics({key: v for key, v in metrics.items() if isinstance(v, (int, float))})
        for cache in caches:
            discard_checkpoints(cache)  # the stage succeeded: its output is committed
        print(done_line(name, metrics))


if __name__ == "__main__":
    raise SystemExit(main())
