"""Measure the cost model of the cascade on this machine: MACs of every (layer, op) of every module
(``--out``, the DVC output: deterministic, byte-identical between runs) and a latency lookup table
(median ms at batch 1 and 64; ``--latency``, a metrics file, also logged to MLflow): timings never go
into a DVC output, so identical runs give identical dvc.lock hashes."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from pipeline.device import ComputeConfig
from pipeline.io import read_json, write_json
from pipeline.models.config import STRIDE_ABOVE, ModelConfig
from pipeline.models.profile import LATENCY_FILE, CostModel, profile_cascade, split_profile
from pipeline.params.config import ParamsRecord, ProfileConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from stages.common import cli, params_of, parser


def write_profile(out: Path, latency_out: Path, table: dict) -> None:
    """The deterministic costs to ``out``, the measured latencies to ``latency_out``."""
    costs, measured = split_profile(table)
    write_json(out, costs)
    write_json(latency_out, measured)


@cli
def main(argv: list[str] | None = None) -> None:
    p = parser("profile", __doc__)
    p.add_argument("--data", type=Path, required=True, help="directory written by ingest (for shapes and classes)")
    p.add_argument("--out", type=Path, required=True, help="cost model JSON (MACs, shapes: deterministic)")
    p.add_argument("--latency", type=Path, default=None,
                   help=f"measured latency JSON (default: <root>/{LATENCY_FILE})")
    args = p.parse_args(argv)
    latency_out = args.latency or args.root / LATENCY_FILE
    params = params_of(args)
    model, cfg = ModelConfig.from_params(params), ProfileConfig.from_params(params)
    record = ParamsRecord.from_params(params)  # what MLflow logs: the sections as written
    device = ComputeConfig.from_params(params).resolve()  # latencies on it; MACs never depend on it
    meta = read_json(args.data / "meta.json")
    channels, size = meta["image_shape"][0], meta["image_shape"][1]
    spec = model.cascade_spec(channels, len(meta["classes"]), size)
    if spec.modules[0].stride != model.specs[0].stride:
        print(f"profile: {channels}x{size}x{size} input is over {STRIDE_ABOVE} px: module 1 enters at stride "
              f"{spec.modules[0].stride} (feature maps {spec.modules[0].channels}x{(size + 1) // 2}x"
              f"{(size + 1) // 2}) with {spec.modules[0].layers} layers before its exit", flush=True)
    with stage_run("profile", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"modules": record.of("modules"), "profile": record.of("profile", optional=True),
                           "device": str(device)}) as run:
        with tqdm(total=len(spec.modules), desc="profile modules", unit="module") as bar:
            table = profile_cascade(spec, seed=cfg.seed, repeats=cfg.repeats, batch_sizes=cfg.batch_sizes,
                                    progress=bar, device=device)
        write_profile(args.out, latency_out, table)
        costs = CostModel(table)
        for k in range(1, costs.n_modules + 1):
            arch = costs.default_arch(k)
            line = {f"m{k}_min_macs": costs.min_macs(k), f"m{k}_max_macs": costs.max_macs(k),
                    f"m{k}_default_macs": costs.macs(k, arch), f"m{k}_default_ms_b1": costs.latency_ms(k, arch, 1)}
            run.log_metrics(line)
            print(f"profile m{k}: MACs {costs.min_macs(k):,}..{costs.max_macs(k):,} (default {costs.macs(k, arch):,}),"
                  f" default path {costs.latency_ms(k, arch, 1):.3f} ms at batch 1")
        run.log_artifact(args.out)
        run.log_artifact(latency_out)


if __name__ == "__main__":
    raise SystemExit(main())
