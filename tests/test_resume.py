"""A killed training resumes bitwise-identical; a killed stage run ends KILLED (README "Recovery")."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.models.cascade import build_modules
from pipeline.models.modules import NO_ARCH
from pipeline.train.config import TrainConfig
from pipeline.train.loop import history_frame_records, train_module
from pipeline.train.prefix import Prefix
from pipeline.train.resume import (
    checkpoint_cache,
    checkpoint_key,
    clean_stale_checkpoints,
    clean_stale_temporaries,
    discard_checkpoints,
    key_inputs,
    prepare_checkpoints,
)
from tests.train.test_loop import MEAN, SPEC, STD, assert_bitwise_equal, cfg, costs, pattern_data, state


class Kill(Exception):
    """What a callback raises to simulate the process dying right after an epoch."""


def run(k: int, config: TrainConfig, checkpoints: Path | None = None, kill_after: int | None = None):
    """A fresh cascade (seed 0, as a re-run stage would build it), then module k trained; the global
    RNGs are scrambled first, as a new process would have them."""
    torch.manual_seed(1234)
    np.random.seed(99)
    modules = build_modules(SPEC, seed=0)
    images, labels = pattern_data(96)
    prefix = Prefix(tuple((modules[j], NO_ARCH) for j in range(k)), MEAN, STD)
    cost_of, cost_max = costs(modules, k)

    def on_epoch(epoch, record, module, prob_model):
        if kill_after is not None and epoch == kill_after:
            raise Kill(epoch)

    result = train_module(modules[k], prefix, images, labels, config, cost_of=cost_of, cost_max=cost_max,
                          exit_saving=0.5, on_epoch=on_epoch, progress=False, checkpoint_dir=checkpoints)
    return modules[k], result


def prob_tables(result):
    return None if result.prob_model is None else [p.clone() for p in result.prob_model.table]


CASES = {
    "supernet-probmodel": (1, dict(sampler="probmodel", sandwich=True, distill=0.5)),
    "supernet-uniform": (1, dict(sampler="uniform")),
    "fixed": (0, dict()),
}


@pytest.mark.parametrize("case", CASES)
def test_killed_training_resumes_bitwise_identical(case: str, tmp_path: Path) -> None:
    k, extra = CASES[case]
    config = cfg(epochs=3, batch_size=16, schedule="step", warmup_epochs=0.5, **extra)
    ref_module, ref = run(k, config)

    cache = tmp_path / "cache"
    with pytest.raises(Kill):
        run(k, config, cache, kill_after=2)
    assert sorted(p.name for p in cache.iterdir()) == ["epoch_0002.pt"]  # newest only, no temp file
    module, resumed = run(k, config, cache)

    assert_bitwise_equal(state(ref_module), state(module))
    assert str(history_frame_records(ref.history)) == str(history_frame_records(resumed.history))  # NaN-safe
    assert str(ref.iterations) == str(resumed.iterations)
    a, b = prob_tables(ref), prob_tables(resumed)
    if case == "supernet-probmodel":
        assert a is not None and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)
    else:
        assert a is None and b is None
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]


def test_a_corrupt_or_foreign_checkpoint_is_ignored(tmp_path: Path) -> None:
    config = cfg(epochs=2, batch_size=16)
    ref_module, _ = run(1, config)
    cache = tmp_path / "cache"
    with pytest.raises(Kill):
        run(1, config, cache, kill_after=1)
    (cache / "epoch_0002.pt").write_bytes(b"truncated")  # newest is garbage: falls back to epoch 1
    with pytest.warns(UserWarning, match="ignoring checkpoint"):
        module, _ = run(1, config, cache)
    assert_bitwise_equal(state(ref_module), state(module))

    other = tmp_path / "other"
    with pytest.raises(Kill):
        run(1, cfg(epochs=2, batch_size=16, lr=0.01), other, kill_after=1)  # another config
    with pytest.warns(UserWarning, match="another config"):
        module, _ = run(1, config, other)
    assert_bitwise_equal(state(ref_module), state(module))


def test_checkpoint_key_follows_the_inputs(tmp_path: Path) -> None:
    data = tmp_path / "train.npz"
    data.write_bytes(b"x")
    config = cfg()
    key = checkpoint_key(1, config, {"kind": "fixed"}, 0, [data])
    assert key == checkpoint_key(1, config, {"kind": "fixed"}, 0, [data])
    assert key != checkpoint_key(2, config, {"kind": "fixed"}, 0, [data])
    assert key != checkpoint_key(1, cfg(lr=0.01), {"kind": "fixed"}, 0, [data])
    assert key != checkpoint_key(1, config, {"kind": "supernet"}, 0, [data])
    assert key != checkpoint_key(1, config, {"kind": "fixed"}, 1, [data])
    data.write_bytes(b"xy")
    assert key != checkpoint_key(1, config, {"kind": "fixed"}, 0, [data])


def test_checkpoint_key_ignores_rewrites_of_identical_inputs(tmp_path: Path) -> None:
    """ingest is always re-run by dvc repro and rewrites the same bytes: a killed train stage still resumes."""
    data = tmp_path / "train.npz"
    data.write_bytes(b"same bytes")
    key = checkpoint_key(1, cfg(), {"kind": "fixed"}, 0, [data])
    data.unlink()
    data.write_bytes(b"same bytes")
    os.utime(data, ns=(1, 1))
    assert checkpoint_key(1, cfg(), {"kind": "fixed"}, 0, [data]) == key
    data.write_bytes(b"same bytez")
    assert checkpoint_key(1, cfg(), {"kind": "fixed"}, 0, [data]) != key


def test_stale_temporaries_of_a_killed_stage_are_removed(tmp_path: Path) -> None:
    module_dir = tmp_path / "m1"
    (module_dir / ".train.abc123" / "train").mkdir(parents=True)
    (module_dir / "train").mkdir()
    (module_dir / "search").mkdir()
    removed = clean_stale_temporaries(module_dir)
    assert [p.name for p in removed] == [".train.abc123"]
    assert sorted(p.name for p in module_dir.iterdir()) == ["search", "train"]


def test_checkpoints_of_other_keys_are_removed(tmp_path: Path) -> None:
    cache = checkpoint_cache(tmp_path, "m1", "new")
    assert cache == tmp_path / ".cache" / "train" / "m1-new"
    assert clean_stale_checkpoints(cache, "m1") == []  # no .cache/train yet
    for name in ("m1-new", "m1-old", "m1-older", "m10-other", "m2-old"):
        (cache.parent / name).mkdir(parents=True)
    removed = clean_stale_checkpoints(cache, "m1")
    assert [p.name for p in removed] == ["m1-old", "m1-older"]
    assert sorted(p.name for p in cache.parent.iterdir()) == ["m1-new", "m10-other", "m2-old"]


def test_prepare_checkpoints_cleans_up_and_says_so_on_rank_0_only(tmp_path: Path) -> None:
    module_dir, root = tmp_path / "models" / "m1", tmp_path / "repo"
    (module_dir / ".train.dead").mkdir(parents=True)
    (root / ".cache" / "train" / "m1-old").mkdir(parents=True)
    (root / ".cache" / "train" / "m1-key").mkdir()
    (root / ".cache" / "train" / "m1-key" / "epoch_0002.pt").write_bytes(b"")
    said: list[str] = []
    cache = prepare_checkpoints(root, module_dir, "m1", "key", clean=False, log=said.append)
    assert cache == root / ".cache" / "train" / "m1-key" and said == []  # another rank: the path only
    assert (module_dir / ".train.dead").is_dir() and (root / ".cache" / "train" / "m1-old").is_dir()
    assert prepare_checkpoints(root, module_dir, "m1", "key", log=said.append) == cache
    assert said == [f"train@m1: removed {module_dir / '.train.dead'} (left by a killed run)",
                    f"train@m1: removed stale checkpoints {root / '.cache' / 'train' / 'm1-old'}",
                    f"train@m1: resuming from the checkpoint in {cache}"]
    assert list(module_dir.iterdir()) == [] and [p.name for p in cache.parent.iterdir()] == ["m1-key"]
    discard_checkpoints(cache)
    assert not cache.exists()
    said.clear()
    prepare_checkpoints(root, module_dir, "m1", "key", log=said.append)
    assert said == []  # nothing left to remove or resume


def test_key_inputs_are_the_modules_data_and_the_frozen_modules(tmp_path: Path) -> None:
    data, graded, profile, models = tmp_path / "d", tmp_path / "g", tmp_path / "p.json", tmp_path / "m"
    assert key_inputs(data, graded, profile, models, 1, None) == [
        data / "train.npz", data / "meta.json", graded / "m1.txt", profile]
    assert key_inputs(data, graded, profile, models, 3, tmp_path / "t")[3:] == [
        profile, models / "m1" / "train", models / "m1" / "select", models / "m2" / "train",
        models / "m2" / "select", tmp_path / "t"]


# ------------------------------------------------------------------------------------------ MLflow (C)


def _status(root: Path, run_id: str) -> str:
    from mlflow import MlflowClient

    from pipeline.registry.tracking import default_tracking_uri

    uri = default_tracking_uri(root)
    return MlflowClient(tracking_uri=uri).get_run(run_id).info.status


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def test_interrupted_stage_run_ends_killed(store: Path) -> None:
    from pipeline.registry.tracking import stage_run

    ids = {}
    with pytest.raises(KeyboardInterrupt):
        with stage_run("train@m1", experiment="resume", root=store) as run:
            ids["killed"] = run.run_id
            raise KeyboardInterrupt
    with pytest.raises(RuntimeError):
        with stage_run("train@m1", experiment="resume", root=store) as run:
            ids["failed"] = run.run_id
            raise RuntimeError("boom")
    with stage_run("train@m1", experiment="resume", root=store) as run:
        ids["ok"] = run.run_id
    assert _status(store, ids["killed"]) == "KILLED"
    assert _status(store, ids["failed"]) == "FAILED"
    assert _status(store, ids["ok"]) == "FINISHED"


def test_a_sigkilled_stage_run_is_ended_by_the_next_one(store: Path) -> None:
    """SIGKILL skips every ``finally``: the run stays RUNNING until a later stage run on this host
    sees that its process is gone and ends it KILLED; while the process lives its run is left alone."""
    import signal
    import subprocess
    import sys

    from pipeline.registry.tracking import stage_run

    code = ("import sys, time\nfrom pipeline.registry.tracking import stage_run\n"
            "with stage_run('train@m1', experiment='resume', root=sys.argv[1]) as run:\n"
            "    print(run.run_id, flush=True)\n    time.sleep(120)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(store)], stdout=subprocess.PIPE, text=True)
    try:
        orphan = child.stdout.readline().split()[0]
        with stage_run("search@m1", experiment="resume", root=store):
            assert _status(store, orphan) == "RUNNING"  # its process is alive: not ours to end
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        assert _status(store, orphan) == "RUNNING"  # nobody ended it
        with stage_run("train@m1", experiment="resume", root=store) as run:
            assert _status(store, orphan) == "KILLED"
            assert _status(store, run.run_id) == "RUNNING"
    finally:
        child.kill()


def test_sigterm_inside_a_stage_run_ends_it_killed(store: Path) -> None:
    from pipeline.registry.tracking import StageKilled, stage_run

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(StageKilled):
        with stage_run("train@m2", experiment="resume", root=store) as run:
            run_id = run.run_id
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # the handler runs between bytecodes
                pass
    assert _status(store, run_id) == "KILLED"
    assert signal.getsignal(signal.SIGTERM) is before


# ------------------------------------------------------------------------------------ the stage itself


def _tiny_repo(root: Path) -> list[str]:
    """A repository root with the prepared data, the curriculum list and the profile of a one-supernet
    cascade; returns the train stage's argv."""
    import json

    import yaml

    from pipeline.io import Split, save_split
    from pipeline.params.config import deep_merge, load_params
    from stages import profile

    repo = Path(__file__).resolve().parents[1]
    params = deep_merge(load_params(repo / "params.yaml"), load_params(repo / "profiles" / "tiny.yaml"))
    params["modules"]["m1"] = {"spec": {"kind": "supernet", "channels": 6, "stride": 1, "layers": 2,
                                        "ops": ["conv3", "dw3", "skip"], "default_op": "conv3"},
                               "train": {"sandwich": True, "distill": 0.5}}
    params["train"].update(epochs=3, batch_size=16, m=2)
    root.mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    images, labels = pattern_data(80)
    images = np.pad(images, ((0, 0), (0, 0), (2, 2), (2, 2)))  # (N, 1, 16, 16)
    ids = np.array([f"img-{i:03d}" for i in range(len(labels))])
    (root / "data" / "prepared").mkdir(parents=True)
    (root / "data" / "graded").mkdir(parents=True)
    save_split(root / "data" / "prepared" / "train.npz", Split("train", images[:64], labels[:64], ids[:64]))
    save_split(root / "data" / "prepared" / "calib.npz", Split("calib", images[64:], labels[64:], ids[64:]))
    save_split(root / "data" / "prepared" / "route.npz", Split("route", images[64:], labels[64:], ids[64:]))
    (root / "data" / "prepared" / "meta.json").write_text(json.dumps(
        {"image_shape": [1, 16, 16], "classes": ["h", "v", "c", "f"]}))
    (root / "data" / "graded" / "m1.txt").write_text("\n".join(ids[:64]) + "\n")
    common = ["--params", str(root / "params.yaml"), "--root", str(root),
              "--data", str(root / "data" / "prepared")]
    assert profile.main([*common, "--out", str(root / "models" / "profile.json")]) == 0
    return [*common, "--module", "1", "--graded", str(root / "data" / "graded"), "--profile",
            str(root / "models" / "profile.json"), "--models", str(root / "models"),
            "--metrics", str(root / "metrics" / "train_m1.json")]


