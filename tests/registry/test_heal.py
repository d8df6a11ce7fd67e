"""A ``register`` killed between creating a version and finishing it (pipeline.registry.heal): the kill is
injected at each point of :func:`pipeline.registry.register.promote` (an exception that unwinds the lock as a
kill does), plus one real SIGKILL of a process, then the registration is rerun on the same store. After
the rerun one version is champion, no version is left incomplete, and the killed one is finished (its
decision applied) or removed (its decision went stale)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.registry import mlflow_models, tracking
from pipeline.registry.heal import (
    COMPLETE,
    GATED_AGAINST_TAG,
    INCOMPLETE,
    STATE_TAG,
    HealStep,
    heal,
    pending_tags,
    plan_heal,
)
from pipeline.registry.register import CHALLENGER, CHAMPION, RegisterConfig, promote

CFG = RegisterConfig(model_name="heal-cascade", acc_tolerance=0.002, macs_tolerance=0.05)
SEED, BETTER, WORSE = 0.5, 0.6, 0.3  # accuracies: the first champion, a candidate that passes, one that fails


class Killed(BaseException):
    """A kill at a point of promote: not an Exception, so nothing on the way catches it."""


@pytest.fixture(autouse=True)
def embedded_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ENABLE_TELEMETRY", "false")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose v1 is champion (creating a store's tables is the slow part: each test copies it)."""
    root = tmp_path_factory.mktemp("seeded")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        assert register(root, SEED).version == 1
    return root


