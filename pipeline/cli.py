"""The ``cascade`` command: recognise image files with a saved cascade, describe one, serve one over
HTTP or export it (``serve`` and ``export`` live in :mod:`pipeline.serving.commands`).

A thin shell over :mod:`pipeline.routing.package`: argument parsing, model resolution, printing.
Exit status: 0 all answered, 1 some file could not be read (the others are still answered),
2 the model (or the command line) is unusable.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.registry.model_uri import RegistryUnavailable, resolve_model_uri
from pipeline.serving.commands import add_commands

if TYPE_CHECKING:  # torch is imported only when a command runs, so --help stays instant
    from pipeline.routing.package import LoadedCascade

DEFAULT_MODEL = "models/cascade"
DEFAULT_MAX_PIXELS = 4096 * 4096  # pipeline.data.sources.DEFAULT_MAX_PIXELS, not imported: --help stays fast


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cascade", description="Early-exit cascade image classifier.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    model_help = (
        f"model directory, or models:/<name>@<alias> or models:/<name>/<version> (default {DEFAULT_MODEL})"
    )

    rec = sub.add_parser("recognize", help="classify image files: PNG, JPEG, WebP, BMP, TIFF, GIF, ... "
                                         "(folders are searched recursively)")
    rec.add_argument("paths", nargs="+", metavar="PATH", help="image files or folders")
    rec.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    rec.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    rec.add_argument("--batch-size", type=_positive_int, default=256, help="images per forward pass")
    rec.add_argument("--max-pixels", type=_positive_int, default=DEFAULT_MAX_PIXELS, metavar="N",
                     help="refuse an image whose header says more than N pixels (width x height), "
                          f"before decoding it (default {DEFAULT_MAX_PIXELS:,})")
    rec.add_argument("--device", default="auto",
                     help="where the cascade runs: auto (cuda if available, else cpu), cpu, cuda or cuda:N "
                          "(default auto); answers do not depend on it beyond float rounding")
    rec.set_defaults(func=_cmd_recognize)

    info = sub.add_parser("info", help="describe a saved cascade")
    info.add_argument("--model", default=DEFAULT_MODEL, help=model_help)
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(func=_cmd_info)
    add_commands(sub, DEFAULT_MODEL)
    return parser


def _error(message: str, stream: TextIO | None = None) -> None:
    print(f"error: {message}", file=stream or sys.stderr)


def _open_model(model: str, device: str = "cpu") -> LoadedCascade | None:
    """The loaded cascade on ``device`` (a ``--device`` value), or None after printing why not. A
    registered model is downloaded into a temporary folder that is removed once its weights are loaded."""
    from pipeline.device import resolve_device

    try:
        where = resolve_device(device, key="--device")
    except ValueError as exc:  # a bad spelling, or CUDA asked for on a machine without it
        _error(str(exc))
        return None

    with tempfile.TemporaryDirectory(prefix="cascade-model-") as scratch:  # a download is gone after loading
        return _load(model, where, scratch)


def _load(model: str, where: Any, scratch: str) -> LoadedCascade | None:
    from pipeline.routing.package import load_cascade

    try:
        directory = resolve_model_uri(model, scratch)
    except RegistryUnavailable:
        _error("registry support not available")
        return None
    except ValueError as exc:
        _error(str(exc))
        return None
    except Exception as exc:  # whatever the registry backend raises (unknown model, no server, ...)
        _error(f"cannot fetch model {model}: {exc}")
        return None
    try:
        return load_cascade(directory, where)
    except ValueError as exc:
        _error(f"cannot load model {model}: {exc}")
        return None


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _cmd_recognize(args: argparse.Namespace) -> int:
    from pipeline.routing.recognize import collect_image_paths, recognize_files

    loaded = _open_model(args.model, args.device)
    if loaded is None:
        return 2
    files, errors = collect_image_paths(args.paths)
    rows, decode_errors = recognize_files(loaded, files, batch_size=args.batch_size,
                                          max_pixels=args.max_pixels)
    errors += decode_errors
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        cells = [
            [r["path"], r["class_name"], f"{r['confidence']:.3f}", str(r["exit"]),
             format_subnets(r["subnets"]), f"{r['macs']:,}"]
            for r in rows
        ]
        print(_table(["path", "class", "confidence", "exit", "subnets", "MACs"], cells, right={2, 3, 5}))
    for err in errors:
        _error(f"{err['path']}: {err['error']}")
    return 1 if errors else 0


def _flatten(info: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested ``meta.info`` as dotted ``key: value`` lines (lists and scalars as JSON)."""
    if isinstance(info, dict) and info:
        out = []
        for key, value in info.items():
            out += _flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    return [(prefix, info if isinstance(info, str) else json.dumps(info, default=str))]


