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
stage succeeds. Stale ``models/modules/mK/.train.*`` temporary folders of killed runs are removed at start."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pipeline.baselines import load_baselines, teacher_probabilities
from pipeline.codegraph import ROOT, closure
from pipeline.config import ComputeConfig, ConfigError, ModelConfig, TrackingConfig
from pipeline.device import prefix_to
from pipeline.io import atomic_path, curriculum_index, load_split, read_json, write_json
from pipeline.models.modules import build_module
from pipeline.models.profile import LATENCY_FILE, CostModel
from pipeline.models.store import ModuleInfo, save_module
from pipeline.routing.assemble import load_prefix
from pipeline.tracking import stage_run
from pipeline.train import distributed
from pipeline.train.config import module_train_config
from pipeline.train.loop import TrainResult, history_frame_records, train_module
from pipeline.train.paths import evaluate_path
from pipeline.train.resume import checkpoint_key, clean_stale_temporaries
from stages.common import StageFailed, cli, module_number, params_of, parser

CODE = tuple(closure("stages.train"))  # every project file this stage runs (its dvc.yaml code deps)


def write_train_outputs(out: Path, module: torch.nn.Module, info: ModuleInfo, result: TrainResult) -> None:
    """The stage's deterministic outputs: module, ``history.csv`` (timings dropped),
    ``iterations.csv`` (method B), ``prob_model.json``."""
    save_module(out, module, info)
    pd.DataFrame(history_frame_records(result.history)).to_csv(out / "history.csv", index=False)
    if result.iterations:
        pd.DataFrame(result.iterations).to_csv(out / "iterations.csv", index=False)
    if result.prob_model is not None:
        write_json(out / "prob_model.json", result.prob_model.as_dict())


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
    seed = int(params.get("seed", 0))
    cfg = module_train_config(params, name, seed)
    if cfg.processes > 1 and not distributed.launched_by_torchrun():  # data-parallel: rerun as N ranks
        command = distributed.torchrun_command(cfg.processes, "stages.train", sys.argv[1:] if argv is None else argv)
        print(f"train@{name}: {cfg.processes} processes: {' '.join(command)}", flush=True)
        if subprocess.run(command, check=False).returncode != 0:
            raise StageFailed(f"train@{name}: the {cfg.processes}-process torchrun run failed (see above)")
        return
    compute = ComputeConfig.from_params(params)
    device = distributed.local_device(compute.resolve())
    world = distributed.init_from_env(device)
    costs = CostModel.load(args.profile, args.latency or args.root / LATENCY_FILE)
    meta = read_json(args.data / "meta.json")
    train, calib = load_split(args.data, "train"), load_split(args.data, "calib")
    index = curriculum_index(train.ids, (args.graded / f"m{k}.txt").read_text().splitlines())
    subset = train.subset(index)
    if k == 1:  # normalisation statistics of the training images; later modules inherit them from m1
        pixels = train.images.astype(np.float32) / 255.0
        mean = tuple(pixels.mean(axis=(0, 2, 3)).round(4).tolist())
        std = tuple(pixels.std(axis=(0, 2, 3)).round(4).tolist())
    else:
        first = ModuleInfo.from_json(read_json(args.models / "m1" / "train" / "module.json"))
        mean, std = first.mean, first.std
    prefix = load_prefix(args.models, k, costs, mean, std)
    if cfg.kd > 0 and args.teacher is None:
        raise ConfigError(f"train.kd = {cfg.kd} for {name} needs --teacher (the baselines directory: plain_large "
                          "is the teacher); set kd to 0 or pass --teacher")
    soft = None
    if cfg.kd > 0:  # the teacher's flip-averaged probabilities, once per training image, then the curriculum's rows
        teacher = load_baselines(args.teacher).large
        soft = teacher_probabilities(teacher, train.images, mean, std, cfg.kd_temperature)[index]
    in_shape = tuple(costs.table["modules"][k - 1]["input_shape"])
    info = ModuleInfo(k, model_cfg.specs[k - 1], in_shape[0], len(meta["classes"]), in_shape, prefix.mean, prefix.std)
    torch.manual_seed(seed + k)  # initial weights of module k (global state is fine in a stage process)
    module = build_module(info.spec, info.in_channels, info.num_classes)
    out_dir = args.models / name / "train"
    for path in clean_stale_temporaries(args.models / name) if world.main else ():
        print(f"train@{name}: removed {path} (left by a killed run)", flush=True)
    inputs = [args.data / "train.npz", args.data / "meta.json", args.graded / f"m{k}.txt", args.profile,
              *(args.models / f"m{j}" / part for j in range(1, k) for part in ("train", "select")),
              *([args.teacher] if soft is not None else [])]
    root = Path(args.root)
    key = checkpoint_key(k, cfg, info.to_json()["spec"], seed, inputs, (ROOT / c for c in CODE))
    cache = root / ".cache" / "train" / f"{name}-{key}"
    for stale in sorted(cache.parent.glob(f"{name}-*")) if cache.parent.is_dir() and world.main else []:
        if stale != cache:  # checkpoints of other inputs (changed since the kill): never resumable
            shutil.rmtree(stale, ignore_errors=True)
            print(f"train@{name}: removed stale checkpoints {stale}", flush=True)
    if any(cache.glob("epoch_*.pt")) and world.main:
        print(f"train@{name}: resuming from the checkpoint in {cache}", flush=True)
    distributed.barrier()  # rank 0 has cleaned up before any rank reads a checkpoint
    module.to(device)
    prefix_to(prefix, device)
    train_args = dict(cost_of=lambda a: costs.macs(k, a), cost_max=costs.max_macs(k), exit_saving=costs.exit_saving(k),
                      checkpoint_dir=cache, precision=compute.precision, soft_targets=soft)
    if not world.main:  # the other ranks train in lockstep with rank 0, which alone writes and logs
        train_module(module, prefix, subset.images, subset.labels, cfg, progress=False, **train_args)
        distributed.finish()
        return
    with stage_run(f"train@{name}", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"train": cfg.__dict__, "spec": info.to_json()["spec"], "module": k,
                           "train_images": len(subset), "checkpoint_key": key}) as run, \
            atomic_path(out_dir, is_dir=True) as tmp:

        ran: list[int] = []  # epochs trained by this process (fewer after a resume)

        def on_epoch(epoch: int, record: dict, mod: torch.nn.Module, prob_model) -> None:
            ran.append(epoch)
            run.log_metrics({key: v for key, v in record.items() if isinstance(v, (int, float))}, step=epoch)
            print(f"train@{name} epoch {epoch}/{cfg.epochs}: loss {record['loss']:.4f} acc {record['train_acc']:.4f}"
                  f" {record['images_per_s']:.0f} img/s", flush=True)

        started = time.perf_counter()
        result = train_module(module, prefix, subset.images, subset.labels, cfg, on_epoch=on_epoch, **train_args)
        seconds = time.perf_counter() - started
        distributed.finish()
        module.cpu()  # outputs and the calib evaluation as on a CPU-only machine
        prefix_to(prefix, torch.device("cpu"))
        write_train_outputs(tmp, module, info, result)
        if result.iterations:
            for it in result.iterations[:: max(1, len(result.iterations) // 400)]:
                run.log_metrics({f"iter_{key}": v for key, v in it.items()
                                 if key in ("entropy", "mi", "best_perf", "mean_perf") and np.isfinite(v)},
                                step=int(it["iteration"]))
        arch = module.default_arch() if result.prob_model is None else result.prob_model.most_likely()
        exit_eval = evaluate_path(module, prefix, calib.images, calib.labels, arch, 512)
        metrics = {
            "module": k, "kind": info.spec.kind, "train_images": len(subset), "epochs": cfg.epochs,
            "seconds": round(seconds, 1),
            "images_per_s": round(len(subset) * len(ran) / max(seconds, 1e-9), 1),
            "resumed_after_epoch": cfg.epochs - len(ran),
            "calib_exit_acc": exit_eval["acc"], "calib_exit_conf_mean": exit_eval["conf_mean"],
            "calib_path": arch.key(), "path_macs": costs.macs(k, arch),
            "path_latency_ms_b1": costs.latency_ms(k, arch, 1), "path_latency_ms_b64": costs.latency_ms(k, arch, 64),
            "final_train_acc": result.history[-1]["train_acc"], "sampler": cfg.sampler,
            "processes": world.size, "device": str(device), "kd": cfg.kd,
        }
        write_json(args.metrics, metrics)
        run.log_metrics({key: v for key, v in metrics.items() if isinstance(v, (int, float))})
    shutil.rmtree(cache, ignore_errors=True)  # the stage succeeded: its output is committed
    print(f"train@{name}: calib exit accuracy {metrics['calib_exit_acc']:.4f} on path {arch.key() or '(fixed)'} "
          f"({metrics['path_macs']:,} MACs), {metrics['images_per_s']} img/s")


if __name__ == "__main__":
    raise SystemExit(main())
