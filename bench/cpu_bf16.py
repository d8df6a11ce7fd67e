"""Benchmark: does bf16 autocast speed up training on this CPU, and does it keep accuracy?

Times optimisation steps (forward + backward + SGD step, the params' batch size and layout) of every
module of the default cascade, each behind its (randomly initialised, frozen) prefix, and of the
``plain_small`` / ``plain_large`` baselines, in fp32 and under
``torch.autocast(device_type="cpu", dtype=torch.bfloat16)``, side by side. The two precisions alternate
order per row (and per repeat), so a noisy neighbour hits both alike; the first ``--warmup`` steps of
every run are not timed (oneDNN builds its kernels on first use). Steps are timed one by one and the
median ms/step is reported (the mean in the JSON too).

    python -m bench.cpu_bf16 [--threads 1] [--steps 20] [--warmup 5] [--repeats 2] [--out bench/out/cpu_bf16.json]
    python -m bench.cpu_bf16 --accuracy m1 [--epochs 3] [--train-images 10000]   # held-out accuracy, fp32 vs bf16

The timed steps are the pipeline's own ``train_module`` steps under ``compute.precision: bf16``
(``pipeline.device.autocast``, CPU bf16 autocast where the CPU has native bf16; the loss on float32
logits). Weights, the optimizer and BatchNorm statistics stay fp32 (autocast casts per op). With
``--dtypes`` it also prints, per module, which aten ops of one bf16 step produced bf16 and which fp32
outputs. Results: docs/RESULTS.md "bf16 on the CPU".

Timing mode uses random uint8 images of the configured size (no data needed beyond the size probe);
``--accuracy`` trains one net (``m1`` alone on normalised images, ``plain_small`` or ``plain_large``) on a
stratified subset of the Fashion-MNIST training split with the same seed in both precisions and reads
its accuracy on the test split (evaluated in fp32, and also under bf16 autocast).
Set ``OMP_NUM_THREADS`` to the same value as ``--threads``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pipeline.train.loop as loop
from pipeline.data.input_shape import resolve_input
from pipeline.models.cascade import build_modules, feature_shapes
from pipeline.models.config import ModelConfig
from pipeline.models.cost import count_macs
from pipeline.models.modules import PlainCNN
from pipeline.params.config import DataConfig, deep_merge, load_params
from pipeline.train.baselines import BaselineConfig
from pipeline.train.config import TrainConfig
from pipeline.train.paths import module_outputs
from pipeline.train.prefix import Prefix

PRECISIONS = ("fp32", "bf16")
AUDIT_PRINTED = ("conv", "mm", "batch_norm", "softmax", "nll", "pool", "relu", "hardswish", "binary_cross")


# ------------------------------------------------------------------------------- patches (this process)


_original_step = loop._step
STEP_TIMES: list[float] = []
AUDIT: list[TorchDispatchMode] = []  # while set, the next steps run under this dispatch mode


def _timed_step(*args: Any, **kwargs: Any) -> Any:
    mode = AUDIT[0] if AUDIT else contextlib.nullcontext()
    start = time.perf_counter()
    with mode:
        out = _original_step(*args, **kwargs)
    STEP_TIMES.append(time.perf_counter() - start)
    return out


loop._step = _timed_step


class DtypeAudit(TorchDispatchMode):
    """Counts aten ops by (op, dtype of the first floating output)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        flat = out if isinstance(out, (tuple, list)) else (out,)
        dtypes = [t.dtype for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if dtypes:
            self.counts[(func.overloadpacket.__name__, str(dtypes[0]).replace("torch.", ""))] += 1
        return out


# ------------------------------------------------------------------------------- nets to time


@dataclasses.dataclass
class Case:
    name: str
    kind: str
    build: Any  # (seed=0) -> (module, prefix): fresh weights every call
    cfg: TrainConfig
    cost: float  # MACs of the default path (the cost-aware loss's cost_of / cost_max)
    exit_saving: float


def cases(params: dict[str, Any], baselines: bool) -> tuple[list[Case], tuple[int, int]]:
    data_cfg, model = DataConfig.from_params(params), ModelConfig.from_params(params)
    data = resolve_input(data_cfg.source, data_cfg.image_size, data_cfg.channels)
    spec = model.cascade_spec(data.channels, 10, data.image_size)
    shapes = feature_shapes(spec)
    out = []
    for k, name in enumerate(model.names, start=1):
        cfg = TrainConfig.from_dict(deep_merge(params["train"], params["modules"][name].get("train") or {}))
        cfg = dataclasses.replace(cfg, epochs=1, kd=0.0)  # the step alone, without a teacher's soft targets

        def build(k: int = k, seed: int = 0) -> tuple[torch.nn.Module, Prefix]:
            modules = build_modules(spec, seed=seed)
            return modules[k - 1], Prefix(tuple((modules[j], modules[j].default_arch()) for j in range(k - 1)))

        module = build()[0]
        out.append(Case(name, spec.modules[k - 1].kind, build, cfg,
                        float(count_macs(module, shapes[k - 1], module.default_arch())), 0.5))
    if baselines:
        b = BaselineConfig.from_params(params)
        for name, width in (("plain_small", b.small_width), ("plain_large", b.large_width)):
            def build_plain(width: int = width, seed: int = 0) -> tuple[torch.nn.Module, Prefix]:
                torch.manual_seed(seed)
                return PlainCNN(width, data.channels, 10), Prefix(())

            macs = float(count_macs(build_plain()[0], (data.channels, data.image_size, data.image_size)))
            out.append(Case(name, "plain", build_plain, dataclasses.replace(b.train_config(0), epochs=1), macs, 0.0))
    return out, (data.channels, data.image_size)


def run_case(case: Case, precision: str, images: np.ndarray, labels: np.ndarray, layout: str) -> list[float]:
    """Per-step seconds of one training run (all its steps, warm-up included)."""
    module, prefix = case.build()
    STEP_TIMES.clear()
    loop.train_module(module, prefix, images, labels, case.cfg, cost_of=lambda _a: case.cost, cost_max=case.cost,
                      exit_saving=case.exit_saving, progress=False, precision=precision, layout=layout)
    return list(STEP_TIMES)


def audit_case(case: Case, images: np.ndarray, labels: np.ndarray, layout: str) -> dict[str, dict[str, int]]:
    audit = DtypeAudit()
    AUDIT.append(audit)
    try:
        run_case(case, "bf16", images[:case.cfg.batch_size], labels[:case.cfg.batch_size], layout)
    finally:
        AUDIT.clear()
    ops: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for (op, dtype), n in sorted(audit.counts.items()):
        ops[op][dtype] = n
    return dict(ops)


def timing(args: argparse.Namespace, params: dict[str, Any]) -> dict[str, Any]:
    all_cases, (channels, size) = cases(params, args.baselines)
    chosen = [c for c in all_cases if not args.only or c.name in args.only]
    rows, audits = [], {}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), layout {args.layout}, "
          f"{args.warmup} warm-up + {args.steps} timed steps per run, {args.repeats} repeat(s)", flush=True)
    print(f"{'module':12s} {'kind':8s} {'batch':>5s} {'fp32 ms/step':>13s} {'bf16 ms/step':>13s} "
          f"{'fp32/bf16':>9s}  per repeat (fp32/bf16)", flush=True)
    for i, case in enumerate(chosen):
        n = case.cfg.batch_size * (args.warmup + args.steps)
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (n, channels, size, size), dtype=np.uint8)
        labels = rng.integers(0, 10, n)
        timed: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        per_repeat: list[dict[str, Any]] = []
        for r in range(args.repeats):
            order = PRECISIONS if (i + r) % 2 == 0 else PRECISIONS[::-1]
            medians = {}
            for precision in order:
                steps = run_case(case, precision, images, labels, args.layout)[args.warmup:]
                timed[precision] += steps
                medians[precision] = statistics.median(steps) * 1e3
            per_repeat.append({"order": list(order), **{f"{p}_ms": round(medians[p], 3) for p in PRECISIONS},
                               "ratio": round(medians["fp32"] / medians["bf16"], 3)})
        ms = {p: statistics.median(timed[p]) * 1e3 for p in PRECISIONS}
        mean = {p: statistics.fmean(timed[p]) * 1e3 for p in PRECISIONS}
        row = {"module": case.name, "kind": case.kind, "batch_size": case.cfg.batch_size,
               "sampler": case.cfg.sampler if case.kind == "supernet" else None, "macs": case.cost,
               "fp32_ms_median": round(ms["fp32"], 3), "bf16_ms_median": round(ms["bf16"], 3),
               "fp32_ms_mean": round(mean["fp32"], 3), "bf16_ms_mean": round(mean["bf16"], 3),
               "speedup_fp32_over_bf16": round(ms["fp32"] / ms["bf16"], 3), "repeats": per_repeat,
               "fp32_ms_steps": [round(s * 1e3, 3) for s in timed["fp32"]],
               "bf16_ms_steps": [round(s * 1e3, 3) for s in timed["bf16"]]}
        rows.append(row)
        reps = "  ".join(f"{r['fp32_ms']:.1f}/{r['bf16_ms']:.1f}" for r in per_repeat)
        print(f"{case.name:12s} {case.kind:8s} {case.cfg.batch_size:5d} {ms['fp32']:13.2f} {ms['bf16']:13.2f} "
              f"{ms['fp32'] / ms['bf16']:8.3f}x  {reps}", flush=True)
        if args.dtypes:
            audits[case.name] = audit_case(case, images, labels, args.layout)
    for name, ops in audits.items():  # the JSON keeps every op; print the compute ones
        print(f"\n{name}: aten ops of one bf16 step (prefix, forward, backward), by output dtype")
        for op, by in ops.items():
            if any(s in op for s in AUDIT_PRINTED):
                print(f"  {op:34s} " + ", ".join(f"{d} {n}" for d, n in by.items()))
    return {"mode": "timing", "layout": args.layout, "steps": args.steps, "warmup": args.warmup,
            "repeats": args.repeats, "rows": rows, "dtypes": audits}


