"""Measure the cost model of the cascade on this machine: MACs of every (layer, op) of every module
(``--out``, the DVC output: deterministic, byte-identical between runs) and a latency lookup table
(median ms at batch 1 and 64; ``--latency``, a metrics file, also logged to MLflow): timings never go
into a DVC output, so identical runs give identical dvc.lock hashes."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from pipeline.device import ComputeConfig
from pipeline.io import write_json
from pipeline.models.config import ModelConfig
from pipeline.models.profile import LATENCY_FILE, split_profile
from pipeline.params.config import ParamsRecord, ProfileConfig, TrackingConfig
from pipeline.registry.tracking import stage_run
from pipeline.workflows.profile import cascade_for, module_lines, profile_model
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
    spec, note = cascade_for(model, args.data)
    if note:
        print(note, flush=True)
    with stage_run("profile", experiment=TrackingConfig.from_params(params).experiment, root=args.root,
                   params={"modules": record.of("modules"), "profile": record.of("profile", optional=True),
                           "device": str(device)}) as run:
        with tqdm(total=len(spec.modules), desc="profile modules", unit="module") as bar:
            table = profile_model(spec, cfg, device, progress=bar)
        write_profile(args.out, latency_out, table)
        for metrics, line in module_lines(table):
            run.log_metrics(metrics)
            print(line)
        run.log_artifact(args.out)
        run.log_artifact(latency_out)


if __name__ == "__main__":
    raise SystemExit(main())
