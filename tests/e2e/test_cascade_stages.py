"""The cascade part of the tiny-profile `dvc repro`: profile, train/search/select per module,
calibrate, evaluate; the CLI on the resulting model directory."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.e2e.conftest import MODULES, REPRO, ROOT, changed_stages, run
from tests.e2e.test_data_stages import dag_edges

pytestmark = pytest.mark.e2e


def test_module_chain_in_the_dag(tiny_repo):
    edges = dag_edges(tiny_repo)
    for key in MODULES:
        assert (f"train@{key}", f"search@{key}") in edges
        assert (f"search@{key}", f"select@{key}") in edges
        assert (f"select@{key}", "calibrate") in edges
    for prev, key in zip(MODULES, MODULES[1:], strict=False):
        assert (f"select@{prev}", f"train@{key}") in edges
    assert ("grade", "train@m1") in edges and ("profile", "train@m1") in edges
    assert ("calibrate", "evaluate") in edges


def test_outputs_and_metrics(tiny_repo):
    for k in range(1, len(MODULES) + 1):
        train = json.loads((tiny_repo / f"metrics/train_m{k}.json").read_text())
        assert 0.0 <= train["calib_exit_acc"] <= 1.0 and train["path_macs"] > 0
        # checkpoints live in .cache/train while a stage runs (resume after a kill), gone on success
        assert not (tiny_repo / "models/modules" / f"m{k}/train/checkpoints").exists()
        assert not list((tiny_repo / ".cache/train").glob(f"m{k}-*"))
        assert (tiny_repo / f"models/modules/m{k}/select/selection.json").exists()
    search = json.loads((tiny_repo / "models/modules/m2/search/search.json").read_text())
    assert 1 <= len(search["pareto"]) <= 3 and search["target"] in search["candidates"]
    assert (tiny_repo / "plots/search/m2/acc_vs_macs.png").exists()
    assert (tiny_repo / "plots/search/m2/entropy_mi.png").exists()
    evaluate = json.loads((tiny_repo / "metrics/evaluate.json").read_text())
    for key in ("cascade", "static_selection", "largest_candidate_static", "smallest_candidate_static", "oracle",
                "each_exit", "timing", "routing", "budget_curves"):
        assert key in evaluate
    # the routing table covers every module with several recorded candidates; its shares are the cascade's
    for row in evaluate["routing"]:
        reached = evaluate["cascade"]["module_calls"][row["module"] - 1]
        assert row["images_reaching"] == reached
        assert sum(c["routed_share"] for c in row["candidates"]) == pytest.approx(1.0 if reached else 0.0)
    cascade = evaluate["cascade"]
    # each share is rounded to 4 decimals, so their sum is 1 up to half a unit of the last digit each
    assert abs(sum(cascade["exit_share"]) - 1.0) <= 0.5e-4 * len(cascade["exit_share"]) + 1e-9
    assert evaluate["oracle"]["mean_macs"] <= evaluate["space_largest_static"]["mean_macs"]
    # every routing candidate a select stage recorded is scored on test, its predictor used or not
    selections = [json.loads((tiny_repo / f"models/modules/m{k}/select/selection.json").read_text())
                  for k in range(1, len(MODULES) + 1)]
    recorded = [(k, key) for k, sel in enumerate(selections, start=1) if len(sel["candidates"]) > 1
                for key in sel["candidates"]]
    assert [(r["module"], r["path"]) for r in evaluate["candidate_exits"]] == recorded
    for name in ("budget_curve.png", "anytime.png", "confusion.png", "budget_curve.csv"):
        assert (tiny_repo / "plots/evaluate" / name).exists()


def test_routing_verdict_in_every_run(tiny_repo):
    """Per supernet, metrics/evaluate.json's routing row and the evaluate stage's last lines say whether
    its predictor serves and why (the select stage's held-out decision), how predictable the right
    candidate is on route/calib, the oracle's headroom, the routed cascade against its static twin,
    and a sentence of verdict."""
    from pipeline.evaluation.routing_verdict import verdict_lines

    evaluate = json.loads((tiny_repo / "metrics/evaluate.json").read_text())
    ingest = json.loads((tiny_repo / "metrics/ingest.json").read_text())
    cascade, static = evaluate["cascade"], evaluate["static_selection"]
    selections = {k: json.loads((tiny_repo / f"models/modules/m{k}/select/selection.json").read_text())
                  for k in range(1, len(MODULES) + 1)}
    supernets = [k for k, sel in selections.items() if len(sel["candidates"]) > 1]
    assert [row["module"] for row in evaluate["routing"]] == supernets
    if not supernets:
        # Each supernet's search found its cheapest path also the most accurate (on an AVX-512 host the tiny
        # digits run ends with skip|skip best in both): one candidate, nothing to route, so no routing row and
        # no verdict line, and every select chose statically.
        assert all(sel["mode"] != "predictor" for sel in selections.values())
        assert verdict_lines(evaluate) == []
        return
    for row in evaluate["routing"]:
        k, sel = row["module"], selections[row["module"]]
        assert row["served"] is row["predictor_used"] and row["served"] is (sel["mode"] == "predictor")
        if sel["predictor"] is not None:  # select trained one: its held-out decision is the why
            assert sel["decision"]["served"] is row["served"] and sel["decision"]["reason"] in row["why"]
        pred = row["predictability"]
        assert pred["auc"] is None and pred["note"] or 0.0 <= pred["auc"] <= 1.0, pred
        assert 0 <= pred.get("fit_images", 0) <= ingest["route_count"]  # fitted on route, read on calib
        assert 0 <= pred.get("held_out_images", 0) <= ingest["calib_count"]
        room = row["headroom"]
        assert room["oracle_exit_accuracy"] == pytest.approx(row["oracle"]["accuracy"])
        assert room["oracle_module_macs"] == pytest.approx(row["oracle"]["mean_module_macs"])
        assert room["served_exit_accuracy"] <= room["oracle_exit_accuracy"]
        assert room["images_reaching"] == row["images_reaching"] and room["cascade_points_at_most"] >= 0
        if not row["served"]:  # the static choice serves: its exit accuracy is its candidate row's
            exit_acc = {c["path"]: c["exit_accuracy"] for c in row["candidates"]}[sel["static"]]
            assert room["served_exit_accuracy"] == pytest.approx(exit_acc)
        twin = row["vs_static_twin"]
        assert twin["accuracy_points"] == pytest.approx(100 * (cascade["accuracy"] - static["accuracy"]))
        assert twin["macs_ratio"] == pytest.approx(cascade["mean_macs"] / static["mean_macs"])
        assert row["verdict"].startswith(f"Module {k} routes per image: " if row["served"] else
                                         f"Module {k} does not route: ")
    # the evaluate stage's last lines, as `dvc repro` printed them
    printed = REPRO[tiny_repo].split("Running stage 'evaluate'")[1].split("Running stage")[0]
    lines = [line.rstrip() for line in printed.splitlines()]
    verdict = verdict_lines(evaluate)
    assert len(verdict) == 2 * len(supernets)
    at = lines.index(verdict[0])
    assert lines[at - 1].startswith("evaluate: the shipped cascade is ") and lines[at:at + len(verdict)] == verdict


def test_calibrate_keeps_the_exit_ensemble_best_on_calib(tiny_repo):
    calibrate = json.loads((tiny_repo / "metrics/calibrate.json").read_text())["selected"]
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    tried = calibrate["ensemble_tried"]
    assert sorted(float(d) for d in tried) == sorted(params["calibrate"]["ensemble_decays"])
    # calibrate's rule (pipeline.routing.calibration.choose_ensemble_decay), not one host's outcome: the
    # most accurate eligible decay ties itself, and the kept one is the cheapest of the ties
    eligible = [r for r in tried.values() if r["eligible"]]
    best = max(r["accuracy"] for r in eligible)
    assert all(r["ties_best"] for r in eligible if r["accuracy"] == best)
    kept = tried[f"{calibrate['ensemble_decay']:g}"]
    assert kept["ties_best"] and kept["accuracy"] == calibrate["accuracy"]
    assert kept["mean_macs"] == min(r["mean_macs"] for r in eligible if r["ties_best"])
    assert not any(r["ties_best"] for r in tried.values() if not r["eligible"])
    manifest = json.loads((tiny_repo / "models/cascade/cascade.json").read_text())
    assert manifest["meta"]["ensemble_decay"] == calibrate["ensemble_decay"]
    evaluate = json.loads((tiny_repo / "metrics/evaluate.json").read_text())
    assert evaluate["cascade"]["ensemble_decay"] == calibrate["ensemble_decay"]
    assert len(evaluate["each_exit_alone"]) == len(MODULES)


def test_fixed_cascade_is_also_held_to_the_cascades_macs(tiny_repo):
    """calibrate fits the fixed cascade once more in budget mode at the selected cascade's calib MACs;
    evaluate runs that model and reads the equal-MACs target off it."""
    calibrate = json.loads((tiny_repo / "metrics/calibrate.json").read_text())
    matched, selected, own = calibrate["default_at_cascade_macs"], calibrate["selected"], calibrate["default"]
    assert matched["mean_macs"] <= selected["mean_macs"] + 1e-6
    if own["mean_macs"] <= selected["mean_macs"]:  # its own operating point fits the budget: never worse
        assert matched["accuracy"] >= own["accuracy"]
    manifest = json.loads((tiny_repo / "models/cascade_fixed_at_macs/cascade.json").read_text())
    assert manifest["meta"]["ensemble_decay"] == matched["ensemble_decay"]
    evaluate = json.loads((tiny_repo / "metrics/evaluate.json").read_text())
    row = evaluate["baselines"]["fixed_cascade_at_cascade_macs"]
    assert row["thresholds"] == pytest.approx(matched["thresholds"])
    check = evaluate["targets"]["vs_fixed_cascade_0.3pt_at_equal_macs_or_0.8x_macs_at_equal_accuracy"]
    assert check["measured_at_equal_macs"][0] == pytest.approx(evaluate["cascade"]["accuracy"] - row["accuracy"])
    # every budget curve point has its thresholds fitted on calib (best calib accuracy within the budget)
    for name, rows in evaluate["budget_curves"].items():
        assert all(r["calib_mean_macs"] <= r["budget_macs"] * (1 + 1e-9) for r in rows), name
        calib_accs = [r["calib_accuracy"] for r in rows]
        assert calib_accs == sorted(calib_accs), name  # a larger budget never fits worse on calib


def test_four_module_cascade_by_params_only(tiny_repo):
    """The shared repo is the tiny profile plus an m4 in params (conftest.add_fourth_module): every
    stage ran for it with dvc.yaml untouched, and the cascade has four exits."""
    assert (tiny_repo / "dvc.yaml").read_text() == (ROOT / "dvc.yaml").read_text()
    for k in range(1, 5):
        assert (tiny_repo / f"models/modules/m{k}/select/selection.json").exists()
        assert json.loads((tiny_repo / f"metrics/train_m{k}.json").read_text())["module"] == k
    calibrate = json.loads((tiny_repo / "metrics/calibrate.json").read_text())
    assert len(calibrate["selected"]["exit_accuracy"]) == 4
    evaluate = json.loads((tiny_repo / "metrics/evaluate.json").read_text())
    assert len(evaluate["cascade"]["exit_share"]) == 4
    headline = json.loads((tiny_repo / "metrics/headline.json").read_text())
    assert 0.0 <= headline["acc"] <= 1.0 and headline["mmacs"] > 0


def test_changing_the_last_module_reruns_only_it_and_what_follows(tiny_repo):
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    params["modules"]["m4"]["train"] = {"epochs": 1}
    (tiny_repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    changed = changed_stages(run(["dvc", "status"], tiny_repo).stdout)
    assert "train@m4" in changed
    # profile lists the whole `modules` section (every module's spec, however many): it re-measures,
    # but its models/profile.json is unchanged, so train@m1..m3 do not re-run in a repro
    assert not changed & {"ingest", "validate", "grade", "train@m1", "train@m2", "train@m3", "search@m3",
                          "select@m3"}, changed
    run(["git", "checkout", "params.yaml"], tiny_repo)


def test_cli_recognizes_the_trained_cascade(tiny_repo, tmp_path):
    import numpy as np
    from PIL import Image

    good = tmp_path / "digit.png"
    Image.fromarray((np.random.default_rng(0).random((20, 20)) * 255).astype(np.uint8)).save(good)
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not a jpeg at all")
    result = run(["cascade", "recognize", "--model", "models/cascade", "--json", str(good), str(bad)], tiny_repo,
                 check=False)
    assert result.returncode == 1 and "broken.jpg" in result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == 1 and rows[0]["class_name"] in [str(i) for i in range(10)]
    info = run(["cascade", "info", "--model", "models/cascade"], tiny_repo).stdout
    assert "threshold" in info.lower()


def test_onnx_export_answers_as_torch_on_the_whole_test_split(tiny_repo, tmp_path):
    """`cascade export --format onnx` of the pipeline's own model, run by the ONNX Runtime engine with
    its early exits, gives every test image the torch engine's class and exit."""
    import numpy as np

    from pipeline.routing.package import load_cascade
    from pipeline.routing.recognize import recognize_arrays
    from pipeline.serving.onnx_engine import OnnxCascade

    run(["cascade", "export", "--model", "models/cascade", "--out", str(tmp_path / "onnx")], tiny_repo)
    with np.load(tiny_repo / "data" / "prepared" / "test.npz") as z:
        images = z["images"]
    torch_rows = recognize_arrays(load_cascade(tiny_repo / "models" / "cascade"), images)
    onnx_rows = OnnxCascade(tmp_path / "onnx").recognize(images)
    assert len(images) >= 100
    assert [(r["class_index"], r["exit"], r["macs"]) for r in onnx_rows] == \
           [(r["class_index"], r["exit"], r["macs"]) for r in torch_rows]
    assert len({r["exit"] for r in torch_rows}) >= 2  # images really leave at different exits
