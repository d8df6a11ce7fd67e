"""Register's workflow (``stages.register`` parses, calls :func:`read_candidate` and
:func:`register_candidate` inside its MLflow run, writes and prints): the shipped model's gate figures and
lineage read from evaluate's metrics, then the model logged, gated against the champion and registered
(docs/DESIGN.md "Stages and workflows")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.io import load_split, read_json
from pipeline.registry.register import Decision, RegisterConfig, image_frame, log_version, promote
from pipeline.registry.shipped import dominated_veto, gate_candidate, shipped_figures, version_tags


class CandidateMissing(ValueError):
    """Evaluate's metrics lack a figure the gate compares."""


@dataclass(frozen=True)
class RegisterInputs:
    model: Path  # the shipped model (written by calibrate)
    metrics: Path  # evaluate's metrics JSON
    data: Path  # written by ingest: a real test image is the input example
    lock: Path  # dvc.lock, read for lineage tags
    root: Path  # the repository: git commit, the registry's store


@dataclass(frozen=True)
class Candidate:
    evaluated: Mapping[str, Any]  # evaluate's metrics
    figures: dict[str, float]  # what the gate compares
    curve: list[tuple[float, float]]  # the shipped model's operating points (mean MACs, accuracy)
    tags: dict[str, str]  # lineage
    example: Any  # a one-row request DataFrame
    classes: list[str]


def read_candidate(inputs: RegisterInputs, params_record: Mapping[str, Any]) -> Candidate:
    """The shipped model's gate figures, curve, lineage tags, input example and classes; a
    CandidateMissing naming the figures evaluate did not write."""
    evaluated = read_json(inputs.metrics)
    shipped, figures, missing = shipped_figures(evaluated)
    if missing:
        raise CandidateMissing(f"{inputs.metrics} has no {shipped} {', '.join(missing)}")
    candidate, curve = gate_candidate(evaluated, shipped, figures)
    tags = version_tags(inputs.root, inputs.lock, candidate, (inputs.model, inputs.metrics, inputs.data / "test.npz"),
                        params_record)
    example = image_frame(load_split(inputs.data, "test").images[:1])
    classes = read_json(inputs.model / "cascade.json")["meta"]["classes"]  # what the gate compares first
    return Candidate(evaluated, candidate, curve, tags, example, classes)


def register_candidate(cfg: RegisterConfig, inputs: RegisterInputs, candidate: Candidate,
                       record: Callable[[Decision], None]) -> Decision:
    """Log the model as a pyfunc model in the active run, then gate, register and move the aliases as one
    critical section (``record`` writes the decision inside it)."""
    model_uri = log_version(inputs.model, candidate.example)
    return promote(cfg, model_uri, candidate.figures, candidate.tags, curve=candidate.curve, root=inputs.root,
                   record=record, classes=candidate.classes, veto=dominated_veto(candidate.evaluated))
