"""The routed three-module test cascade of tests/routing, saved once per session, for the serving tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pipeline.routing.package import save_cascade
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
