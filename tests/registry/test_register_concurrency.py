"""Concurrent registrations on one embedded SQLite store: two processes x 10 rounds, on one shared
store and on a fresh store each round. Each round both processes open the store at the same moment
(a new store: both would create the tables) and then gate and promote at the same moment (both
would read the same champion), through the library's own code: ``tracking.stage_run``, a version
registered in the run, and ``registry.promote`` with the ``record`` callback the stage uses to write
``register.json``. (A real ``stages.register`` run logs a pyfunc model first, about 10 s here; the
part that races is the same.)

Every round, process B's candidate beats process A's, and both beat the previous champion. Run one
after the other, the second always gates against the first, so the decisions form a chain and B's
version is the champion after the round whatever the order; without the lock both read the same
champion and both claim it."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from pipeline.registry import mlflow_models, tracking
from pipeline.registry.register import CHAMPION, RegisterConfig, promote

ROUNDS = 10
CFG = RegisterConfig(model_name="race-cascade", acc_tolerance=0.002, macs_tolerance=0.05)
ROLES = ("A", "B")


def accuracy(role: str, round_: int) -> float:
    """B beats A by 0.01 (> the tolerance); A beats the previous round's B by 0.01."""
    return 0.5 + 0.02 * round_ + (0.01 if role == "B" else 0.0)


def _worker(role: str, roots: list[str], out: str, barrier: Any) -> None:
    """One register process: per round, open the store, register a version, gate and promote it."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # the default: mlflow.db in the root
    os.environ.update(MLFLOW_ENABLE_TELEMETRY="false", DO_NOT_TRACK="1")

    for round_, root in enumerate(roots):
        path = Path(out) / f"r{round_}-{role}.json"
        try:
            barrier.wait(timeout=120)  # both open the store (a fresh one: both would create it) at once
            with tracking.stage_run("register", experiment="race", root=root) as run:
                source = (Path(root) / "artifacts" / run.run_id).as_uri()  # no model is read back
                candidate = {"accuracy": accuracy(role, round_), "mean_macs": 1000.0}
                barrier.wait(timeout=120)  # both read the champion at once

                def record(decision: Any, root: str = root, path: Path = path) -> None:
                    now = mlflow_models.get_version_by_alias(CFG.model_name, CHAMPION, root=root)
                    now = None if now is None else int(now["version"])
                    path.write_text(json.dumps({**decision.to_dict(), "role": role,
                                                "registry_champion": now}))

                promote(CFG, source, candidate, {"role": role}, root=root, record=record)
        except Exception:  # noqa: BLE001 - reported to the test, which fails on it
            path.write_text(json.dumps({"error": traceback.format_exc()}))
            barrier.abort()
            return


def race(tmp_path: Path, roots: list[Path]) -> list[dict[str, dict]]:
    """Run both processes over ``roots`` (one per round); the decisions of each round by role. Any
    error in a process fails the test with its traceback."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(ROLES))
    out = tmp_path / "decisions"
    out.mkdir()
    procs = [ctx.Process(target=_worker, args=(role, [str(r) for r in roots], str(out), barrier))
             for role in ROLES]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + 300
    for proc in procs:
        proc.join(max(1.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    errors = [f.read_text() for f in sorted(out.glob("*.json")) if "error" in json.loads(f.read_text())]
    assert not errors, "\n".join(json.loads(e)["error"] for e in errors)
    assert all(proc.exitcode == 0 for proc in procs), [proc.exitcode for proc in procs]
    rounds = []
    for round_ in range(len(roots)):
        files = {role: out / f"r{round_}-{role}.json" for role in ROLES}
        assert all(f.is_file() for f in files.values()), f"round {round_}: a process wrote no decision"
        rounds.append({role: json.loads(f.read_text()) for role, f in files.items()})
    return rounds


def check_round(round_: int, decisions: dict[str, dict], before: int | None, champion_now: int) -> int:
    """One round's decisions agree with each other and with the registry; returns B's version."""
    a, b = decisions["A"], decisions["B"]
    for d in (a, b):  # what each wrote is the registry's state when it wrote it
        assert d["champion"] == d["registry_champion"], (round_, d)
    # serialized: one gated against the champion before the round, the other against the first's result
    first, second = (a, b) if b["previous_champion"] == a["champion"] else (b, a)
    assert first["previous_champion"] == before, (round_, a, b)
    assert second["previous_champion"] == first["champion"], (round_, a, b)
    assert first["passed"]  # both beat the previous champion; the second passes only if it is B
    assert second["passed"] is (second["role"] == "B"), (round_, a, b)
    # exactly one champion after the round: B's version, and the last writer said so
    assert b["champion"] == b["version"] and second["champion"] == champion_now == b["version"]
    return b["version"]


def champion_of(root: Path) -> int:
    found = mlflow_models.get_version_by_alias(CFG.model_name, CHAMPION, root=root)
    assert found is not None
    return int(found["version"])


@pytest.fixture(scope="module")
def raced(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[dict[str, dict]]]:
    """One race of two processes: ROUNDS rounds on one shared store, then ROUNDS on a fresh store
    each (one pair of processes for both: starting them costs more than the rounds)."""
    tmp = tmp_path_factory.mktemp("race")
    shared = tmp / "shared"
    roots = [shared] * ROUNDS + [tmp / f"fresh{r}" for r in range(ROUNDS)]
    for root in roots:
        root.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default: mlflow.db in each root
        return roots, race(tmp, roots)


@pytest.fixture(autouse=True)
def embedded_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_concurrent_registers_on_one_store(raced: tuple[list[Path], list[dict[str, dict]]]) -> None:
    roots, rounds = raced[0][:ROUNDS], raced[1][:ROUNDS]
    before = None
    for round_, decisions in enumerate(rounds):
        versions = sorted(d["version"] for d in decisions.values())
        assert versions == [2 * round_ + 1, 2 * round_ + 2]  # every run registered its own version
        now = decisions["B"]["version"] if round_ < ROUNDS - 1 else champion_of(roots[0])
        before = check_round(round_, decisions, before, now)
    assert champion_of(roots[0]) == rounds[-1]["B"]["version"]


def test_concurrent_registers_on_a_fresh_store(raced: tuple[list[Path], list[dict[str, dict]]]) -> None:
    roots, rounds = raced[0][ROUNDS:], raced[1][ROUNDS:]
    for round_, (root, decisions) in enumerate(zip(roots, rounds, strict=True)):
        assert sorted(d["version"] for d in decisions.values()) == [1, 2]
        check_round(round_, decisions, None, champion_of(root))
        assert (root / "mlflow.db.lock").is_file()