# ------------------------------------------------------------------------------- accuracy


def accuracy(args: argparse.Namespace, params: dict[str, Any]) -> dict[str, Any]:
    from pipeline.data.sources import load_fashion_mnist
    from pipeline.data.splits import stratified_take

    data = load_fashion_mnist()
    rng = np.random.default_rng(0)  # the training subset: the same whatever --seed
    train_x, train_y = data.train.images, data.train.labels
    if args.train_images and args.train_images < len(train_y):
        take = np.sort(stratified_take(train_y, args.train_images / len(train_y), rng))
        train_x, train_y = train_x[take], train_y[take]
    test_x, test_y = data.test.images, data.test.labels
    if args.test_images and args.test_images < len(test_y):
        test_x, test_y = test_x[:args.test_images], test_y[:args.test_images]
    flat = train_x.reshape(len(train_x), train_x.shape[1], -1) / 255.0
    mean, std = tuple(flat.mean((0, 2)).tolist()), tuple(flat.std((0, 2)).tolist())
    all_cases, _ = cases(params, baselines=True)
    case = next(c for c in all_cases if c.name == args.accuracy)
    if case.kind == "supernet":
        raise SystemExit("--accuracy takes a fixed module or a plain baseline")
    seed = int(params.get("seed", 0)) if args.seed is None else args.seed
    cfg = dataclasses.replace(case.cfg, epochs=args.epochs, seed=seed)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s): {case.name} on {len(train_y)} "
          f"Fashion-MNIST training images, {args.epochs} epochs, batch {cfg.batch_size}, seed {seed}; "
          f"test on {len(test_y)}", flush=True)
    rows = []
    for precision in PRECISIONS:
        module = case.build(seed=seed)[0]  # initial weights from the seed; m1 stands alone (no prefix)
        prefix = Prefix((), mean, std)
        history: list[dict[str, Any]] = []
        STEP_TIMES.clear()
        start = time.perf_counter()
        try:
            loop.train_module(module, prefix, train_x, train_y, cfg, cost_of=lambda _a: case.cost,
                              cost_max=case.cost, exit_saving=case.exit_saving, progress=False,
                              precision=precision, on_epoch=lambda e, rec, *_, h=history: h.append(rec))
        except loop.TrainingDiverged as e:
            rows.append({"precision": precision, "diverged": str(e), "steps_run": len(STEP_TIMES)})
            print(f"{precision}: {e}", flush=True)
            continue
        seconds = time.perf_counter() - start
        step_ms = statistics.median(STEP_TIMES) * 1e3
        logits, _ = module_outputs(module, prefix, test_x, module.default_arch(), 512)
        acc32 = float((logits.float().argmax(1).numpy() == test_y).mean())
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            logits16, _ = module_outputs(module, prefix, test_x, module.default_arch(), 512)
        acc16 = float((logits16.float().argmax(1).numpy() == test_y).mean())
        rows.append({"precision": precision, "test_accuracy_fp32_eval": acc32, "test_accuracy_bf16_eval": acc16,
                     "train_seconds": round(seconds, 1), "median_step_ms": round(step_ms, 3),
                     "epochs": [{k: v for k, v in r.items() if k in ("epoch", "loss", "ce", "train_acc", "seconds")}
                                for r in history]})
        last = history[-1]
        print(f"{precision}: test accuracy {100 * acc32:.2f}% (fp32 eval), {100 * acc16:.2f}% (bf16 eval); "
              f"last epoch loss {last['loss']:.4f}, train acc {100 * last['train_acc']:.2f}%; "
              f"{seconds:.1f} s, median step {step_ms:.2f} ms", flush=True)
    return {"mode": "accuracy", "net": case.name, "train_images": len(train_y), "test_images": len(test_y),
            "epochs": args.epochs, "seed": seed, "rows": rows}


