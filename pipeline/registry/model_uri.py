"""Where a ``--model`` value points: a local model directory, or a registry URI
(``models:/<name>@<alias>``, ``models:/<name>/<version>``) downloaded through the registry. Shared by
the ``cascade`` commands (recognize, info, serve, export)."""

from __future__ import annotations

import os
import re
from pathlib import Path

MODEL_URI_PREFIX = "models:/"
_URI_FORMS = (
    re.compile(r"^models:/(?P<name>[^/@]+)@(?P<alias>[^/@]+)$"),
    re.compile(r"^models:/(?P<name>[^/@]+)/(?P<version>[0-9]+)$"),
)


class RegistryUnavailable(RuntimeError):
    """``pipeline.registry.register`` (and with it MLflow model download) cannot be imported."""


def resolve_model_uri(uri: str, dst: str | os.PathLike[str] | None = None) -> Path:
    """A ``--model`` value as a local model directory.

    A plain path is returned as is; ``models:/<name>@<alias>`` or ``models:/<name>/<version>`` is
    downloaded into ``dst`` through ``pipeline.registry.register.download_cascade(uri, dst) -> Path`` (imported
    lazily, so the CLI works without the registry's dependencies when given a directory).
    """
    if not uri.startswith(MODEL_URI_PREFIX):
        return Path(uri)
    if not any(form.match(uri) for form in _URI_FORMS):
        raise ValueError(f"model URI {uri!r} must be models:/<name>@<alias> or models:/<name>/<version>")
    try:
        from pipeline.registry.register import download_cascade
    except ImportError as exc:
        raise RegistryUnavailable(f"registry support not available ({exc})") from exc
    return Path(download_cascade(uri, dst))
