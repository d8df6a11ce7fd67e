"""Categorical search spaces: labelled decisions, and architectures as plain hashable values."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    """One labelled categorical choice, e.g. ``op@l1`` among ``("conv3", "dw5", ...)``."""

    label: str
    choices: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"decision {self.label!r} has no choices")
        if len(set(self.choices)) != len(self.choices):
            raise ValueError(f"decision {self.label!r} has repeated choices: {self.choices}")


@dataclass(frozen=True)
class Arch:
    """An architecture: one choice per decision, as ``(label, choice)`` pairs in decision order."""

    items: tuple[tuple[str, str], ...] = ()

    def __getitem__(self, label: str) -> str:
        for key, value in self.items:
            if key == label:
                return value
        raise KeyError(label)

    def as_dict(self) -> dict[str, str]:
        return dict(self.items)

    def key(self) -> str:
        """A compact, stable string form, e.g. ``op@l1=conv3|op@l2=skip`` (empty for no decisions)."""
        return "|".join(f"{k}={v}" for k, v in self.items)

    @classmethod
    def from_key(cls, key: str) -> Arch:
        if not key:
            return cls(())
        pairs = [part.split("=", 1) for part in key.split("|")]
        return cls(tuple((k, v) for k, v in pairs))


@dataclass(frozen=True)
class SearchSpace:
    decisions: tuple[Decision, ...] = ()

    def __post_init__(self) -> None:
        labels = [d.label for d in self.decisions]
        if len(set(labels)) != len(labels):
            raise ValueError(f"repeated decision labels: {labels}")

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(d.label for d in self.decisions)

    def size(self) -> int:
        return math.prod(len(d.choices) for d in self.decisions)

    def make(self, choices: Mapping[str, str]) -> Arch:
        """Build (and check) an architecture from a label -> choice mapping."""
        missing = [d.label for d in self.decisions if d.label not in choices]
        extra = sorted(set(choices) - set(self.labels))
        if missing or extra:
            raise ValueError(f"architecture does not fit the space: missing {missing}, unknown {extra}")
        for d in self.decisions:
            if choices[d.label] not in d.choices:
                raise ValueError(f"{d.label}={choices[d.label]!r} is not one of {d.choices}")
        return Arch(tuple((d.label, choices[d.label]) for d in self.decisions))

    def validate(self, arch: Arch) -> Arch:
        return self.make(arch.as_dict())

    def index(self, arch: Arch) -> tuple[int, ...]:
        return tuple(d.choices.index(arch[d.label]) for d in self.decisions)

    def from_index(self, index: tuple[int, ...]) -> Arch:
        return Arch(tuple((d.label, d.choices[i]) for d, i in zip(self.decisions, index, strict=True)))

    def enumerate(self) -> Iterator[Arch]:
        for index in itertools.product(*(range(len(d.choices)) for d in self.decisions)):
            yield self.from_index(index)
