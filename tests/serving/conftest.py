"""The routed three-module test cascade of tests/routing, saved once per session, for the serving tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pipeline.routing.packaging import save_cascade
from tests.routing.test_package import META, tiny_stages


def _saved(directory: Path, **meta: object) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return save_cascade(directory, tiny_stages(0), dataclasses.replace(META, **meta))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _saved(tmp_path_factory.mktemp("serving") / "model")


@pytest.fixture(scope="session")
def tiny_ensemble_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same cascade answering with the exit ensemble (decay 0.5)."""
    return _saved(tmp_path_factory.mktemp("serving") / "ensemble", ensemble_decay=0.5)


def held_out_arrays(stages: list, images: object) -> tuple:
    """(conf, correct, cum_macs) (N, K each) of the test cascade on ``images``, labelled by its last exit
    (so each earlier exit is right where it agrees with the last: a real accuracy-for-MACs trade)."""
    from pipeline.routing.engine import run_all_exits
    from pipeline.routing.recognize import preprocess

    outs = run_all_exits(stages, preprocess(images, META), confidence_kind=META.confidence_kind)
    pred = outs["pred"].numpy()
    return outs["conf"].numpy(), pred == pred[:, -1:], outs["cum_macs"].numpy()


def calibrated(directory: Path, n: int = 3000, seed: int = 5) -> Path:
    """The test cascade with its operating points fitted on ``n`` held-out images (as calibrate does)."""
    from pipeline.routing.calibration import calibrate_delta
    from pipeline.routing.fit import fit_operating_points
    from pipeline.routing.packaging import with_thresholds
    from tests.routing.test_package import uint8_images

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stages = tiny_stages(0)
        arrays = held_out_arrays(stages, uint8_images(n, seed=seed))
        accurate, _ = calibrate_delta(*arrays, delta=0.01, grid=20)
        points = fit_operating_points(*arrays, accurate, grid=20)
        meta = dataclasses.replace(META, operating_points=tuple(points))
        return save_cascade(directory, with_thresholds(stages, accurate), meta)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def points_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test cascade calibrated on held-out images, carrying its operating points."""
    return calibrated(tmp_path_factory.mktemp("serving") / "points")
