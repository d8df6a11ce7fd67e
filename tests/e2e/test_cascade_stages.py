"""The cascade part of the tiny-profile `dvc repro`: profile, train/search/select per module,
calibrate, evaluate; the CLI on the resulting model directory."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.e2e.conftest import changed_stages, run
from tests.e2e.test_data_stages import dag_edges

pytestmark = pytest.mark.e2e


def test_module_chain_in_the_dag(tiny_repo):
    edges = dag_edges(tiny_repo)
    for k in (1, 2, 3):
        assert (f"train@m{k}", f"search@m{k}") in edges
        assert (f"search@m{k}", f"select@m{k}") in edges
    assert ("select@m1", "train@m2") in edges and ("select@m2", "train@m3") in edges
    assert ("grade", "train@m1") in edges and ("profile", "train@m1") in edges
    assert ("calibrate", "evaluate") in edges


def test_outputs_and_metrics(tiny_repo):
    for k in (1, 2, 3):
        train = json.loads((tiny_repo / f"metrics/train_m{k}.json").read_text())
        assert 0.0 <= train["calib_exit_acc"] <= 1.0 and train["path_macs"] > 0
        # checkpoints live in .cache/train while a stage runs (resume after a kill), gone on success
        assert not (tiny_repo / f"models/m{k}/train/checkpoints").exists()
        assert not list((tiny_repo / ".cache/train").glob(f"m{k}-*"))
        assert (tiny_repo / f"models/m{k}/select/selection.json").exists()
    search = json.loads((tiny_repo / "models/m2/search/search.json").read_text())
    assert 1 <= len(search["pareto"]) <= 3 and search["target"] in search["candidates"]
    assert (tiny_repo / "plots/search_m2/acc_vs_macs.png").exists()
    assert (tiny_repo / "plots/search_m2/entropy_mi.png").exists()
    evaluate = json.loads((tiny_repo / "metrics/evaluate.json").read_text())
    for key in ("cascade", "cascade_testset", "largest_static", "smallest_static", "oracle", "each_exit", "timing"):
        assert key in evaluate
    cascade = evaluate["cascade"]
    assert abs(sum(cascade["exit_share"]) - 1.0) < 1e-6
    assert evaluate["oracle"]["mean_macs"] <= evaluate["space_largest_static"]["mean_macs"]
    for name in ("budget_curve.png", "anytime.png", "confusion.png", "budget_curve.csv"):
        assert (tiny_repo / "plots/evaluate" / name).exists()


def test_changing_the_last_module_reruns_only_it_and_what_follows(tiny_repo):
    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    params["modules"]["m3"]["train"] = {"epochs": 1}
    (tiny_repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    changed = changed_stages(run(["dvc", "status"], tiny_repo).stdout)
    assert "train@m3" in changed
    assert not changed & {"ingest", "validate", "grade", "profile", "train@m1", "train@m2", "search@m2",
                          "select@m2"}, changed
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
