"""MLflow models of the cascade: the pyfunc model a server runs (``CascadeModel``), logging and saving
it with the ``pipeline`` package as its code, and the model registry's calls (versions with their
tags, aliases, downloads). The registry's logic (the gate, promotion) lives in :mod:`pipeline.registry.register`,
which calls these; runs and the store's locks live in :mod:`pipeline.registry.tracking`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd  # the pyfunc model's predict is typed with it (MLflow reads the hint)

from pipeline.registry.tracking import DEVICE_ENV, default_tracking_uri, ensure_store


def _quiet() -> None:
    """No artifact progress bars: they flood logs and the CLI's stderr (an explicit setting wins)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _client(root: str | os.PathLike[str] = ".") -> Any:
    from mlflow import MlflowClient

    uri = default_tracking_uri(root)
    ensure_store(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _pinned(packages: tuple[str, ...]) -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in packages:
        try:
            out.append(f"{name}=={version(name).split('+')[0]}")  # torch 2.x+cpu -> the public release
        except PackageNotFoundError:
            out.append(name)
    return out


def _schema(columns: tuple[tuple[str, str], ...], *, optional: bool) -> Any:
    from mlflow.types.schema import AnyType, Array, ColSpec, DataType, Schema

    kinds = {"any": AnyType(), "list[string]": Array(DataType.string)}
    return Schema([ColSpec(kinds.get(kind, kind), name, required=not optional) for name, kind in columns])


MODEL_CODE = Path(__file__).with_name("pyfunc_code.py")  # models-from-code: MLflow runs it to load the model


def _pyfunc_kwargs(model_dir: str | os.PathLike[str], code_dir: Path, input_example: Any,
                   input_columns: tuple[tuple[str, str], ...], output_columns: tuple[tuple[str, str], ...]
                   ) -> dict[str, Any]:
    """What a cascade pyfunc model is made of; the whole ``pipeline`` package (without caches), not only
    this room of it, is copied to ``code_dir`` and travels with the model, so a server runs the code the
    model was logged with. The model itself is given as code (:data:`MODEL_CODE`, a file path), not as
    an object MLflow would pickle: whoever loads the model from a shared store unpickles nothing."""
    import shutil

    from mlflow.models import ModelSignature

    import pipeline

    package = Path(pipeline.__file__).resolve().parent
    shutil.copytree(package, code_dir, ignore=shutil.ignore_patterns("__pycache__"))
    signature = ModelSignature(inputs=_schema(input_columns, optional=True),
                               outputs=_schema(output_columns, optional=False))
    return {"python_model": str(MODEL_CODE), "artifacts": {"cascade": str(model_dir)},
            "code_paths": [str(code_dir)], "signature": signature, "input_example": input_example,
            "pip_requirements": _pinned(("mlflow", "torch", "torchvision", "numpy", "pandas", "pyyaml"))}


def log_cascade_model(model_dir: str | os.PathLike[str], input_example: Any,
                      input_columns: tuple[tuple[str, str], ...], output_columns: tuple[tuple[str, str], ...]
                      ) -> str:
    """Log a cascade model directory as a pyfunc model in the active run; returns its model URI. Nothing
    is registered here (:func:`register_version` does it, with every tag at once). Input columns are all
    optional: a request fills one of them per row."""
    import tempfile

    import mlflow

    _quiet()
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "pipeline"
        kwargs = _pyfunc_kwargs(model_dir, code, input_example, input_columns, output_columns)
        info = mlflow.pyfunc.log_model(name="cascade", **kwargs)
    return str(info.model_uri)


def register_version(name: str, model_uri: str, tags: Mapping[str, str]) -> str:
    """A new version of registered model ``name`` (created if missing) for ``model_uri``, holding
    ``tags`` from the moment it exists (the store writes the version and its tags in one transaction),
    so no reader ever sees a version without its tags; returns the version number."""
    import mlflow

    _quiet()
    version = mlflow.register_model(model_uri, name, tags={k: str(v)[:5000] for k, v in tags.items()})
    return str(version.version)


def save_cascade_model(model_dir: str | os.PathLike[str], path: str | os.PathLike[str], input_example: Any,
                       input_columns: tuple[tuple[str, str], ...], output_columns: tuple[tuple[str, str], ...]
                       ) -> Path:
    """The same pyfunc model as :func:`log_cascade_model`, saved to a local directory (no store)."""
    import tempfile

    import mlflow

    _quiet()
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "pipeline"
        kwargs = _pyfunc_kwargs(model_dir, code, input_example, input_columns, output_columns)
        mlflow.pyfunc.save_model(str(path), **kwargs)
    return Path(path)


def set_alias(name: str, alias: str, version: str | int, *, root: str | os.PathLike[str] = ".") -> None:
    _client(root).set_registered_model_alias(name, alias, str(version))


def get_version_by_alias(name: str, alias: str, *,
                         root: str | os.PathLike[str] = ".") -> dict[str, Any] | None:
    """The version an alias points at (``version``, ``run_id``, ``source``, ``tags``, ``aliases``),
    or None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        mv = _client(root).get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise
    return {"name": mv.name, "version": str(mv.version), "run_id": mv.run_id, "source": mv.source,
            "tags": dict(mv.tags or {}), "aliases": list(mv.aliases or [])}


def model_versions(name: str, *, root: str | os.PathLike[str] = ".") -> list[dict[str, Any]]:
    """Every version of registered model ``name`` (``version``, ``tags``, ``aliases`` sorted), oldest
    first; empty when the model does not exist."""
    from mlflow.exceptions import MlflowException

    if "'" in name:
        raise ValueError(f"registered model name {name!r} holds a quote")
    client, found, token = _client(root), [], None
    try:
        pointing = dict(client.get_registered_model(name).aliases or {})  # alias -> version (searches omit them)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            return []
        raise
    while True:
        page = client.search_model_versions(f"name = '{name}'", page_token=token)
        found.extend({"version": str(mv.version), "tags": dict(mv.tags or {}),
                      "aliases": sorted(a for a, v in pointing.items() if str(v) == str(mv.version))}
                     for mv in page)
        token = page.token
        if not token:
            return sorted(found, key=lambda v: int(v["version"]))


def set_version_tag(name: str, version: str | int, key: str, value: str, *,
                    root: str | os.PathLike[str] = ".") -> None:
    _client(root).set_model_version_tag(name, str(version), key, value)


def delete_version(name: str, version: str | int, *, root: str | os.PathLike[str] = ".") -> None:
    """Delete a version (the store drops the aliases that point at it)."""
    _client(root).delete_model_version(name, str(version))


def download_model_artifacts(uri: str, dst: str | os.PathLike[str] | None = None, *,
                             root: str | os.PathLike[str] = ".") -> Path:
    """Download a registered model (``models:/...``) into ``dst`` (default: a fresh temporary
    directory); an embedded store that does not exist is an error, never created empty."""
    import tempfile

    tracking_uri = default_tracking_uri(root)
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri[len("sqlite:///"):]).is_file():
        raise FileNotFoundError(f"no MLflow store at {tracking_uri}: run from the repository root or set "
                                "MLFLOW_TRACKING_URI")
    ensure_store(tracking_uri)
    import mlflow.artifacts

    _quiet()
    dst = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix="cascade-model-"))
    dst.mkdir(parents=True, exist_ok=True)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst),
                                                    tracking_uri=tracking_uri, registry_uri=tracking_uri))


@functools.cache
def _cascade_model_class() -> type:
    """The pyfunc model class, built on first use so importing this module never imports mlflow.

    :mod:`pipeline.registry.pyfunc_code` hands an instance to MLflow when a model is loaded. The class
    is also published as ``pipeline.registry.mlflow_models.CascadeModel`` (module ``__getattr__``):
    versions registered before models-from-code hold a cloudpickle that names it, and still load by it
    (re-registering one logs it as code: ``python -m stages.register``, docs/DESIGN.md "Serving")."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    class CascadeModel(mlflow.pyfunc.PythonModel):
        """Answers a DataFrame of images (see :mod:`pipeline.registry.payload`) with the cascade's rows.

        The cascade loads on the device named by the environment variable ``CASCADE_DEVICE`` of the
        serving process: ``cpu`` (the default), ``auto`` (cuda if available, else cpu), ``cuda`` or
        ``cuda:N``; e.g. ``CASCADE_DEVICE=cuda mlflow models serve -m models:/fashion-cascade@champion``.
        A device the machine lacks fails at load time with a message naming ``CASCADE_DEVICE``."""

        def load_context(self, context: Any) -> None:
            from pipeline.device import resolve_device
            from pipeline.routing.package import load_cascade

            device = resolve_device(os.environ.get(DEVICE_ENV, "cpu").strip() or "cpu", key=DEVICE_ENV)
            self._loaded = load_cascade(context.artifacts["cascade"], device)

        def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
                    ) -> pd.DataFrame:
            from pipeline.registry.payload import predict_frame

            if not isinstance(model_input, pd.DataFrame):
                model_input = pd.DataFrame(model_input)
            try:
                return predict_frame(self._loaded, model_input)
            except ValueError as exc:  # a bad request: the REST server answers 400 with this message
                raise MlflowException.invalid_parameter_value(str(exc)) from None

    CascadeModel.__module__ = __name__
    CascadeModel.__qualname__ = "CascadeModel"
    return CascadeModel


def __getattr__(name: str) -> Any:
    if name == "CascadeModel":
        return _cascade_model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
