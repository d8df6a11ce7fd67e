"""The registry: gate, lineage, payload decoding, the register stage on the embedded store, and a real
``mlflow server`` and ``mlflow models serve`` on loopback answering like the local engine."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from pipeline.data.sources import decode_image_file
from pipeline.io import Split, save_split, write_json
from pipeline.params.config import ConfigError
from pipeline.registry import mlflow_models, tracking
from pipeline.registry.lineage import dvc_md5
from pipeline.registry.register import (
    CHALLENGER,
    CHAMPION,
    CLASSES_TAG,
    CURVE_TAG,
    RegisterConfig,
    accuracy_at,
    class_set_mismatch,
    curve_points,
    decode_payload,
    gate,
    image_frame,
    input_hashes,
    lineage_tags,
    metrics_from_tags,
    model_name_for,
    parse_model_uri,
    png_b64,
    predict_frame,
    register_cascade,
)
from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import recognize_arrays, recognize_files
from tests.routing.test_package import save_tiny, uint8_images, write_image_files
from tests.team import free_port, subprocess_env

VENV_BIN = Path(sys.executable).parent
CFG = RegisterConfig(model_name="tiny-cascade", acc_tolerance=0.002, macs_tolerance=0.05)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)  # module fixtures run before the autouse one
    return save_tiny(tmp_path_factory.mktemp("registry") / "model")[1]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real PNG/JPEG files (grey and RGB, several sizes) plus a corrupt one."""
    return write_image_files(tmp_path_factory.mktemp("images"))


# ------------------------------------------------------------------------------------------- modules


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports, at any depth (lazy imports inside functions included)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_no_import_cycle() -> None:
    """register -> mlflow_models -> tracking, and mlflow_models -> payload, one way only (the pyfunc
    class answers with payload; tracking imports none of the three)."""
    pkg = Path(__file__).resolve().parents[2] / "pipeline" / "registry"
    registry, models_, tracking_, payload = (imported_modules(pkg / f"{name}.py")
                                             for name in ("register", "mlflow_models", "tracking", "payload"))
    room = "pipeline.registry."
    assert {room + "tracking", room + "mlflow_models", room + "payload"} <= registry
    assert room + "payload" in models_ and room + "tracking" in models_ and room + "register" not in models_
    assert not {room + "register", room + "mlflow_models", room + "payload"} & tracking_
    assert not {room + "register", room + "tracking", room + "mlflow_models"} & payload


# ----------------------------------------------------------------------------------------------- gate


def test_first_version_passes() -> None:
    assert gate({"accuracy": 0.5, "mean_macs": 1e6}, None, 0.002, 0.05) == (
        True, ["no champion yet: the first version passes"])


def failing(reasons: list[str]) -> list[str]:
    """The checks a gate's reasons mark as failed: accuracy, mean MACs, equal cost."""
    return [next(name for name in ("accuracy", "mean MACs", "equal cost") if r.startswith(name))
            for r in reasons if r.endswith(": fail")]


@pytest.mark.parametrize(("accuracy", "macs", "passed", "failed"), [
    (0.900, 1000.0, True, []),
    (0.898, 1050.0, True, []),  # both exactly at the tolerance
    (0.8979, 1000.0, False, ["accuracy"]),
    (0.950, 1050.1, False, ["equal cost"]),  # over the cap, and no figure at the champion's cost
    (0.800, 2000.0, False, ["accuracy", "equal cost"]),
])
def test_gate_tolerances(accuracy: float, macs: float, passed: bool, failed: list[str]) -> None:
    ok, reasons = gate({"accuracy": accuracy, "mean_macs": macs}, {"accuracy": 0.9, "mean_macs": 1000.0},
                       0.002, 0.05)
    assert ok is passed and len(reasons) == (2 if macs <= 1050.0 else 3)
    assert failing(reasons) == failed


def test_accuracy_at() -> None:
    points = [(100.0, 0.80), (200.0, 0.90), (150.0, 0.70), (300.0, 0.95), (200.0, 0.85), (400.0, 0.94)]
    assert accuracy_at([], 100.0) is None
    assert accuracy_at(points, 99.0) is None  # below the cheapest point: no figure
    assert accuracy_at(points, 100.0) == pytest.approx(0.80)
    assert accuracy_at(points, 150.0) == pytest.approx(0.85)  # (150, 0.70) is off the frontier
    assert accuracy_at(points, 200.0) == pytest.approx(0.90)  # the better of the two at 200
    assert accuracy_at(points, 250.0) == pytest.approx(0.925)
    assert accuracy_at(points, 1e9) == pytest.approx(0.95)  # flat beyond; (400, 0.94) is dominated
    assert accuracy_at([(5.0, 0.5), (float("nan"), 0.9)], 10.0) == 0.5


