"""Evaluate's one pass per model (pipeline.evaluation.records): the record answers as the engine does
(every exit, the early-exit cascade, each routing candidate's exit), and the whole evaluation suite runs
each model at most once over the test split (forward hooks count the passes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.evaluation import suite
from pipeline.evaluation.figures import candidate_correct, routing_candidates
from pipeline.evaluation.records import all_exits, cascade_output, record_exits, same_network, scored_candidates
from pipeline.routing.assemble import load_stages
from pipeline.routing.engine import run_all_exits, run_cascade
from pipeline.routing.package import CascadeMeta, LoadedCascade
from pipeline.routing.recognize import preprocess
from pipeline.train.baselines import Baselines
from tests.routing.test_assemble import MEAN, STD, costs, write_models
from tests.train.test_baselines import make_meta, stirred
from tests.workflows.workflow_data import CLASSES, split

N_TEST, N_CALIB = 40, 24


def _cascade(models: Path, routing: str, thresholds: list[float], decay: float) -> LoadedCascade:
    stages, _ = load_stages(models, costs(), thresholds, routing)
    return LoadedCascade(stages, CascadeMeta(CLASSES, (1, 8, 8), MEAN, STD, ensemble_decay=decay))


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory):
    models = write_models(tmp_path_factory.mktemp("records") / "models")
    small, large = stirred(2, 1, classes=3), stirred(3, 2, classes=3)
    plain = Baselines(small, large, make_meta(small, large, shape=(1, 8, 8)))
    cascades = suite.SuiteModels(_cascade(models, "selected", [0.5, 0.6], 0.5),
                                 _cascade(models, "testset", [0.55, 0.6], 0.0),
                                 _cascade(models, "default", [0.6, 0.7], 0.25),
                                 _cascade(models, "default", [0.4, 0.5], 0.25), plain)
    test, calib = split("test", N_TEST, 7), split("calib", N_CALIB, 8)
    meta = cascades.main.meta
    data = suite.SuiteData(test, calib, preprocess(test.images, meta), preprocess(calib.images, meta))
    settings = suite.SuiteSettings(costs(), models, grid=8, batch1_images=2,
                                   epoch_budget={"baselines": 1, "modules": [1, 1, 1]})
    return cascades, data, settings


@pytest.mark.parametrize("decay", [0.0, 0.5])
def test_the_record_answers_as_the_engine(setting, decay: float) -> None:
    models, data, _ = setting
    stages = models.main.stages
    record = record_exits(stages, data.x)
    want = run_all_exits(stages, data.x, batch_size=512, ensemble_decay=decay)
    got = all_exits(record, "maxprob", decay)
    assert all(torch.equal(got[key], want[key]) for key in want)
    thresholds = [float(got["conf"][:, k].median()) for k in range(len(stages) - 1)]  # about half leave
    routed, simulated = run_cascade(stages, data.x, ensemble_decay=decay, thresholds=thresholds), cascade_output(
        record, "maxprob", thresholds, decay)
    for key in ("pred", "exit_index", "choices", "macs"):
        assert torch.equal(getattr(simulated, key), getattr(routed, key)), key
    assert simulated.calls == routed.calls
    assert len(set(simulated.exit_index.tolist())) >= 2  # the thresholds split the images: a real test


def test_each_routing_candidate_scores_as_candidate_correct(setting) -> None:
    models, data, settings = setting
    stages = models.main.stages
    recorded = routing_candidates(settings.models, settings.costs, stages)
    record = record_exits(stages, data.x, recorded)
    assert list(record.candidates) == [2]  # module 2 routes between two recorded candidates
    want = candidate_correct(stages, data.x, data.test.labels, "maxprob", recorded, decay=0.5)
    got = scored_candidates(record, data.test.labels, decay=0.5)
    assert got.keys() == want.keys()
    for key in ("paths", "macs", "module_macs"):
        assert got[2][key] == want[2][key]
    assert np.array_equal(got[2]["correct"], want[2]["correct"])


def test_equal_networks_are_recognised_and_different_ones_are_not(setting) -> None:
    models, _, _ = setting
    assert same_network(models.fixed.stages, models.fixed_at_macs.stages)  # loaded twice, same weights
    assert not same_network(models.main.stages, models.fixed.stages)
    with torch.no_grad():
        clone = load_stages(Path(setting[2].models), costs(), None, "default")[0]
        next(clone[0].module.parameters()).add_(1.0)
    assert not same_network(clone, models.fixed.stages)


def _count_passes(models: suite.SuiteModels, x: torch.Tensor) -> dict[int, int]:
    """Rows of ``x`` (its storage: slices of the test images) entering each first module, outside timing."""
    rows: dict[int, int] = {}
    timing = [False]

    def hook(module, inputs, _output) -> None:
        if not timing[0] and inputs[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            rows[id(module)] = rows.get(id(module), 0) + inputs[0].shape[0]

    handles = [m.stages[0].module.register_forward_hook(hook) for m in models.cascades().values()]
    return rows, handles, timing


def test_evaluate_runs_each_model_once_over_test(setting, monkeypatch: pytest.MonkeyPatch) -> None:
    models, data, settings = setting
    rows, handles, timing = _count_passes(models, data.x)
    plain_rows = {id(models.plain.small): 0, id(models.plain.large): 0}

    def plain_hook(module, inputs, _output) -> None:
        plain_rows[id(module)] += inputs[0].shape[0]

    handles += [net.register_forward_hook(plain_hook) for net in (models.plain.small, models.plain.large)]
    real_timing = suite.time_cascade

    def timed(*args, **kwargs):
        timing[0] = True
        try:
            return real_timing(*args, **kwargs)
        finally:
            timing[0] = False

    monkeypatch.setattr(suite, "time_cascade", timed)
    try:
        with torch.no_grad():
            results, curves = suite.evaluation_suite(models, data, settings)
    finally:
        for h in handles:
            h.remove()
    statics = [suite.static_stages(models.main.stages, settings.costs, n.removesuffix("_static"))
               for n in suite.STATIC_ROWS]
    distinct = [s for i, s in enumerate(statics) if not any(same_network(s, t) for t in statics[:i])]
    passes = {name: rows.get(id(m.stages[0].module), 0) / N_TEST for name, m in models.cascades().items()}
    # the cascade's first module also runs each fixed-path network of its modules (its static rows) once
    assert passes == {"main": 1 + len(distinct), "testset": 1, "fixed": 1, "fixed_at_macs": 0}
    assert all(n == N_TEST + N_CALIB for n in plain_rows.values())  # each plain CNN once on test, once on calib
    assert results["timing"]["cascade"]["latency_ms_b1_median"] > 0 and len(curves) == 4
    assert [r["module"] for r in results["candidate_exits"]] == [2, 2]
