"""What ships when a plain CNN beats the cascade on held-out images (docs/DESIGN.md "Your own data"):
calibrate writes it into
models/cascade as a one-module model, evaluate still reads the cascade (rebuilt from the modules and
calibrate's fit) and judges the plain CNN's dominance, register registers it, the CLI answers with it.

The tiny run's own choice is whatever its held-out images say; to run the plain branch, a copy of the
run calibrates with the choice forced to plain_small (the rule itself: tests/evaluation/test_dominance.py).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.evaluation.dominance import SHIPPABLE, held_out_choice
from tests.e2e.conftest import run
from tests.tools.tiny_repo import run_in

pytestmark = pytest.mark.e2e

FORCE = ("import sys, pipeline.evaluation.dominance as d, pipeline.workflows.calibrate as w\n"
         "import stages.calibrate as c\n"
         "real = d.held_out_choice\n"
         "w.held_out_choice = lambda a, b, n: {**real(a, b, n), 'model': 'plain_small', 'reason': 'forced'}\n"
         "raise SystemExit(c.main(sys.argv[1:]))\n")


def _cmd(repo: Path, stage: str) -> list[str]:
    return shlex.split(yaml.safe_load((repo / "dvc.yaml").read_text())["stages"][stage]["cmd"])


def _json(repo: Path, path: str) -> dict:
    return json.loads((repo / path).read_text())


def test_calibrate_records_what_ships_by_the_held_out_rule(tiny_repo):
    calibrate = _json(tiny_repo, "metrics/calibrate.json")
    shipped = calibrate["shipped"]
    assert shipped["model"] in SHIPPABLE and shipped["held_out_images"] > 0
    plains = {r["model"]: r for r in shipped["plains"]}
    assert held_out_choice(calibrate["selected"], plains, shipped["held_out_images"])["model"] == shipped["model"]
    kinds = [m["spec"]["kind"] for m in _json(tiny_repo, "models/cascade/cascade.json")["modules"]]
    assert (kinds == ["plain"]) == (shipped["model"] != "cascade")
    assert _json(tiny_repo, "metrics/evaluate.json")["shipped"]["model"] == shipped["model"]


@pytest.fixture(scope="module")
def plain_run(tiny_repo, tmp_path_factory) -> Path:
    """A copy of the tiny run (its own SQLite registry) calibrated with plain_small forced to ship, then
    evaluated and registered by dvc.yaml's own commands."""
    repo = tmp_path_factory.mktemp("plain") / "repo"
    shutil.copytree(tiny_repo, repo, symlinks=True, ignore=shutil.ignore_patterns("mlflow.db", "mlruns"))
    run_in(repo, [sys.executable, "-c", FORCE, *_cmd(repo, "calibrate")[3:]])
    for stage in ("evaluate", "register"):
        run_in(repo, _cmd(repo, stage))
    return repo


def test_a_shipped_plain_cnn_is_evaluated_registered_and_served(tiny_repo, plain_run, tmp_path):
    manifest = _json(plain_run, "models/cascade/cascade.json")
    assert [m["spec"]["kind"] for m in manifest["modules"]] == ["plain"]
    assert manifest["meta"]["info"]["routing"] == "plain_small"
    evaluated, before = _json(plain_run, "metrics/evaluate.json"), _json(tiny_repo, "metrics/evaluate.json")
    # the cascade's figures are the cascade's, rebuilt from the modules and calibrate's fit
    assert evaluated["cascade"]["accuracy"] == before["cascade"]["accuracy"]
    assert evaluated["cascade"]["mean_macs"] == pytest.approx(before["cascade"]["mean_macs"])
    shipped = evaluated["shipped"]
    assert shipped["model"] == "plain_small"
    assert shipped["accuracy"] == evaluated["baselines"]["plain_small"]["accuracy"]
    assert "cascade" in [r["model"] for r in shipped["others"]]
    registered = _json(plain_run, "metrics/register.json")
    assert registered["candidate"] == {"accuracy": shipped["accuracy"], "mean_macs": shipped["mean_macs"]}
    from PIL import Image

    image = tmp_path / "x.png"
    Image.fromarray((np.random.default_rng(0).random((20, 20)) * 255).astype(np.uint8)).save(image)
    rows = json.loads(run(["cascade", "recognize", "--model", "models/cascade", "--json", str(image)],
                          plain_run).stdout)
    assert len(rows) == 1 and rows[0]["exit"] == 1
    assert "plain" in run(["cascade", "info", "--model", "models/cascade"], plain_run).stdout