def test_curve_points() -> None:
    budget = [{"accuracy": 0.9, "mean_macs": 2.0e6}, {"accuracy": 0.9, "mean_macs": 2.0e6}]
    evaluated = {"cascade": {"accuracy": 0.92, "mean_macs": 2.4e6, "budget_curve": [
                     {"threshold": 0.5, "accuracy": 0.91, "mean_macs": 2.2e6}]},
                 "each_exit": [{"exit": 1, "accuracy": 0.8975, "mean_macs": 1.95e6},
                               {"exit": 2, "accuracy": None, "mean_macs": 4.7e6}, "junk"],
                 "budget_curve": budget}
    assert curve_points(evaluated) == [(1.95e6, 0.8975), (2.0e6, 0.9), (2.2e6, 0.91), (2.4e6, 0.92)]
    assert curve_points({"cascade": {"accuracy": 0.5}}) == []


def test_gate_trades_cost_for_accuracy_at_equal_cost() -> None:
    champion = {"accuracy": 0.90, "mean_macs": 1000.0}
    candidate = {"accuracy": 0.93, "mean_macs": 1096.0}  # +9.6% MACs: over the 5% cap
    assert failing(gate(candidate, champion, 0.002, 0.05)[1]) == ["equal cost"]  # no curve: the cap holds
    # a cheaper setting of the candidate: at 1000 MACs it reaches 0.88 + 0.05 * 200 / 296 = 0.9138
    ok, reasons = gate(candidate, champion, 0.002, 0.05, [(800.0, 0.88), (1096.0, 0.93)])
    assert ok and len(reasons) == 3 and reasons[2].startswith("equal cost: accuracy 0.9138 at the champion's")
    assert "+0.0300 accuracy for +9.6% MACs buys accuracy: ok" in reasons[2]
    # worse than the champion at its cost: 0.85 + 0.08 * 50 / 146 = 0.8774 < 0.898
    ok, reasons = gate(candidate, champion, 0.002, 0.05, [(950.0, 0.85)])
    assert not ok and failing(reasons) == ["equal cost"] and "accuracy 0.8774" in reasons[2]
    # as good at equal cost, but the extra MACs buy no accuracy
    ok, reasons = gate({"accuracy": 0.899, "mean_macs": 1200.0}, champion, 0.002, 0.05, [(900.0, 0.95)])
    assert not ok and "buys no accuracy: fail" in reasons[2]
    # a loss beyond the tolerance is never traded, whatever the curve
    ok, reasons = gate({"accuracy": 0.89, "mean_macs": 500.0}, champion, 0.002, 0.05, [(500.0, 0.89)])
    assert not ok and failing(reasons) == ["accuracy"]


def test_gate_on_the_default_runs_figures() -> None:
    """metrics/evaluate.json of the default run as the candidate: exit 1 alone and the cascade."""
    evaluated = {"cascade": {"accuracy": 0.9192, "mean_macs": 2443844.3648},
                 "each_exit": [{"exit": 1, "accuracy": 0.8975, "mean_macs": 1953280.0},
                               {"exit": 2, "accuracy": 0.9224, "mean_macs": 4729600.0},
                               {"exit": 3, "accuracy": 0.9131, "mean_macs": 6273152.0}]}
    candidate = evaluated["cascade"]
    curve = curve_points(evaluated)
    at = accuracy_at(curve, 2.2e6)
    assert at == pytest.approx(0.8975 + (0.9192 - 0.8975) * (2.2e6 - 1953280.0) / (2443844.3648 - 1953280.0))
    assert not gate(candidate, {"accuracy": 0.915, "mean_macs": 2.2e6}, 0.002, 0.05, curve)[0]  # 0.9084
    assert gate(candidate, {"accuracy": 0.905, "mean_macs": 2.3e6}, 0.002, 0.05, curve)[0]  # 0.9128 >= 0.903


def test_gate_bad_figures() -> None:
    with pytest.raises(ValueError, match="'mean_macs'"):
        gate({"accuracy": 0.9, "mean_macs": float("nan")}, None, 0.0, 0.0)
    ok, reasons = gate({"accuracy": 0.9, "mean_macs": 10.0}, {"accuracy": 0.9}, 0.0, 0.0)
    assert not ok and "no mean_macs" in reasons[0]


