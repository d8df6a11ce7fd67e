"""What the train stage writes and logs for a trained module (pipeline.train.outputs); that the written
files are byte-identical between identical runs is tests/test_determinism.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.io import Split
from pipeline.models.cascade import build_modules
from pipeline.models.profile import CostModel
from pipeline.models.store import ModuleInfo
from pipeline.train.loop import TrainResult
from pipeline.train.outputs import done_line, epoch_line, iteration_log, train_metrics
from pipeline.train.paths import evaluate_path
from pipeline.train.prefix import Prefix
from tests.train.test_loop import MEAN, SPEC, STD, cfg, pattern_data


def test_iteration_log_thins_to_about_400_and_drops_non_finite_values() -> None:
    its = [{"iteration": i, "entropy": 1.0 / (i + 1), "mi": math.nan if i == 0 else 0.5, "loss": 3.0}
           for i in range(1000)]
    log = iteration_log(its)
    assert [step for step, _ in log] == list(range(0, 1000, 2))  # every 1000 // 400 = 2nd
    assert log[0] == (0, {"iter_entropy": 1.0})  # NaN MI left out, "loss" is not an iteration figure
    assert log[1] == (2, {"iter_entropy": 1.0 / 3, "iter_mi": 0.5})
    assert iteration_log([]) == []
    assert [s for s, _ in iteration_log(its[:10])] == list(range(10))


def test_printed_lines() -> None:
    record = {"loss": 1.23456, "train_acc": 0.5, "images_per_s": 1234.56}
    assert epoch_line("m2", 5, 3, record) == "train@m2 epoch 3/5: loss 1.2346 acc 0.5000 1235 img/s"
    metrics = {"calib_exit_acc": 0.75, "calib_path": "", "path_macs": 1234567, "images_per_s": 99.5}
    assert done_line("m1", metrics) == ("train@m1: calib exit accuracy 0.7500 on path (fixed) "
                                        "(1,234,567 MACs), 99.5 img/s")
    assert "on path op@l1=dw3 (" in done_line("m1", {**metrics, "calib_path": "op@l1=dw3"})


def test_train_metrics_of_a_fixed_module() -> None:
    module = build_modules(SPEC, seed=0)[0]
    prefix = Prefix((), MEAN, STD)
    images, labels = pattern_data(20)
    calib = Split("calib", images, labels, np.array([str(i) for i in range(20)]))
    costs = CostModel({"modules": [{"op_macs": {}, "fixed_macs": 5000}]})
    info = ModuleInfo(1, SPEC.modules[0], 1, 4, (1, 12, 12), MEAN, STD)
    result = TrainResult(history=[{"train_acc": 0.25}, {"train_acc": 0.5}], iterations=[], prob_model=None)
    config = cfg(epochs=3, sampler="uniform")
    metrics = train_metrics(module, prefix, calib, info, config, result, costs, train_images=64, seconds=2.0,
                            epochs_ran=2, processes=1, device="cpu")
    exit_eval = evaluate_path(module, prefix, images, labels, module.default_arch(), 512)
    assert metrics == {
        "module": 1, "kind": "fixed", "train_images": 64, "epochs": 3, "seconds": 2.0, "images_per_s": 64.0,
        "resumed_after_epoch": 1, "calib_exit_acc": exit_eval["acc"],
        "calib_exit_conf_mean": pytest.approx(exit_eval["conf_mean"]), "calib_path": "", "path_macs": 5000,
        "path_latency_ms_b1": None, "path_latency_ms_b64": None, "final_train_acc": 0.5, "sampler": "uniform",
        "processes": 1, "device": "cpu", "kd": 0.0,
    }
    assert list(metrics) == [  # the metrics file's order
        "module", "kind", "train_images", "epochs", "seconds", "images_per_s", "resumed_after_epoch",
        "calib_exit_acc", "calib_exit_conf_mean", "calib_path", "path_macs", "path_latency_ms_b1",
        "path_latency_ms_b64", "final_train_acc", "sampler", "processes", "device", "kd"]
