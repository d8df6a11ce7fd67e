"""Train module k of the cascade on its curriculum set behind the frozen modules 1..k-1: fixed modules with
the cost-aware exit loss, supernets single-path (uniform or method B's P(N)). Writes the module, its history
and metrics (calib exit accuracy, wall-clock). Resumable after every epoch, bitwise-identical to an
uninterrupted run (``.cache/train/mK-<key>/``); one run per module at a time (``.cache/train/mK.lock``; a
second is refused, exit 5). The workflow: pipeline.workflows.train."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from pipeline.codegraph import ROOT, closure
from pipeline.device import ComputeConfig
from pipeline.io import atomic_path, write_json
from pipeline.models.config import ModelConfig
from pipeline.models.profile import LATENCY_FILE
from pipeline.params.config import RunConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.train import distributed
from pipeline.train.config import module_train_config
from pipeline.train.lock import CheckpointLocked
from pipeline.workflows.train import (
    TrainInputs,
    follow_rank0,
    module_checkpoints,
    plan_module,
    run_module_training,
)
from stages.common import StageFailed, cli, module_number, params_of, parser

CODE = tuple(closure("stages.train"))  # every project file this stage runs (its dvc.yaml code deps)


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("train", __doc__)
    p.add_argument("--module", type=module_number, required=True, help="module key mK or number k (1-based)")
    for flag, text in (("--data", "directory written by ingest"), ("--graded", "directory written by grade"),
                       ("--profile", "cost model JSON written by profile"), ("--metrics", "metrics JSON"),
                       ("--models", "directory holding m1..mK module directories")):
        p.add_argument(flag, type=Path, required=True, help=text)
    p.add_argument("--latency", type=Path, default=None,
                   help=f"measured latency JSON of profile (default: <root>/{LATENCY_FILE}; metrics only)")
    p.add_argument("--teacher", type=Path, default=None,
                   help="the baselines directory: its plain CNN more accurate on calib teaches where train.kd > 0")
    args = p.parse_args(argv)
    params = params_of(args)
    model, seed = ModelConfig.from_params(params), RunConfig.from_params(params).seed
    k, name = model.check_module(args.module), f"m{args.module}"
    cfg, compute = module_train_config(params, name, seed), ComputeConfig.from_params(params)
    if cfg.processes > 1 and not distributed.launched_by_torchrun():  # data-parallel: rerun as N ranks
        if distributed.run_ranks(cfg.processes, "stages.train", argv, f"train@{name}") != 0:
            raise StageFailed(f"train@{name}: the {cfg.processes}-process torchrun run failed (see above)")
        return
    device = distributed.local_device(compute.resolve())
    world = distributed.init_from_env(device)
    inputs = TrainInputs(args.data, args.graded, args.profile, args.latency or args.root / LATENCY_FILE,
                         args.models, args.teacher)
    plan = plan_module(inputs, model, cfg, seed, k, [ROOT / code for code in CODE])  # CODE: the key hashes it
    for line in plan.notes if world.main else ():
        print(line, flush=True)
    with ExitStack() as held:
        try:
            cache = held.enter_context(module_checkpoints(plan, args.root, args.models, world.main))
        except CheckpointLocked as exc:
            raise StageFailed(f"train@{name}: {exc}") from None
        distributed.barrier()  # rank 0 has cleaned up before any rank reads a checkpoint
        if not world.main:
            return follow_rank0(plan, cache, device, compute.precision)
        with stage_run(f"train@{name}", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                       params=plan.run_params()) as run, \
                atomic_path(args.models / name / "train", is_dir=True) as tmp:
            out = run_module_training(plan, cache, device, compute.precision, tmp, world.size, run)
            write_json(args.metrics, out.metrics)
            run.log_metrics(out.run_metrics())
    print(out.summary())


if __name__ == "__main__":
    raise SystemExit(main())
