"""Stage-level progress for ``python -m pipeline.profiles`` (``make repro PROFILE=... DATA=...``): which
DVC stage runs, how far along the run is, and an estimate of what is left.

DVC prints ``Running stage 'NAME':`` when a stage starts and ``Stage 'NAME' didn't change, skipping``
when its cached outputs serve. :class:`StageProgress` reads those lines and answers with one line of
its own (``[stage 4/17 train@m1] ...``). Estimates come from the same run on the same data the last
time it ran here (``.cache/stage_seconds.json``: per run kind, each stage's wall-clock seconds, written
when a run succeeds); on a first run it says that there is none yet and gives the profile's documented
total instead (``FIRST_RUN_HINT``)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

TIMES_FILE = Path(".cache/stage_seconds.json")
# What a run takes on a 2-core CPU without a record of its own (docs/RESULTS.md: the quick profile on
# 2,000 colour images of 48 px with the step floor, 6 min 11 s; the default from scratch).
FIRST_RUN_HINT = {"quick": "about 4-6 min for 2,000 colour images of 48 px",
                  "default": "about 48 min on full Fashion-MNIST (2-core CPU, timed alone)"}
_RUNNING = re.compile(r"Running stage '([^']+)'")
_SKIPPED = re.compile(r"Stage '([^']+)' didn't change, skipping")


def load_times(path: Path, kind: str) -> dict[str, float]:
    """The stage seconds recorded for ``kind`` (empty when none, or when the file is unreadable)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    row = table.get(kind) if isinstance(table, dict) else None
    if not isinstance(row, dict):
        return {}
    return {k: float(v) for k, v in row.items() if isinstance(v, (int, float))}


def save_times(path: Path, kind: str, seconds: Mapping[str, float]) -> None:
    """Record ``seconds`` for ``kind`` beside the other kinds' (written whole, then renamed)."""
    try:
        table = json.loads(path.read_text())
        table = table if isinstance(table, dict) else {}
    except (OSError, ValueError):
        table = {}
    table[kind] = {k: round(v, 1) for k, v in seconds.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class StageProgress:
    """Turns DVC's output lines into progress lines. ``stages``: every stage of the pipeline in the
    order ``dvc stage list`` gives (the total); ``previous``: seconds per stage from the last run of this
    kind; ``clock``: seconds (injectable for tests)."""

    def __init__(self, stages: Iterable[str], previous: Mapping[str, float], hint: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stages, self.previous, self.hint, self.clock = list(stages), dict(previous), hint, clock
        self.done: dict[str, float] = {}  # stage -> seconds it ran (0 when skipped)
        self.current: str | None = None
        self.started = self.clock()
        self.stage_started = self.started

    def _finish_current(self) -> None:
        if self.current is not None:
            self.done[self.current] = self.clock() - self.stage_started
            self.current = None

    def left_estimate(self) -> float | None:
        """Seconds the stages not finished yet took last time (None without a record of all of them)."""
        todo = [s for s in self.stages if s not in self.done]
        if not todo or any(s not in self.previous for s in todo):
            return None
        spent = self.clock() - self.stage_started if self.current in todo else 0.0
        return max(sum(self.previous[s] for s in todo) - spent, 0.0)

    def feed(self, line: str) -> str | None:
        """A progress line for a DVC line that starts or skips a stage; None for any other line."""
        running, skipped = _RUNNING.search(line), _SKIPPED.search(line)
        if not running and not skipped:
            return None
        self._finish_current()
        name = (running or skipped).group(1)  # type: ignore[union-attr]
        if skipped:
            self.done[name] = 0.0
            return None
        self.current, self.stage_started = name, self.clock()
        number = self.stages.index(name) + 1 if name in self.stages else len(self.done) + 1
        elapsed = _minutes(self.clock() - self.started)
        text = f"[stage {number}/{len(self.stages) or '?'} {name}] elapsed {elapsed}"
        last, left = self.previous.get(name), self.left_estimate()
        if last is not None:
            text += f"; this stage took {_minutes(last)} last time"
        if left is not None:
            text += f"; about {_minutes(left)} left"
        elif not self.previous and self.hint:
            text += f"; no timing of this run here yet ({self.hint} in all)"
        return text

    def finish(self) -> dict[str, float]:
        """Seconds per stage that ran (skipped stages keep last time's figure: their work was cached)."""
        self._finish_current()
        ran = {k: v for k, v in self.done.items() if v > 0}
        return {**self.previous, **ran}