@pytest.fixture
def store(seeded: Path, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(seeded, root)
    assert champion(root) == 1
    return root


def register(root: Path, accuracy: float, *, record: Callable[[Any], None] | None = None,
             lines: list[str] | None = None) -> Any:
    """One register run on the store in ``root`` (no pyfunc model is logged: the part that is healed
    is the same)."""
    with tracking.stage_run("register", experiment="heal", root=root) as run:
        source = (root / "artifacts" / run.run_id).as_uri()
        return promote(CFG, source, {"accuracy": accuracy, "mean_macs": 1000.0}, {}, root=root,
                       record=record, log=(lines.append if lines is not None else print))


def versions(root: Path) -> dict[int, dict]:
    return {int(v["version"]): v for v in mlflow_models.model_versions(CFG.model_name, root=root)}


def champion(root: Path) -> int | None:
    found = mlflow_models.get_version_by_alias(CFG.model_name, CHAMPION, root=root)
    return None if found is None else int(found["version"])


def assert_healed(root: Path) -> dict[int, dict]:
    """No version incomplete, every version tagged complete, and one champion among them."""
    found = versions(root)
    assert {v: f["tags"].get(STATE_TAG) for v, f in found.items()} == dict.fromkeys(found, COMPLETE)
    holders = [v for v, f in found.items() if CHAMPION in f["aliases"]]
    assert holders == [champion(root)], found
    return found


def kill_at(monkeypatch: pytest.MonkeyPatch, target: Any, attr: str, call: int) -> None:
    """Make the ``call``-th call (1-based) of ``target.attr`` die before it does anything."""
    real, calls = getattr(target, attr), []

    def dying(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == call:
            raise Killed(f"killed at {attr} #{call}")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, attr, dying)


# The points of promote a kill can fall between (after the version is created): before the challenger
# alias, between challenger and champion, before the complete tag, before the decision is recorded.
POINTS = {"created": ("set_alias", 1), "challenger set": ("set_alias", 2),
          "aliases set": ("set_version_tag", 1), "complete": ("record", 1)}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_kill_at_each_point_is_healed_by_the_rerun(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                      point: str) -> None:
    attr, call = POINTS[point]
    with monkeypatch.context() as mp:
        recorded: list[Any] = []

        def record(decision: Any) -> None:
            if attr == "record":
                raise Killed("killed before the decision was recorded")
            recorded.append(decision)

        if attr != "record":
            kill_at(mp, mlflow_models, attr, call)
        with pytest.raises(Killed):
            register(store, BETTER, record=record)
        assert not recorded
    left = versions(store)[2]
    assert left["tags"][STATE_TAG] == (COMPLETE if point == "complete" else INCOMPLETE)
    lines: list[str] = []
    rerun = register(store, BETTER, lines=lines)  # dvc reruns the stage: its output was never written
    found = assert_healed(store)
    assert rerun.version == 3 and rerun.previous_champion == 2 and rerun.passed
    assert champion(store) == 3 and found[3]["aliases"] == [CHALLENGER, CHAMPION]
    assert found[2]["aliases"] == []  # finished (it was champion before the rerun moved on), kept
    if point == "complete":
        assert lines == []  # nothing was left half done
    else:
        assert len(lines) == 1 and "v2 was left incomplete" in lines[0] and "finished" in lines[0], lines


def test_a_killed_failing_version_is_finished_as_challenger_only(store: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as mp:
        kill_at(mp, mlflow_models, "set_alias", 1)
        with pytest.raises(Killed):
            register(store, WORSE)
    steps = heal(CFG.model_name, root=store, log=lambda _: None)
    assert steps == [HealStep(2, "finish", (CHALLENGER,), "gate failed against champion 1, applied")]
    found = assert_healed(store)
    assert champion(store) == 1 and found[2]["aliases"] == [CHALLENGER]
    assert heal(CFG.model_name, root=store) == []  # nothing left: a second heal does nothing


def test_a_version_whose_champion_moved_is_removed(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    register(store, WORSE)  # v2, challenger only
    with monkeypatch.context() as mp:
        kill_at(mp, mlflow_models, "set_alias", 1)
        with pytest.raises(Killed):
            register(store, BETTER)  # v3, gated against champion v1
    mlflow_models.set_alias(CFG.model_name, CHAMPION, 2, root=store)  # moved by hand meanwhile
    lines: list[str] = []
    rerun = register(store, BETTER, lines=lines)
    assert len(lines) == 1 and "v3" in lines[0] and "removed" in lines[0], lines
    found = assert_healed(store)
    assert sorted(found) == [1, 2, 4] and rerun.version == 4 and rerun.previous_champion == 2


def test_a_heal_killed_half_way_is_healed_by_the_next(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as mp:
        kill_at(mp, mlflow_models, "set_alias", 1)
        with pytest.raises(Killed):
            register(store, BETTER)
    with monkeypatch.context() as mp:
        kill_at(mp, mlflow_models, "set_alias", 2)  # the heal sets challenger, dies before champion
        with pytest.raises(Killed):
            register(store, BETTER)
    assert sorted(versions(store)) == [1, 2]  # the second run died healing, before registering
    register(store, BETTER)
    found = assert_healed(store)
    assert sorted(found) == [1, 2, 3] and champion(store) == 3


def _die_at_alias(root: str) -> None:
    """A register process that SIGKILLs itself right after creating its version."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ["MLFLOW_ENABLE_TELEMETRY"] = "false"

    def die(*_: Any, **__: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    mlflow_models.set_alias = die
    register(Path(root), BETTER)


def test_a_real_sigkill_after_creating_the_version(store: Path) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=_die_at_alias, args=(str(store),))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    assert versions(store)[2]["tags"][STATE_TAG] == INCOMPLETE and versions(store)[2]["aliases"] == []
    lines: list[str] = []
    rerun = register(store, BETTER, lines=lines)  # the store's lock died with the process: no wait
    assert len(lines) == 1 and "v2" in lines[0] and "finished" in lines[0]
    assert_healed(store)
    assert rerun.version == 3 and champion(store) == 3


@pytest.mark.parametrize(("tags", "aliases", "now", "action", "set_"), [
    ({"gate": "passed", **pending_tags(1)}, [], 1, "finish", (CHALLENGER, CHAMPION)),
    ({"gate": "passed", **pending_tags(1)}, [CHALLENGER], 1, "finish", (CHAMPION,)),
    ({"gate": "passed", **pending_tags(1)}, [CHALLENGER, CHAMPION], 7, "finish", ()),  # it is champion
    ({"gate": "failed", **pending_tags(1)}, [], 1, "finish", (CHALLENGER,)),
    ({"gate": "passed", **pending_tags(None)}, [], None, "finish", (CHALLENGER, CHAMPION)),
    ({"gate": "passed", **pending_tags(1)}, [], 3, "remove", ()),  # the champion moved since the gate
    ({"gate": "passed", **pending_tags(None)}, [], 3, "remove", ()),
    ({**pending_tags(1)}, [], 1, "remove", ()),  # no decision
    ({"gate": "passed", STATE_TAG: INCOMPLETE}, [], 1, "remove", ()),  # no record of its champion
])
def test_plan_heal(tags: dict, aliases: list[str], now: int | None, action: str, set_: tuple[str, ...]) -> None:
    version = 7
    step = plan_heal(version, tags, aliases, now)
    assert (step.action, step.aliases) == (action, set_), step
    assert f"v{version} was left incomplete" in step.line("m") and step.reason in step.line("m")


def test_pending_tags() -> None:
    assert pending_tags(None) == {STATE_TAG: INCOMPLETE, GATED_AGAINST_TAG: "none"}
    assert pending_tags(4)[GATED_AGAINST_TAG] == "4"
