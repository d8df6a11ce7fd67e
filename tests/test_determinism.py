"""What the stages write as DVC outputs is byte-identical between identical runs; every
timing (wall seconds, images/s, latencies, thread count) goes to metrics files or MLflow only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from pipeline.io import read_json, write_json
from pipeline.models.cascade import build_modules, feature_shapes
from pipeline.models.modules import NO_ARCH
from pipeline.models.profile import CostModel, profile_cascade
from pipeline.models.store import ModuleInfo, load_module
from pipeline.routing.candidates import evaluate_candidates, pareto_front, search_result, split_timings
from pipeline.train.loop import train_module
from pipeline.train.outputs import write_train_outputs
from pipeline.train.prefix import Prefix
from stages.profile import write_profile
from tests.train.test_loop import MEAN, SPEC, STD, cfg, costs, pattern_data

TIMING_WORDS = ("latency", "seconds", "images_per_s", "threads")


def files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def assert_same_files(a: Path, b: Path) -> None:
    fa, fb = files(a), files(b)
    assert fa.keys() == fb.keys() and fa
    for name in fa:
        assert fa[name] == fb[name], name


def test_profile_output_is_byte_identical_and_latency_is_split_out(tmp_path: Path) -> None:
    for run in ("a", "b"):
        table = profile_cascade(SPEC, seed=0, repeats=1, batch_sizes=(1, 4))
        write_profile(tmp_path / run / "profile.json", tmp_path / run / "metrics" / "latency.json", table)
    assert (tmp_path / "a" / "profile.json").read_bytes() == (tmp_path / "b" / "profile.json").read_bytes()
    text = (tmp_path / "a" / "profile.json").read_text()
    assert not any(word in text for word in TIMING_WORDS)

    merged = CostModel.load(tmp_path / "a" / "profile.json", tmp_path / "a" / "metrics" / "latency.json")
    bare = CostModel.load(tmp_path / "a" / "profile.json", tmp_path / "missing.json")
    arch = merged.default_arch(2)
    assert merged.latency_ms(2, arch, 1) > 0 and merged.latency_ms(2, arch, 4) > 0
    assert bare.latency_ms(2, arch, 1) is None
    assert merged.macs(2, arch) == bare.macs(2, arch) == CostModel(table).macs(2, arch)
    assert merged.exit_saving(1) == bare.exit_saving(1)


def _train_outputs(out: Path) -> None:
    modules = build_modules(SPEC, seed=0)
    images, labels = pattern_data(64)
    cost_of, cost_max = costs(modules, 1)
    result = train_module(modules[1], Prefix(((modules[0], NO_ARCH),), MEAN, STD), images, labels,
                          cfg(epochs=2, batch_size=16), cost_of=cost_of, cost_max=cost_max, exit_saving=0.5,
                          progress=False)
    assert all("seconds" in h and "images_per_s" in h for h in result.history)  # still there for logging
    shape = feature_shapes(SPEC)[1]
    info = ModuleInfo(2, SPEC.modules[1], shape[0], SPEC.num_classes, tuple(shape), MEAN, STD)
    out.mkdir(parents=True)
    write_train_outputs(out, modules[1], info, result)


def test_train_outputs_are_byte_identical(tmp_path: Path) -> None:
    _train_outputs(tmp_path / "a")
    _train_outputs(tmp_path / "b")
    assert_same_files(tmp_path / "a", tmp_path / "b")
    written = set(files(tmp_path / "a"))
    assert {"module.pt", "module.json", "history.csv", "iterations.csv", "prob_model.json"} <= written
    history = pd.read_csv(tmp_path / "a" / "history.csv")
    assert not any(word in column for column in history.columns for word in TIMING_WORDS)
    assert list(history["epoch"]) == [1, 2]
    module, _ = load_module(tmp_path / "a")  # still a loadable module directory
    assert isinstance(module, torch.nn.Module)


def test_search_output_is_byte_identical(tmp_path: Path) -> None:
    modules = build_modules(SPEC, seed=0)
    module = modules[1]
    features = torch.randn(40, *feature_shapes(SPEC)[1], generator=torch.Generator().manual_seed(0))
    labels = torch.arange(40) % SPEC.num_classes
    archs = list(module.space.enumerate())[:5]
    clock = iter(range(1000))
    for run in ("a", "b"):
        rows = evaluate_candidates(module, features, labels, archs, macs_of=lambda a: 100 + len(a.key()),
                                   latency_of=lambda a, b: 0.1 * next(clock), cost_max=1000, lambda_c=0.1)
        latency = split_timings(rows)  # timings differ between the runs, like real measurements
        assert set(latency) == {a.key() for a in archs} and all(set(v) == {"latency_ms_b1", "latency_ms_b64"}
                                                               for v in latency.values())
        target = max(rows, key=lambda r: r["perf"])
        write_json(tmp_path / run / "search.json", search_result(2, "probmodel", rows, target,
                                                                 pareto_front(rows, 3), None))
    assert (tmp_path / "a" / "search.json").read_bytes() == (tmp_path / "b" / "search.json").read_bytes()
    assert "latency" not in (tmp_path / "a" / "search.json").read_text()
    assert read_json(tmp_path / "a" / "search.json")["samples"] == 5
