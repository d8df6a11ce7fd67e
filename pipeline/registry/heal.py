"""Healing what a killed ``register`` left half done. :func:`pipeline.registry.register.promote` creates a version
tagged ``register.state=incomplete`` (with the champion its gate compared against), points the aliases
its decision implies at it, then tags it ``register.state=complete``. A run killed between those steps
leaves an incomplete version; the next :func:`heal`, under the same registry lock and before anything
else, finishes it (sets the missing aliases, then the state) or removes it:

- finished when it is the champion already, or when the champion is still the one its gate compared
  against (the decision in its ``gate`` tag is exactly what the killed run would have applied);
- removed when the champion moved since (its decision is stale) or it holds no decision.

Each step is idempotent, so a heal killed half way is healed by the next run in turn. Versions from
before this protocol (no state tag) are left alone."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.registry import mlflow_models

CHAMPION, CHALLENGER = "champion", "challenger"
STATE_TAG = "register.state"
INCOMPLETE, COMPLETE = "incomplete", "complete"
GATED_AGAINST_TAG = "register.gated_against"  # the champion version the gate compared with, or "none"
GATE_TAG = "gate"  # "passed" | "failed": the decision, written with the version


def pending_tags(champion: int | None) -> dict[str, str]:
    """The state tags a new version is created with: incomplete, and the champion it was gated against."""
    return {STATE_TAG: INCOMPLETE, GATED_AGAINST_TAG: "none" if champion is None else str(champion)}


@dataclass(frozen=True)
class HealStep:
    version: int
    action: str  # "finish" | "remove"
    aliases: tuple[str, ...]  # set (in this order) before the version is tagged complete
    reason: str

    def line(self, name: str) -> str:
        """What the stage prints about it (one line)."""
        done = (f"finished ({', '.join(self.aliases) or 'no alias'} set)" if self.action == "finish"
                else "removed")
        return f"register: {name} v{self.version} was left incomplete by a killed run: {done}; {self.reason}"


def plan_heal(version: int, tags: Mapping[str, str], aliases: Sequence[str], champion: int | None) -> HealStep:
    """What to do with incomplete ``version`` (``tags``, the ``aliases`` on it now) when ``champion``
    is the champion's version now (None: no champion)."""
    decision = tags.get(GATE_TAG)
    wanted = (CHALLENGER, CHAMPION) if decision == "passed" else (CHALLENGER,)
    if champion == version:
        missing = tuple(a for a in (CHALLENGER,) if a not in aliases)
        return HealStep(version, "finish", missing, "it is the champion already")
    if decision not in ("passed", "failed"):
        return HealStep(version, "remove", (), f"it holds no gate decision ({GATE_TAG}={decision!r})")
    now = "none" if champion is None else str(champion)
    gated = tags.get(GATED_AGAINST_TAG)
    if gated != now:
        return HealStep(version, "remove", (),
                        f"its gate compared it with champion {gated}, the champion is now {now}")
    missing = tuple(a for a in wanted if a not in aliases)
    return HealStep(version, "finish", missing, f"gate {decision} against champion {now}, applied")


def incomplete_versions(versions: Sequence[Mapping]) -> list[Mapping]:
    """The versions (as :func:`pipeline.registry.mlflow_models.model_versions` lists them) tagged incomplete."""
    return [v for v in versions if v["tags"].get(STATE_TAG) == INCOMPLETE]


def mark_complete(name: str, version: int | str, *, root: str | os.PathLike[str] = ".") -> None:
    mlflow_models.set_version_tag(name, version, STATE_TAG, COMPLETE, root=root)


def heal(name: str, *, root: str | os.PathLike[str] = ".", log: Callable[[str], None] = print) -> list[HealStep]:
    """Finish or remove every incomplete version of ``name``, oldest first, saying so in one line each.
    Call it under :func:`pipeline.registry.tracking.registry_lock`, before reading the champion."""
    steps = []
    for found in incomplete_versions(mlflow_models.model_versions(name, root=root)):
        champion = mlflow_models.get_version_by_alias(name, CHAMPION, root=root)
        version = int(found["version"])
        now = None if champion is None else int(champion["version"])
        step = plan_heal(version, found["tags"], found["aliases"], now)
        if step.action == "finish":
            for alias in step.aliases:
                mlflow_models.set_alias(name, alias, version, root=root)
            mark_complete(name, version, root=root)
        else:
            mlflow_models.delete_version(name, version, root=root)
        log(step.line(name))
        steps.append(step)
    return steps