def _shape(shape: Sequence[int]) -> str:
    return "x".join(str(v) for v in shape)


def _info_text(summary: dict[str, Any], model: str) -> str:
    lines = [
        f"model: {model}",
        f"input: {_shape(summary['image_shape'])} uint8, normalised x/255 then (x - {summary['mean']}) / "
        f"{summary['std']}; confidence: {summary['confidence_kind']}",
        f"classes ({len(summary['classes'])}): {', '.join(summary['classes'])}",
    ]
    for m in summary["modules"]:
        threshold = "last exit (always answers)" if m["threshold"] is None else f"{m['threshold']:g}"
        ops = f" ops {', '.join(m['ops'])}" if m["ops"] else ""
        lines.append(
            f"module {m['index']}: {m['kind']}{ops}; {m['channels']} channels, stride {m['stride']}, "
            f"{m['layers']} layer(s), input {_shape(m['input_shape'])}; threshold {threshold}"
        )
        routing = "per-image predictor" if m["routing"] == "predictor" else "static"
        lines.append(f"  routing: {routing}, predictor MACs {m['predictor_macs']:,}")
        for r, cand in enumerate(m["candidates"], start=1):
            lines.append(f"  candidate {r}: {cand['subnet'] or 'fixed'}  MACs {cand['macs']:,}")
    lines += points_lines(summary["operating_points"])
    figures = _flatten(summary["info"]) if summary["info"] else []
    if figures:
        lines.append("info:")
        lines += [f"  {key}: {value}" for key, value in figures]
    return "\n".join(lines)


def _cmd_info(args: argparse.Namespace) -> int:

    loaded = _open_model(args.model)
    if loaded is None:
        return 2
    summary = describe_cascade(loaded)
    print(json.dumps(summary, indent=2, default=str) if args.json else _info_text(summary, args.model))
    return 0



def describe_cascade(loaded: LoadedCascade) -> dict[str, Any]:
    """A JSON-able summary of the modules, their candidates and costs, thresholds and classes."""
    from pipeline.routing.package import input_shapes

    stages, meta = loaded.stages, loaded.meta
    shapes = input_shapes([s.module.spec for s in stages], meta.image_shape)
    modules = []
    for k, (stage, shape) in enumerate(zip(stages, shapes, strict=True), start=1):
        spec = stage.module.spec
        modules.append({
            "index": k,
            "kind": spec.kind,
            "channels": spec.channels,
            "stride": spec.stride,
            "layers": spec.layers,
            "ops": list(spec.ops),
            "input_shape": list(shape),
            "candidates": [
                {"subnet": arch.key(), "macs": int(m)}
                for arch, m in zip(stage.candidates, stage.candidate_macs, strict=True)
            ],
            "routing": "predictor" if stage.predictor is not None else "static",
            "predictor_macs": int(stage.predictor_macs),
            "threshold": None if k == len(stages) else float(stage.threshold),
        })
    return {
        "image_shape": list(meta.image_shape),
        "classes": list(meta.classes),
        "mean": list(meta.mean),
        "std": list(meta.std),
        "confidence_kind": meta.confidence_kind,
        "ensemble_decay": meta.ensemble_decay,
        "modules": modules,
        "operating_points": [p.to_dict() for p in meta.operating_points],
        "info": meta.info,
    }


def points_lines(points: Sequence[dict[str, Any]]) -> list[str]:
    """The operating points as ``cascade info`` prints them: name, held-out accuracy and MACs, thresholds."""
    if not points:
        return ["operating points: none recorded (the model's own thresholds only)"]
    lines = ["operating points (held-out accuracy, mean MACs per image; a request or --p99-ms picks one):"]
    for p in points:
        acc = "?" if p["accuracy"] is None else f"{p['accuracy']:.4f}"
        macs = "?" if p["mean_macs"] is None else f"{p['mean_macs']:,.0f}"
        lines.append(f"  {p['name']}: accuracy {acc} at {macs} MACs; thresholds "
                     f"{[round(t, 4) for t in p['thresholds']]}")
    from pipeline.routing.operating_points import parse_points
    from pipeline.serving.admission import shed_note

    note = shed_note(parse_points(list(points)))  # where the points cost alike, --p99-ms cannot move usefully
    return [*lines, f"  ({note})"] if note else lines


def format_subnets(subnets: Sequence[str]) -> str:
    """Human form of a row's ``subnets`` (``recognize_arrays`` names a fixed module ``fixed``)."""
    return " ; ".join(s if s else "fixed" for s in subnets)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cascade`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
