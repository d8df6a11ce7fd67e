"""Each routing candidate scored as a standalone exit behind the cascade (pipeline.evaluation)."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.evaluation import candidate_exits
from tests.routing.conftest import images


def test_candidate_exits_score_each_candidate_behind_the_cascade(tiny):  # noqa: ANN001
    x = images(40, seed=5)
    labels = np.arange(40) % 4
    rows = candidate_exits(tiny.stages, x, labels, "maxprob")
    assert [(r["module"], r["path"]) for r in rows] == [
        (k + 1, a.key()) for k, s in enumerate(tiny.stages) if len(s.candidates) > 1 for a in s.candidates]
    with torch.no_grad():
        h, _ = tiny.modules[0](x)
        for row, arch in zip(rows[:3], tiny.stages[1].candidates, strict=True):
            _, logits = tiny.modules[1](h, arch)
            assert row["accuracy"] == float((logits.argmax(1).numpy() == labels).mean())
            assert row["macs"] == tiny.stages[0].candidate_macs[0] + tiny.stages[1].candidate_macs[
                tiny.stages[1].candidates.index(arch)]