def test_register_config() -> None:
    def params(**kw: object) -> dict:
        return {"register": {"model_name": "m", "acc_tolerance": 0, "macs_tolerance": 0.1, **kw}}

    assert RegisterConfig.from_params(params()) == RegisterConfig(model_name="m", acc_tolerance=0.0, macs_tolerance=0.1)
    with pytest.raises(ConfigError, match="register.macs_tolerance"):
        RegisterConfig.from_params(params(macs_tolerance=-1))
    with pytest.raises(ConfigError, match="register.model_name"):
        RegisterConfig.from_params(params(model_name="a/b"))
    with pytest.raises(ConfigError, match=r"register.acc_tolerance must be a number in \[0, 1\], got .x."):
        RegisterConfig.from_params(params(acc_tolerance="x"))



@pytest.mark.parametrize(("source", "name"), [
    ("fashion-mnist", "fashion-cascade"), ("fashion-mnist:/usr/share/fashion", "fashion-cascade"),
    ("digits", "digits-cascade"), ("imagefolder:/data/My Flowers/", "my-flowers-cascade"),
    ("idx:/srv/kmnist", "kmnist-cascade"), ("imagefolder:/", "imagefolder-cascade"),
])
def test_an_auto_model_name_follows_the_data(source: str, name: str) -> None:
    assert model_name_for(source) == name
    params = {"data": {"source": source},
              "register": {"model_name": "auto", "acc_tolerance": 0, "macs_tolerance": 0.1}}
    assert RegisterConfig.from_params(params).model_name == name
    params["register"]["model_name"] = "mine"  # a name given in params is kept as it is
    assert RegisterConfig.from_params(params).model_name == "mine"


# -------------------------------------------------------------------------------------------- lineage

LOCK = {"schema": "2.0", "stages": {
    "ingest": {"cmd": "x", "params": {"params.yaml": {"seed": 0, "data": {"source": "digits"}}},
               "outs": [{"path": "data/prepared", "hash": "md5", "md5": "aaa.dir"}]},
    "grade": {"cmd": "x", "params": {"params.yaml": {"grade": {"folds": 3}}},
              "outs": [{"path": "data/graded", "hash": "md5", "md5": "bbb.dir"},
                       {"path": "plots/grade", "hash": "md5", "md5": "ccc.dir"}]},
    "train@m1": {"cmd": "x", "params": {"params.yaml": {"train": {"lr": 0.1}}}, "outs": []},
}}


def test_lineage_tags(tmp_path: Path) -> None:
    lock = tmp_path / "dvc.lock"
    lock.write_text(yaml.safe_dump(LOCK))
    tags = lineage_tags(tmp_path, lock, {"accuracy": 0.91, "mean_macs": 1234.5})
    assert tags["dvc.out.data/prepared"] == "aaa.dir" and tags["dvc.out.data/graded"] == "bbb.dir"
    assert "dvc.out.plots/grade" not in tags
    assert {k for k in tags if k.startswith("dvc.params.")} == {
        "dvc.params.ingest", "dvc.params.grade", "dvc.params.train.m1"}
    assert tags["git_commit"] == "unknown"  # tmp_path is no git repository
    assert metrics_from_tags(tags) == {"accuracy": 0.91, "mean_macs": 1234.5}
    assert tags["lineage.lock_agrees"] == "n/a"
    assert "dvc.params.register is the previous" in tags["lineage.source"]
    LOCK["stages"]["grade"]["params"]["params.yaml"]["grade"]["folds"] = 4
    lock.write_text(yaml.safe_dump(LOCK))
    changed = lineage_tags(tmp_path, lock, {})
    LOCK["stages"]["grade"]["params"]["params.yaml"]["grade"]["folds"] = 3
    assert changed["dvc.params.grade"] != tags["dvc.params.grade"]
    assert changed["dvc.params.ingest"] == tags["dvc.params.ingest"]
    assert lineage_tags(tmp_path, tmp_path / "none.lock", {})["dvc.lock"] == "missing"


