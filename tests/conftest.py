"""Shared test settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Test tensors are tiny: intra-op threads only add spin-waits (10x slower on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n``, ``--dist loadgroup``), every test that reads the shared tiny pipeline
    runs on one worker: its session-wide ``dvc repro`` then runs once, not once per worker."""
    del config
    for item in items:
        if "tiny_repo" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("tiny_repo"))
