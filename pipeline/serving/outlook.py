"""The serving process's admission outlook (:class:`pipeline.serving.admission.Outlook`), shared with the HTTP
front processes through one small JSON file.

LitServe runs the engine in a spawned process and answers HTTP in forked ones: the batch times are measured
in the first, the requests admitted in the others. The engine's process rewrites the file (atomically, at
most every ``every_s``) and each front re-reads it when it changed (a ``stat`` per request), so a refusal
reads estimates at most a fraction of a second old. The file lives in the metrics folder ``serve()`` made
for the server's processes (:data:`pipeline.serving.metrics.ENV`), and goes with it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.serving.admission import Outlook

FILE = "admission.json"


def outlook_path() -> str | None:
    """Where this server's processes share the outlook: in the metrics folder, None without one."""
    from pipeline.serving.metrics import ENV

    folder = os.environ.get(ENV)
    return os.path.join(folder, FILE) if folder else None


class OutlookFile:
    """Writes (the engine's process) or reads (a front) the outlook at ``path``."""

    def __init__(self, path: str | os.PathLike[str], every_s: float = 0.05) -> None:
        self.path, self.every_s = Path(path), every_s
        self.written = -float("inf")
        self.seen: tuple[int, int] | None = None  # (mtime_ns, size) of the file last read
        self.cached: Outlook | None = None

    def write(self, outlook: Outlook, now: float) -> bool:
        """Publish ``outlook`` unless the last write was under ``every_s`` ago; whether it was written."""
        if now - self.written < self.every_s:
            return False
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(outlook.to_json()))
        os.replace(tmp, self.path)  # a reader sees the old file or the new one, never half of one
        self.written = now
        return True

    def read(self) -> Outlook | None:
        """The latest outlook published (None before the first), re-read only when the file changed."""
        try:
            stat = self.path.stat()
        except OSError:
            return self.cached
        if (stat.st_mtime_ns, stat.st_size) != self.seen:
            try:
                self.cached = Outlook.from_json(json.loads(self.path.read_text()))
            except (OSError, ValueError):
                return self.cached  # replaced between stat and read: the next request reads it
            self.seen = (stat.st_mtime_ns, stat.st_size)
        return self.cached