def test_lineage_of_the_run_itself(tmp_path: Path) -> None:
    """Own inputs are hashed now (DVC's md5), compared with what dvc.lock recorded, and the run's own
    params hash equals the lock's when the params did not change."""
    (tmp_path / "data" / "graded").mkdir(parents=True)
    (tmp_path / "data" / "graded" / "a.txt").write_text("x")
    lock = {"schema": "2.0", "stages": {
        "grade": {"cmd": "x", "outs": [{"path": "data/graded", "md5": dvc_md5(tmp_path / "data/graded")}]},
        "register": {"cmd": "x", "params": {"params.yaml": {"register": {"acc_tolerance": 0.002}}}}}}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    inputs = input_hashes({"data/graded": tmp_path / "data/graded"})
    params = {"params.yaml": {"register": {"acc_tolerance": 0.002}}}
    tags = lineage_tags(tmp_path, tmp_path / "dvc.lock", {}, inputs=inputs, params=params)
    assert tags["run.in.data/graded"] == tags["dvc.out.data/graded"] == inputs["data/graded"]
    assert tags["run.params.register"] == tags["dvc.params.register"]
    assert tags["lineage.lock_agrees"] == "yes"
    (tmp_path / "data" / "graded" / "a.txt").write_text("changed after dvc.lock was written")
    inputs = input_hashes({"data/graded": tmp_path / "data/graded"})
    tags = lineage_tags(tmp_path, tmp_path / "dvc.lock", {}, inputs=inputs,
                        params={"params.yaml": {"register": {"acc_tolerance": 0.01}}})
    assert tags["run.in.data/graded"] != tags["dvc.out.data/graded"]
    assert tags["lineage.lock_agrees"] == "no: data/graded"
    assert tags["run.params.register"] != tags["dvc.params.register"]
    with pytest.raises(FileNotFoundError, match="cannot hash"):
        input_hashes({"x": tmp_path / "missing"})


def test_dvc_md5_matches_dvc(tmp_path: Path) -> None:
    build = pytest.importorskip("dvc_data.hashfile.build").build
    from dvc.fs import LocalFileSystem
    from dvc_data.hashfile.db import HashFileDB

    (tmp_path / "m" / "sub").mkdir(parents=True)
    (tmp_path / "m" / "cascade.json").write_text('{"a": 1}\n')
    (tmp_path / "m" / "sub" / "w.pt").write_bytes(bytes(range(256)) * 50)
    (tmp_path / "m" / "b.txt").write_text("b")
    fs = LocalFileSystem()
    _, _, tree = build(HashFileDB(fs, str(tmp_path / "odb")), str(tmp_path / "m"), fs, "md5")
    assert dvc_md5(tmp_path / "m") == tree.hash_info.value
    _, _, obj = build(HashFileDB(fs, str(tmp_path / "odb")), str(tmp_path / "m" / "cascade.json"), fs, "md5")
    assert dvc_md5(tmp_path / "m" / "cascade.json") == obj.hash_info.value


def test_parse_model_uri() -> None:
    assert parse_model_uri("models:/a-b@champion") == ("a-b", "champion", None)
    assert parse_model_uri("models:/a/12") == ("a", None, "12")
    with pytest.raises(ValueError, match="models:/<name>@<alias>"):
        parse_model_uri("models:/a")


# -------------------------------------------------------------------------------------------- payload


@pytest.mark.parametrize("channels", [1, 3])
def test_decode_base64_files_like_the_cli(images: dict[str, Path], channels: int) -> None:
    names = ["grey_png", "rgb_png", "grey_jpg", "rgb_jpeg"]  # 16x16, 40x30, 20x20, 28x28
    frame = pd.DataFrame({"image": [png_b64(images[n]) for n in names]})
    got = decode_payload(frame, (channels, 16, 16))
    expected = np.stack([decode_image_file(images[n], channels, 16) for n in names])
    assert got.dtype == np.uint8 and got.shape == (4, channels, 16, 16)
    np.testing.assert_array_equal(got, expected)
    wrapped = "data:image/png;base64," + "\n".join(textwrap_76(png_b64(images["rgb_png"])))
    np.testing.assert_array_equal(decode_payload(pd.DataFrame({"image": [wrapped]}), (channels, 16, 16))[0],
                                  expected[1])


def textwrap_76(text: str) -> list[str]:
    return [text[i:i + 76] for i in range(0, len(text), 76)]


def test_decode_pixels() -> None:
    arrays = uint8_images(3, seed=4)  # (3, 1, 16, 16)
    frame = pd.DataFrame({"pixels": [arrays[0, 0].tolist(), arrays[1], arrays[2].tolist()]})
    np.testing.assert_array_equal(decode_payload(frame, (1, 16, 16)), arrays)
    rgb = np.repeat(arrays[:1], 3, axis=1)  # (1, 3, 16, 16)
    np.testing.assert_array_equal(decode_payload(pd.DataFrame({"pixels": [rgb[0]]}), (1, 16, 16)), arrays[:1])
    big = decode_payload(pd.DataFrame({"pixels": [np.full((32, 32), 7, dtype=np.uint8)]}), (3, 16, 16))
    assert big.shape == (1, 3, 16, 16) and (big == 7).all()
    mixed = pd.DataFrame({"image": [base64.b64encode(b"").decode(), None], "pixels": [None, arrays[1, 0]]})
    with pytest.raises(ValueError, match="row 0: image is empty"):
        decode_payload(mixed, (1, 16, 16))
    for empty in (pd.DataFrame({"image": []}), pd.DataFrame({"pixels": []}), pd.DataFrame()):
        with pytest.raises(ValueError, match="the request holds no rows"):
            decode_payload(empty, (1, 16, 16))


