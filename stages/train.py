"""Train module k of the cascade on its curriculum set, behind the frozen modules 1..k-1 (their
selected paths produce its input). Fixed modules train with the cost-aware exit loss; supernet
modules train single-path, sampled uniformly or by method B's probability model. Writes the module,
a checkpoint per epoch, per-epoch/iteration history, and the exit's accuracy on the calib split."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from pipeline.config import ConfigError, ModelConfig, TrackingConfig, deep_merge, section
from pipeline.io import atomic_path, curriculum_index, load_split, read_json, write_json
from pipeline.models.modules import build_module
from pipeline.models.profile import CostModel
from pipeline.models.store import ModuleInfo, save_module
from pipeline.routing.assemble import load_prefix
from pipeline.tracking import stage_run
from pipeline.train.loop import TrainConfig, evaluate_path, save_checkpoint, train_module
from stages.common import cli, params_of, parser


def train_config(params: dict, name: str, seed: int) -> TrainConfig:
    merged = deep_merge(section(params, "train"), params["modules"][name].get("train") or {})
    merged.setdefault("seed", seed)
    try:
        return TrainConfig.from_dict(merged)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"params: train / modules.{name}.train: {exc}") from None


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("train", __doc__)
    p.add_argument("--module", type=int, required=True, help="module number k (1-based)")
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest")
    p.add_argument("--graded", type=Path, required=True, help="directory written by grade (id lists)")
    p.add_argument("--profile", type=Path, required=True, help="cost model JSON written by profile")
    p.add_argument("--models", type=Path, required=True, help="directory holding m1..mK module directories")
    p.add_argument("--metrics", type=Path, required=True, help="metrics JSON")
    args = p.parse_args(argv)
    params = params_of(args)
    k, name = args.module, f"m{args.module}"
    model_cfg = ModelConfig.from_params(params)
    if not 1 <= k <= len(model_cfg.specs):
        raise ConfigError(f"--module {k}: the cascade has modules 1..{len(model_cfg.specs)}")
    seed = int(params.get("seed", 0))
    cfg = train_config(params, name, seed)
    costs = CostModel(read_json(args.profile))
    meta = read_json(args.data / "meta.json")
    train, calib = load_split(args.data, "train"), load_split(args.data, "calib")
    subset = train.subset(curriculum_index(train.ids, (args.graded / f"module_{k}.txt").read_text().splitlines()))
    if k == 1:  # normalisation statistics of the training images; later modules inherit them from m1
        pixels = train.images.astype(np.float32) / 255.0
        mean = tuple(pixels.mean(axis=(0, 2, 3)).round(4).tolist())
        std = tuple(pixels.std(axis=(0, 2, 3)).round(4).tolist())
    else:
        first = ModuleInfo.from_json(read_json(args.models / "m1" / "train" / "module.json"))
        mean, std = first.mean, first.std
    prefix = load_prefix(args.models, k, costs, mean, std)
    in_shape = tuple(costs.table["modules"][k - 1]["input_shape"])
    info = ModuleInfo(k, model_cfg.specs[k - 1], in_shape[0], len(meta["classes"]), in_shape, prefix.mean, prefix.std)
    torch.manual_seed(seed + k)  # initial weights of module k (global state is fine in a stage process)
    module = build_module(info.spec, info.in_channels, info.num_classes)
    out_dir = args.models / name / "train"
    with stage_run(f"train@{name}", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"train": cfg.__dict__, "spec": info.to_json()["spec"], "module": k,
                           "train_images": len(subset)}) as run, atomic_path(out_dir, is_dir=True) as tmp:
        (tmp / "checkpoints").mkdir()

        def on_epoch(epoch: int, record: dict, mod: torch.nn.Module, prob_model) -> None:
            save_checkpoint(tmp / "checkpoints" / f"epoch_{epoch:03d}.pt", mod, epoch=epoch, prob_model=prob_model)
            run.log_metrics({key: v for key, v in record.items() if isinstance(v, (int, float))}, step=epoch)
            print(f"train@{name} epoch {epoch}/{cfg.epochs}: loss {record['loss']:.4f} acc {record['train_acc']:.4f}"
                  f" {record['images_per_s']:.0f} img/s", flush=True)

        started = time.perf_counter()
        result = train_module(module, prefix, subset.images, subset.labels, cfg,
                              cost_of=lambda a: costs.macs(k, a), cost_max=costs.max_macs(k),
                              exit_saving=costs.exit_saving(k), on_epoch=on_epoch)
        seconds = time.perf_counter() - started
        save_module(tmp, module, info)
        pd.DataFrame(result.history).to_csv(tmp / "history.csv", index=False)
        if result.iterations:
            pd.DataFrame(result.iterations).to_csv(tmp / "iterations.csv", index=False)
            for it in result.iterations[:: max(1, len(result.iterations) // 400)]:
                run.log_metrics({f"iter_{key}": v for key, v in it.items()
                                 if key in ("entropy", "mi", "best_perf", "mean_perf") and np.isfinite(v)},
                                step=int(it["iteration"]))
        if result.prob_model is not None:
            write_json(tmp / "prob_model.json", result.prob_model.as_dict())
        arch = module.default_arch() if result.prob_model is None else result.prob_model.most_likely()
        exit_eval = evaluate_path(module, prefix, calib.images, calib.labels, arch, 512)
        metrics = {
            "module": k, "kind": info.spec.kind, "train_images": len(subset), "epochs": cfg.epochs,
            "seconds": round(seconds, 1), "images_per_s": round(len(subset) * cfg.epochs / seconds, 1),
            "calib_exit_acc": exit_eval["acc"], "calib_exit_conf_mean": exit_eval["conf_mean"],
            "calib_path": arch.key(), "path_macs": costs.macs(k, arch),
            "path_latency_ms_b1": costs.latency_ms(k, arch, 1), "path_latency_ms_b64": costs.latency_ms(k, arch, 64),
            "final_train_acc": result.history[-1]["train_acc"], "sampler": cfg.sampler,
        }
        write_json(args.metrics, metrics)
        run.log_metrics({key: v for key, v in metrics.items() if isinstance(v, (int, float))})
    print(f"train@{name}: calib exit accuracy {metrics['calib_exit_acc']:.4f} on path {arch.key() or '(fixed)'} "
          f"({metrics['path_macs']:,} MACs), {metrics['images_per_s']} img/s")


if __name__ == "__main__":
    raise SystemExit(main())
