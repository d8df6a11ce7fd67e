"""bench.archive.routing_headroom: which images the predictor trains on (``--train-on reaching``) and the
inputs it reads (``--reads``); the runs themselves are a bench."""

from __future__ import annotations

import numpy as np
import torch

from bench.archive.routing_headroom import reaching


def test_reaching_keeps_the_images_every_earlier_exit_passes() -> None:
    # 4 images, 3 exits, 2 classes; the twin's logits decide the confidence at exits 1 and 2
    sure, unsure = [4.0, -4.0], [0.1, 0.0]
    logits = torch.tensor([[sure, sure, sure], [unsure, sure, sure], [unsure, unsure, sure],
                           [sure, unsure, sure]])
    outs = [(torch.zeros_like(logits), np.zeros((4, 3))), (logits, np.zeros((4, 3)))]
    fitted = {"ensemble_decay": 0.0, "thresholds": [0.9, 0.9]}
    assert reaching(outs, 1, fitted, 2, "maxprob").tolist() == [False, True, True, False]
    assert reaching(outs, 1, fitted, 3, "maxprob").tolist() == [False, False, True, False]
    # a threshold above every confidence: every image passes that exit
    assert reaching(outs, 1, {"ensemble_decay": 0.0, "thresholds": [1.1, 1.1]}, 3, "maxprob").all()
