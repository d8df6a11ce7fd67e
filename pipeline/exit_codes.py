"""One exit status per kind of error, for every stage CLI (``stages/``), ``python -m pipeline.check_params``
and ``python -m pipeline.profiles``, so a script driving the pipeline can tell a data error from a bug
(listed in the README):

- 0: done;
- 1: a bug: an unexpected exception (Python's own status, printed with its traceback);
- 2: usage: the command line is wrong (argparse's status);
- 3: params: a key of params.yaml (or a profile, or ``-S``) is unknown, mistyped or out of range;
- 4: data: an input file or folder is missing, unreadable, corrupt or of the wrong shape or labels;
- 5: a check failed: the data or a result did not pass a check the stage makes (``StageFailed``).
"""

from __future__ import annotations

from pipeline.data.sources import DataError
from pipeline.params.choices import ConfigError

OK, BUG, USAGE, PARAMS, DATA, CHECK = 0, 1, 2, 3, 4, 5


def exit_code(exc: BaseException) -> int | None:
    """The status for a known error, or None for an unexpected one (a bug: let it raise)."""
    if isinstance(exc, ConfigError):
        return PARAMS
    if isinstance(exc, DataError | FileNotFoundError | ValueError):
        return DATA
    return None