def test_killed_train_stage_resumes_and_cleans_up(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from mlflow import MlflowClient

    from pipeline.registry.tracking import default_tracking_uri
    from pipeline.workflows import train as train_workflow  # the stage's workflow: it calls train_module
    from stages import search
    from stages import train as stage

    ref_argv = _tiny_repo(store / "ref")
    assert stage.main(ref_argv) == 0
    ref = store / "ref" / "models" / "m1" / "train"
    assert not list((store / "ref" / ".cache" / "train").iterdir())
    assert json.loads((store / "ref" / "metrics" / "profile_latency.json").read_text())["modules"]
    assert "latency" not in (store / "ref" / "models" / "profile.json").read_text()
    search_argv = [*ref_argv[:6], "--module", "1",
                   "--profile", str(store / "ref" / "models" / "profile.json"),
                   "--models", str(store / "ref" / "models"),
                   "--metrics", str(store / "ref" / "search_m1.json"),
                   "--plots", str(store / "ref" / "plots")]
    assert search.main(search_argv) == 0
    assert "latency" not in (store / "ref" / "models" / "m1" / "search" / "search.json").read_text()
    assert json.loads((store / "ref" / "search_m1.json").read_text())["target_latency_ms_b1"] > 0

    root = store / "killed"
    argv = _tiny_repo(root)
    real = train_workflow.train_module

    def killed_after_epoch_2(*args, on_epoch, **kwargs):
        def hook(epoch, *rest):
            on_epoch(epoch, *rest)
            if epoch == 2:
                raise KeyboardInterrupt  # Ctrl-C / SIGTERM right after epoch 2's checkpoint
        return real(*args, on_epoch=hook, **kwargs)

    monkeypatch.setattr(train_workflow, "train_module", killed_after_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        stage.main(argv)
    monkeypatch.setattr(train_workflow, "train_module", real)
    caches = list((root / ".cache" / "train").iterdir())
    assert len(caches) == 1 and [p.name for p in caches[0].iterdir()] == ["epoch_0002.pt"]
    assert not (root / "models" / "m1" / "train").exists()
    (root / "models" / "m1" / ".train.deadbeef" / "train").mkdir(parents=True)  # what a SIGKILL leaves
    (root / ".cache" / "train" / "m1-oldinputs").mkdir()  # checkpoints of inputs that changed since

    assert stage.main(argv) == 0
    out = root / "models" / "m1" / "train"
    assert sorted(p.name for p in (root / "models" / "m1").iterdir()) == ["train"]
    assert list((root / ".cache" / "train").iterdir()) == []
    assert json.loads((root / "metrics" / "train_m1.json").read_text())["resumed_after_epoch"] == 2
    for name in ("module.pt", "history.csv", "iterations.csv", "prob_model.json"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    assert not (out / "checkpoints").exists()

    client = MlflowClient(tracking_uri=default_tracking_uri(root))
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.stage = 'train@m1'", order_by=["attributes.start_time ASC"])
    assert [r.info.status for r in runs] == ["KILLED", "FINISHED"]