# ------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (set OMP_NUM_THREADS alike)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of every run")
    p.add_argument("--repeats", type=int, default=2, help="fp32/bf16 pairs per module (order alternates)")
    p.add_argument("--only", nargs="*", default=None, help="time only these (m1 m2 m3 plain_small plain_large)")
    p.add_argument("--no-baselines", dest="baselines", action="store_false", help="skip plain_small/plain_large")
    p.add_argument("--layout", default="channels_last", choices=("channels_last", "contiguous"))
    p.add_argument("--dtypes", action="store_true", help="also print the output dtypes of one bf16 step's ops")
    p.add_argument("--accuracy", default=None, metavar="NET",
                   help="instead of timing: train NET (m1, plain_small or plain_large) alone "
                        "on Fashion-MNIST in fp32 and bf16 and report test accuracy")
    p.add_argument("--epochs", type=int, default=3, help="--accuracy: epochs")
    p.add_argument("--train-images", type=int, default=10000, help="--accuracy: stratified training subset (0: all)")
    p.add_argument("--seed", type=int, default=None, help="--accuracy: seed of weights, data order and "
                   "augmentation (default: params' seed); the same for both precisions")
    p.add_argument("--test-images", type=int, default=0, help="--accuracy: first N test images (0: all 10,000)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON output (default bench/out/cpu_bf16.json, or cpu_bf16_accuracy.json)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    result = accuracy(args, params) if args.accuracy else timing(args, params)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    result = {"torch": torch.__version__, "cpu": cpu, "threads": torch.get_num_threads(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "onednn_isa": torch.backends.cpu.get_cpu_capability(), **result}
    out = args.out or Path("bench/out/cpu_bf16_accuracy.json" if args.accuracy else "bench/out/cpu_bf16.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