BAD_ROWS = {
    "not base64": ({"image": "@@not base64@@"}, "row 1: image is not valid base64"),
    "not an image": ({"image": base64.b64encode(b"hello world").decode()}, "row 1: image cannot be decoded"),
    "a number": ({"image": 12}, "row 1: image must be a base64 string"),
    "pixels out of range": ({"pixels": [[0, 256], [1, 2]]}, r"row 1: pixels must lie in 0\.\.255"),
    "float pixels": ({"pixels": [[0.5, 1.0], [1.0, 2.0]]}, "row 1: pixels must be integers"),
    "ragged pixels": ({"pixels": [[1, 2], [3]]}, "row 1: pixels must be integers"),
    "four channels": ({"pixels": np.zeros((4, 8, 8), dtype=np.uint8)}, "C 1 or 3"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_row_is_named(case: str) -> None:
    value, message = BAD_ROWS[case]
    (col, bad), = value.items()
    good = png_b64_array(uint8_images(1, seed=0)[0]) if col == "image" else np.zeros((16, 16), np.uint8)
    frame = pd.DataFrame({col: pd.Series([good, bad, good], dtype=object)})
    with pytest.raises(ValueError, match=message):
        decode_payload(frame, (1, 16, 16))


def png_b64_array(image: np.ndarray) -> str:
    return image_frame(image[None])["image"][0]


def test_payload_needs_a_known_column() -> None:
    with pytest.raises(ValueError, match="needs a column 'image'.*got columns \\['img'\\]"):
        decode_payload(pd.DataFrame({"img": ["x"]}), (1, 16, 16))
    both = pd.DataFrame({"image": [png_b64_array(np.zeros((1, 4, 4), np.uint8))], "pixels": [[[0]]]})
    with pytest.raises(ValueError, match="row 0: give exactly one of image or pixels, got 2"):
        decode_payload(both, (1, 16, 16))


def test_predict_frame_equals_engine(model_dir: Path) -> None:
    loaded = load_cascade(model_dir)
    arrays = uint8_images(40, seed=5)
    got = predict_frame(loaded, image_frame(arrays))
    assert got.to_dict("records") == recognize_arrays(loaded, arrays)
    with pytest.raises(ValueError, match="the request holds no rows"):
        predict_frame(loaded, pd.DataFrame({"image": []}))


# ------------------------------------------------------------------------------ register stage (SQLite)


def stage_repo(root: Path, model_dir: Path, accuracy: float, macs: float) -> Path:
    """A minimal repository for ``stages.register``: params, test split, evaluate metrics, dvc.lock."""
    (root / "data" / "prepared").mkdir(parents=True, exist_ok=True)
    arrays = uint8_images(4, seed=7)
    split = Split("test", arrays, np.arange(4), np.array(list("abcd")))
    save_split(root / "data" / "prepared" / "test.npz", split)
    write_json(root / "metrics" / "evaluate.json", {"cascade": {"accuracy": accuracy, "mean_macs": macs}})
    (root / "params.yaml").write_text(yaml.safe_dump({
        "tracking": {"experiment": "reg"},
        "register": {"model_name": "stage-cascade", "acc_tolerance": 0.002, "macs_tolerance": 0.05}}))
    (root / "dvc.lock").write_text(yaml.safe_dump(LOCK))
    return root


def run_stage(root: Path, model_dir: Path) -> int:
    from stages.register import main

    return main(["--root", str(root), "--params", str(root / "params.yaml"), "--model", str(model_dir),
                 "--metrics-in", str(root / "metrics/evaluate.json"), "--data", str(root / "data/prepared"),
                 "--out", str(root / "metrics/register.json")])


def test_register_stage_on_the_embedded_store(tmp_path: Path, model_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default: mlflow.db in the root
    root = stage_repo(tmp_path, model_dir, 0.9, 1000.0)
    assert run_stage(root, model_dir) == 0
    first = json.loads((root / "metrics/register.json").read_text())
    assert first["version"] == 1 and first["passed"] and first["champion"] == 1
    assert (root / "mlflow.db").is_file()
    champion = mlflow_models.get_version_by_alias("stage-cascade", CHAMPION, root=root)
    assert champion is not None and champion["version"] == "1"
    tags = champion["tags"]
    assert tags["dvc.out.data/prepared"] == "aaa.dir" and tags["gate"] == "passed"
    assert "git_commit" in tags and metrics_from_tags(tags) == {"accuracy": 0.9, "mean_macs": 1000.0}
    # lineage of this run itself: its inputs hashed when it ran, its params as dvc.lock would store them
    assert tags["run.in.metrics/evaluate.json"] == dvc_md5(root / "metrics/evaluate.json")
    assert tags["run.in.data/prepared/test.npz"] == dvc_md5(root / "data/prepared/test.npz")
    assert tags[f"run.in.{model_dir.as_posix()}"] == dvc_md5(model_dir)  # outside the root: as given
    assert tags["run.params.register"] and tags["lineage.lock_agrees"] == "n/a"
    assert "lineage.source" in tags

    write_json(root / "metrics" / "evaluate.json", {"cascade": {"accuracy": 0.95, "mean_macs": 1100.0}})
    assert run_stage(root, model_dir) == 0
    second = json.loads((root / "metrics/register.json").read_text())
    assert second["version"] == 2 and not second["passed"] and second["champion"] == 1
    assert second["previous_champion_metrics"] == {"accuracy": 0.9, "mean_macs": 1000.0}
    assert failing(second["reasons"]) == ["equal cost"]  # over the MACs cap, no cheaper setting
    assert mlflow_models.get_version_by_alias("stage-cascade", CHAMPION, root=root)["version"] == "1"
    assert mlflow_models.get_version_by_alias("stage-cascade", CHALLENGER, root=root)["version"] == "2"
    assert mlflow_models.get_version_by_alias("stage-cascade", "nope", root=root) is None
    assert mlflow_models.get_version_by_alias("no-such-model", CHAMPION, root=root) is None

    # the same trade with a cheaper setting in evaluate's metrics: compared at the champion's cost
    write_json(root / "metrics" / "evaluate.json", {"cascade": {"accuracy": 0.95, "mean_macs": 1100.0},
                                                    "each_exit": [{"accuracy": 0.89, "mean_macs": 800.0}]})
    assert run_stage(root, model_dir) == 0
    third = json.loads((root / "metrics/register.json").read_text())
    assert third["version"] == 3 and third["passed"] and third["champion"] == 3
    assert "equal cost: accuracy 0.9300 at the champion's 1,000 MACs >= 0.8980" in third["reasons"][2]
    champion = mlflow_models.get_version_by_alias("stage-cascade", CHAMPION, root=root)
    assert champion["version"] == "3"
    assert json.loads(champion["tags"][CURVE_TAG]) == [[800.0, 0.89], [1100.0, 0.95]]


def test_a_register_killed_before_the_gate_leaves_no_version(tmp_path: Path, model_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after the model is logged, before the gate: no version exists (none without tags, none a
    candidate); the rerun registers version 1, tagged and champion."""
    import pipeline.workflows.register as workflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = stage_repo(tmp_path, model_dir, 0.9, 1000.0)

    def killed(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt  # what SIGINT raises; SIGKILL stops at the same point with less grace

    with monkeypatch.context() as mp:
        mp.setattr(workflow, "promote", killed)  # the register stage's workflow calls it after logging the model
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            run_stage(root, model_dir)
    client = mlflow_models._client(root)
    assert client.search_model_versions("name = 'stage-cascade'") == []
    assert run_stage(root, model_dir) == 0
    versions = client.search_model_versions("name = 'stage-cascade'")
    assert [int(v.version) for v in versions] == [1] and versions[0].tags["gate"] == "passed"
    assert mlflow_models.get_version_by_alias("stage-cascade", CHAMPION, root=root)["version"] == "1"


def test_a_champion_of_another_class_set_is_never_replaced(tmp_path: Path, model_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A model trained on other classes, however good, is refused against the champion, naming both
    class sets; every version records its class set."""
    from pipeline.routing.package import MANIFEST, manifest_checksum

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = stage_repo(tmp_path, model_dir, 0.9, 1000.0)
    assert run_stage(root, model_dir) == 0
    other = Path(shutil.copytree(model_dir, tmp_path / "other-classes"))
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["meta"]["classes"] = ["w", "x", "y", "z"]
    manifest["checksum"] = manifest_checksum(manifest)
    (other / MANIFEST).write_text(json.dumps(manifest))
    write_json(root / "metrics" / "evaluate.json", {"cascade": {"accuracy": 0.99, "mean_macs": 500.0}})
    assert run_stage(root, other) == 0
    second = json.loads((root / "metrics/register.json").read_text())
    assert (second["version"], second["passed"], second["champion"]) == (2, False, 1)
    assert second["reasons"] == [class_set_mismatch({CLASSES_TAG: '["ant", "bee", "cat", "dog"]'},
                                                    ["w", "x", "y", "z"], 1)]
    assert 'champion v1 was trained on ["ant", "bee", "cat", "dog"], this version on ["w", "x", "y", "z"]' \
        in second["reasons"][0]
    assert mlflow_models.get_version_by_alias("stage-cascade", CHAMPION, root=root)["version"] == "1"
    assert mlflow_models.get_version_by_alias("stage-cascade", CHALLENGER, root=root)["tags"][CLASSES_TAG] == \
        '["w", "x", "y", "z"]'
    assert class_set_mismatch({}, ["a"], 1) is None  # a champion registered before the record: compared


def test_a_dominated_cascade_is_never_made_champion(tmp_path: Path, model_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Even as the first version (which the gate always passes): evaluate read another model of its run
    cheaper and more than one SE better on test, so it is registered as challenger only, saying why."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = stage_repo(tmp_path, model_dir, 0.9, 1000.0)
    shipped = {"dominated": True, "dominated_by": ["plain_small"], "verdict": "DOMINATED: plain_small reads +5"}
    write_json(root / "metrics" / "evaluate.json", {"cascade": {"accuracy": 0.9, "mean_macs": 1000.0},
                                                    "shipped": shipped})
    assert run_stage(root, model_dir) == 0
    first = json.loads((root / "metrics/register.json").read_text())
    assert (first["version"], first["passed"], first["champion"]) == (1, False, None)
    assert first["reasons"][0] == "dominated on test by plain_small: DOMINATED: plain_small reads +5"
    assert mlflow_models.get_version_by_alias("stage-cascade", CHAMPION, root=root) is None
    assert mlflow_models.get_version_by_alias("stage-cascade", CHALLENGER, root=root)["version"] == "1"
    write_json(root / "metrics" / "evaluate.json", {"cascade": {"accuracy": 0.9, "mean_macs": 1000.0},
                                                    "shipped": {**shipped, "dominated": False}})
    assert run_stage(root, model_dir) == 0
    assert json.loads((root / "metrics/register.json").read_text())["passed"]


def test_register_stage_errors(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = stage_repo(tmp_path, model_dir, 0.9, 1000.0)
    write_json(root / "metrics" / "evaluate.json", {"cascade": {"accuracy": 0.9}})
    assert run_stage(root, model_dir) == 5  # a failed check (pipeline.exit_codes)
    assert "has no cascade mean_macs" in capsys.readouterr().err
    assert not (root / "mlflow.db").exists()


# ------------------------------------------------------------------------------- tracking server (HTTP)


@contextlib.contextmanager
def server(cmd: list[str], env: dict[str, str], url: str, log: Path, timeout: float = 90.0) -> Iterator[int]:
    """Start ``cmd`` in its own process group, wait until ``url`` answers, and stop the group after."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{cmd[:3]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not answer within {timeout:.0f} s:\n"
                                     f"{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield proc.pid  # = the process group's id
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[dict[str, object]]:
    """An ``mlflow server`` (SQLite backend, proxied artifacts in a temporary directory) holding the
    tiny cascade as v1 (champion) and a worse v2 (challenger only)."""
    tmp = tmp_path_factory.mktemp("server")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    cmd = [str(VENV_BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{tmp / 'backend.db'}",
           "--artifacts-destination", str(tmp / "artifacts"), "--default-artifact-root", "mlflow-artifacts:/"]
    running = server(cmd, subprocess_env(uri), f"{uri}/health", tmp / "server.log")
    with running, pytest.MonkeyPatch.context() as mp:
        for key, value in subprocess_env(uri).items():
            if key != "PATH":
                mp.setenv(key, value)
        example = image_frame(uint8_images(1, seed=3))
        decisions = []
        for accuracy in (0.9, 0.85):
            with tracking.stage_run("register", experiment="server", root=tmp):
                decisions.append(register_cascade(model_dir, CFG, {"accuracy": accuracy, "mean_macs": 1000.0},
                                                  {"git_commit": "test"}, example, root=tmp))
        yield {"uri": uri, "tmp": tmp, "decisions": decisions}


def test_server_registration_and_gate(tracking_server: dict) -> None:
    first, second = tracking_server["decisions"]
    assert (first.version, first.passed, first.champion) == (1, True, 1)
    assert (second.version, second.passed, second.champion) == (2, False, 1)
    assert any(r.startswith("accuracy 0.8500 < 0.8980") for r in second.reasons)
    assert mlflow_models.get_version_by_alias(CFG.model_name, CHAMPION)["version"] == "1"
    challenger = mlflow_models.get_version_by_alias(CFG.model_name, CHALLENGER)
    assert challenger["version"] == "2" and challenger["tags"]["gate"] == "failed"
    assert list((tracking_server["tmp"] / "artifacts").iterdir())  # artifacts went through the server


def test_champion_loads_back_and_answers_like_the_engine(tracking_server: dict, model_dir: Path) -> None:
    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model(f"models:/{CFG.model_name}@{CHAMPION}")
    arrays = uint8_images(60, seed=11)
    got = model.predict(image_frame(arrays))
    assert got.to_dict("records") == recognize_arrays(load_cascade(model_dir), arrays)
    pixels = model.predict(pd.DataFrame({"pixels": [a[0].tolist() for a in arrays[:5]]}))
    assert pixels.to_dict("records") == got.to_dict("records")[:5]


def test_cli_recognizes_with_a_registry_uri(tracking_server: dict, model_dir: Path, images: dict[str, Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    files = [images[n] for n in ("grey_png", "rgb_png", "grey_jpg")]
    uri = f"models:/{CFG.model_name}@{CHAMPION}"
    assert main(["recognize", "--model", uri, "--json", *map(str, files)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == recognize_files(load_cascade(model_dir), files)[0]
    assert main(["info", "--model", f"models:/{CFG.model_name}/7"]) == 2
    assert "cannot fetch model" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ REST serving


def post(url: str, body: object) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture(scope="module")
def serving(tracking_server: dict) -> Iterator[str]:
    port = free_port()
    cmd = [str(VENV_BIN / "mlflow"), "models", "serve", "-m", f"models:/{CFG.model_name}@{CHAMPION}",
           "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    url = f"http://127.0.0.1:{port}"
    with server(cmd, subprocess_env(str(tracking_server["uri"])), f"{url}/ping",
                Path(tracking_server["tmp"]) / "serve.log") as pgid:
        SERVER_GROUP[url] = pgid
        yield url


def test_serving_answers_like_the_engine(serving: str, model_dir: Path, images: dict[str, Path]) -> None:
    files = [images[n] for n in ("grey_png", "rgb_png", "grey_jpg", "rgb_jpeg")]
    body = {"dataframe_split": {"columns": ["image"], "data": [[png_b64(f)] for f in files]}}
    status, answer = post(f"{serving}/invocations", body)
    assert status == 200, answer
    expected = recognize_files(load_cascade(model_dir), files)[0]
    got = answer["predictions"]
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert {k: row[k] for k in ("class_index", "class_name", "exit", "subnets", "macs")} == \
            {k: want[k] for k in ("class_index", "class_name", "exit", "subnets", "macs")}
        assert row["confidence"] == pytest.approx(want["confidence"], abs=1e-6)  # the server's own threads


SERVER_GROUP: dict[str, int] = {}  # serving URL -> the server's process group (its RSS)


def test_serving_under_a_bounded_mixed_load(serving: str, images: dict[str, Path]) -> None:
    """8 clients, 500 requests, 10% bad (malformed base64, corrupt PNG, a 20000 x 20000 header, a row
    without an image, an empty frame): no good request fails, every bad one is a 4xx naming its row,
    no 5xx, and the server stays under 2 GB resident (bench/serving.py's mixed phase)."""
    from bench.mlflow_serving import bad_bodies, mixed

    good = [png_b64(images[n]) for n in ("grey_png", "rgb_png", "grey_jpg")]
    bodies = [json.dumps({"dataframe_split": {"columns": ["image"], "data": [[g] for g in good]}}).encode()]
    port = int(serving.rsplit(":", 1)[1])
    result = mixed(port, SERVER_GROUP[serving], bodies, 3, bad_bodies(good[0]), 500, 0.1, 8)
    assert result["requests"] == 500 and result["bad"] == 50
    assert result["good_failed"] == 0, result
    assert result["bad_not_4xx_naming_the_row"] == 0, result
    assert result["server_errors_5xx"] == 0, result
    assert all(v["sent"] > 0 for v in result["per_kind"].values()), result
    assert 0 < result["server_rss_peak_mb"] < 2048, result


def test_serving_rejects_a_malformed_payload(serving: str, images: dict[str, Path]) -> None:
    rows = [[png_b64(images["grey_png"])], ["%%garbage%%"]]
    body = {"dataframe_split": {"columns": ["image"], "data": rows}}
    status, answer = post(f"{serving}/invocations", body)
    assert status == 400
    assert "row 1: image is not valid base64" in answer["message"]
    empty = {"dataframe_split": {"columns": ["image"], "data": []}}
    status, answer = post(f"{serving}/invocations", empty)
    assert status == 400 and "the request holds no rows" in answer["message"], (status, answer)
    number = {"dataframe_split": {"columns": ["image"], "data": [[3]]}}
    status, answer = post(f"{serving}/invocations", number)
    assert 400 <= status < 500 and answer.get("message")
