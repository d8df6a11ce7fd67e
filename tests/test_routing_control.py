"""The positive control for routing (docs/RESULTS.md "Positive control", ``bench.routing_control``) on a
small instance, through the
library's training, selection and judging: on images whose family (the colour of the whole picture) says
which candidate path is needed, the ``p_right`` predictor must serve, keep the static choice's accuracy
and pay in MACs, and a random router at the same shares must not. If routing stops paying here, the
routing machinery is broken, not the data.

To train in about a minute and a half the two candidates are the control's cheapest and largest module-1 paths as
two plain modules (no weight sharing: a shared exit head learns the cold pairs slowly); the weight-sharing
supernet is measured end to end by ``python -m bench.routing_control`` (docs/RESULTS.md, "Positive
control")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.routing_control import RandomRouter, control_arrays, judge
from pipeline.models.cascade import CascadeSpec, build_modules
from pipeline.models.cost import count_macs
from pipeline.models.modules import NO_ARCH, ModuleSpec
from pipeline.routing.features import candidate_outputs
from pipeline.routing.selection import PredictorConfig, routed_selection, static_selection
from pipeline.train.config import TrainConfig
from pipeline.train.loop import train_module
from pipeline.train.prefix import Prefix

# 10 epochs left the largest path on the cold pairs at a knife edge: 71% on one host, 40% on another
# (AVX-512, torch 2.14.1); at 20 it reads 96% against the cheapest path's 31% here.
SIZE, PER_CLASS, EPOCHS = 32, 300, 20
PATHS = (ModuleSpec("fixed", 16, stride=1, layers=0), ModuleSpec("fixed", 16, stride=1, layers=2))  # skip, conv3 x 2


def splits_of(family: np.ndarray) -> dict[str, np.ndarray]:
    """Row indices: train holds 3/5 of the cold images and 1/5 of the warm ones (learnt at once); route,
    calib and test hold the rest, half warm and half cold each, alternating."""
    warm, cold = np.flatnonzero(family == 0), np.flatnonzero(family == 1)
    fifth, third = len(cold) // 5, 2 * (len(cold) // 5) // 3
    rest = {"cold": cold[3 * fifth:], "warm": warm[fifth:]}
    return {"train": np.concatenate([cold[:3 * fifth], warm[:fifth]]),
            **{name: np.stack([rest["cold"][i * third:(i + 1) * third], rest["warm"][i * third:(i + 1) * third]],
                              axis=1).ravel()  # cold, warm, cold, ...: select's held-out fifth holds both
               for i, name in enumerate(("route", "calib", "test"))}}


@pytest.fixture(scope="module")
def control():  # noqa: ANN201 - the two trained candidates, their MACs, the held-out splits
    images, labels, family = control_arrays(PER_CLASS, seed=0, size=SIZE)
    images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))  # (N, 3, H, W) uint8
    rows = splits_of(family)
    train = images[rows["train"]]
    mean = tuple(float(v) for v in train.mean(axis=(0, 2, 3)) / 255)
    std = tuple(float(v) for v in train.std(axis=(0, 2, 3)) / 255)
    cfg = TrainConfig(epochs=EPOCHS, batch_size=32, lr=0.05, schedule="constant", crop_padding=2, flip=False, seed=0)
    candidates, macs = [], []
    for spec in PATHS:
        module = build_modules(CascadeSpec(in_channels=3, num_classes=4, image_size=SIZE, modules=(spec,)), seed=0)[0]
        train_module(module, Prefix((), mean, std), train, labels[rows["train"]], cfg, cost_of=lambda a: 1.0,
                     cost_max=1.0, exit_saving=1.0, progress=False)
        candidates.append(module.eval())
        macs.append(count_macs(module, (3, SIZE, SIZE)))
    m, sd = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]
    held = {name: ((torch.from_numpy(images[r]).float() / 255 - m) / sd, torch.from_numpy(labels[r]), family[r])
            for name, r in rows.items() if name != "train"}
    return candidates, macs, held


def answers(candidates, x: torch.Tensor, y: torch.Tensor):  # noqa: ANN001, ANN201
    """Each candidate's exit answers, as ``features.candidate_outputs`` gives a supernet's paths: correct
    (N, R) and p(true class) (N, R)."""
    outs = [candidate_outputs(c, x, y, [NO_ARCH]) for c in candidates]
    return torch.cat([o[0] for o in outs], 1), torch.cat([o[1] for o in outs], 1)


def routed_on_test(candidates, macs, test, choice: torch.Tensor, extra_macs: int = 0) -> dict[str, float]:  # noqa: ANN001
    """Accuracy and mean MACs on the test images when image i runs candidate ``choice[i]``."""
    correct, _ = answers(candidates, test[0], test[1])  # (N, R)
    rows = torch.arange(len(choice))
    return {"accuracy": float(correct[rows, choice].double().mean()),
            "mean_macs": float(torch.tensor(macs, dtype=torch.float64)[choice].mean()) + extra_macs}


@pytest.fixture(scope="module")
def selected(control):  # noqa: ANN001, ANN201 - select's two steps on the control, as stages/select.py runs them
    candidates, macs, splits = control
    c_correct, _ = answers(candidates, *splits["calib"][:2])
    selection, metrics, static = static_selection(1, "predictor", [NO_ARCH, NO_ARCH], macs, c_correct, delta=0.003)
    r_correct, r_p_true = answers(candidates, *splits["route"][:2])
    cfg = PredictorConfig(scoring="p_right", hidden=16, pool=1, epochs=50, seed=1)
    selection, metrics, predictor = routed_selection(selection, metrics, static, splits["route"][0], r_correct,
                                                     r_p_true, macs, cfg, max_share=0.05, name="m1")
    return static, selection, metrics, predictor


def test_the_candidates_differ_by_family(control) -> None:  # noqa: ANN001
    candidates, macs, splits = control
    x, y, family = splits["test"]
    correct, _ = answers(candidates, x, y)  # (N, 2): cheapest, largest
    warm, cold = correct[family == 0].double().mean(0), correct[family == 1].double().mean(0)
    assert macs[0] <= 0.2 * macs[1]  # the cheapest path costs a fifth of the largest at most
    assert warm[0] >= 0.95 and warm[0] >= warm[1] - 0.02  # warm: the cheapest path is enough
    assert cold[1] >= cold[0] + 0.15  # cold: the largest path is needed


def test_the_predictor_serves_and_pays_where_routing_is_predictable(control, selected) -> None:  # noqa: ANN001
    candidates, macs, splits = control
    static, selection, metrics, predictor = selected
    assert static == 1, "the static choice must be the largest path (the cheapest loses the cold images)"
    assert metrics["predictor_used"] and selection["mode"] == "predictor", selection.get("decision")
    x, _, family = splits["test"]
    with torch.inference_mode():
        choice = predictor.choose(x)  # (N,)
    # it routes by family: warm images to the cheapest path, cold ones to the largest
    assert (choice[family == 0] == 0).double().mean() >= 0.9
    assert (choice[family == 1] == 1).double().mean() >= 0.9
    routed = routed_on_test(candidates, macs, splits["test"], choice, metrics["predictor_macs"])
    twin = routed_on_test(candidates, macs, splits["test"], torch.full_like(choice, static))
    verdict = judge(routed, twin)
    assert verdict["met"], verdict  # equal accuracy at <= 0.7x the static twin's MACs (or +1 point)


def test_a_random_router_at_the_same_shares_does_not_pay(control, selected) -> None:  # noqa: ANN001
    candidates, macs, splits = control
    static, _, metrics, predictor = selected
    x = splits["test"][0]
    with torch.inference_mode():
        shares = torch.bincount(predictor.choose(x), minlength=len(macs)).double() / len(x)
    twin = routed_on_test(candidates, macs, splits["test"], torch.full((len(x),), static))
    for seed in range(3):
        choice = RandomRouter(shares.tolist(), seed=seed).choose(x)
        rand = routed_on_test(candidates, macs, splits["test"], choice, metrics["predictor_macs"])
        assert not judge(rand, twin)["met"], (seed, rand, twin)


def test_random_router_draws_at_its_shares_and_refuses_bad_ones() -> None:
    picks = RandomRouter([0.25, 0.75], seed=0).choose(torch.zeros(4000, 3, 2, 2))
    assert picks.shape == (4000,) and abs(float(picks.double().mean()) - 0.75) < 0.03
    with pytest.raises(ValueError, match="shares"):
        RandomRouter([1.0])
    with pytest.raises(ValueError, match="shares"):
        RandomRouter([0.5, -0.1])
