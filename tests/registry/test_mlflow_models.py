"""``pipeline.registry.mlflow_models``, without logging a real cascade (tests/registry/test_register.py
registers, serves and downloads one): importing it leaves mlflow unimported; ``_pinned`` requirements (local version
suffixes dropped, a missing package left unpinned), ``_schema`` (input columns optional, output ones
required), ``_pyfunc_kwargs`` (the ``pipeline`` package copied without caches), ``_quiet`` (an explicit
setting wins), the lazily built ``CascadeModel`` class published under this module, and the registry
calls on an embedded SQLite store under ``tmp_path``: ``register_version`` (tags from the first moment,
cut to 5000 characters), ``set_alias`` / ``get_version_by_alias`` and ``download_model_artifacts``
(refusing a store that does not exist rather than creating it)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipeline.registry import mlflow_models

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_module_does_not_import_mlflow() -> None:
    code = ("import sys, pipeline.registry.mlflow_models; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout.strip() == "[]"


def test_pinned_requirements(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    versions = {"torch": "2.5.1+cpu", "numpy": "2.1.0"}

    def version(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert mlflow_models._pinned(("torch", "numpy", "not-installed")) == [
        "torch==2.5.1", "numpy==2.1.0", "not-installed"]
    assert mlflow_models._pinned(()) == []


def test_schema_inputs_are_optional_and_outputs_required() -> None:
    from mlflow.types.schema import AnyType, Array, DataType

    columns = (("image", "string"), ("pixels", "any"), ("subnets", "list[string]"), ("macs", "long"))
    inputs = mlflow_models._schema(columns, optional=True)
    outputs = mlflow_models._schema(columns, optional=False)
    assert [c.name for c in inputs.inputs] == ["image", "pixels", "subnets", "macs"]
    assert [c.required for c in inputs.inputs] == [False] * 4
    assert [c.required for c in outputs.inputs] == [True] * 4
    kinds = [c.type for c in outputs.inputs]
    assert kinds[0] == DataType.string and kinds[3] == DataType.long
    assert isinstance(kinds[1], AnyType) and kinds[2] == Array(DataType.string)


def test_pyfunc_kwargs_carry_the_package_without_caches(tmp_path: Path) -> None:
    code = tmp_path / "code" / "pipeline"
    kwargs = mlflow_models._pyfunc_kwargs(tmp_path / "model", code, {"image": ["x"]}, (("image", "string"),),
                                          (("class_index", "long"),))
    copied = {p.relative_to(code).as_posix() for p in code.rglob("*.py")}
    shipped = {p.relative_to(ROOT / "pipeline").as_posix() for p in (ROOT / "pipeline").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert copied == shipped and "registry/mlflow_models.py" in copied and "io.py" in copied
    assert not list(code.rglob("__pycache__"))
    assert kwargs["artifacts"] == {"cascade": str(tmp_path / "model")} and kwargs["code_paths"] == [str(code)]
    assert kwargs["python_model"] == str(mlflow_models.MODEL_CODE)  # code, not an object to pickle
    assert mlflow_models.MODEL_CODE.is_file() and "set_model(CascadeModel())" in mlflow_models.MODEL_CODE.read_text()
    assert kwargs["input_example"] == {"image": ["x"]}
    assert [c.required for c in kwargs["signature"].inputs.inputs] == [False]
    assert [c.required for c in kwargs["signature"].outputs.inputs] == [True]
    assert [r.split("==")[0] for r in kwargs["pip_requirements"]] == [
        "mlflow", "torch", "torchvision", "numpy", "pandas", "pyyaml"]
    assert all("+" not in r for r in kwargs["pip_requirements"])


def test_quiet_keeps_an_explicit_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    mlflow_models._quiet()
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true")
    mlflow_models._quiet()
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "true"


def test_cascade_model_is_published_under_this_module() -> None:
    import mlflow.pyfunc

    cls = mlflow_models.CascadeModel
    assert cls is mlflow_models._cascade_model_class()  # built once
    assert issubclass(cls, mlflow.pyfunc.PythonModel)
    assert (cls.__module__, cls.__qualname__) == ("pipeline.registry.mlflow_models", "CascadeModel")
    with pytest.raises(AttributeError, match="module 'pipeline.registry.mlflow_models' has no attribute 'Cascade'"):
        mlflow_models.Cascade  # noqa: B018


def test_download_refuses_a_store_that_does_not_exist(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(FileNotFoundError, match=f"no MLflow store at sqlite:///{tmp_path / 'mlflow.db'}"):
        mlflow_models.download_model_artifacts("models:/m@champion", tmp_path / "dst", root=tmp_path)
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "dst").exists()


def test_versions_tags_aliases_and_downloads_on_an_embedded_store(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # register_version and the download resolve the registry through MLflow's global URI, which a stage
    # run sets (tracking.stage_run) and which outlives it in this process: point it here, as a stage would
    import mlflow.tracking._model_registry.utils as registry_utils
    import mlflow.tracking._tracking_service.utils as tracking_utils

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(tracking_utils, "_tracking_uri", uri)
    monkeypatch.setattr(registry_utils, "_registry_uri", uri)
    source = tmp_path / "model"
    source.mkdir()
    (source / "cascade.json").write_text('{"a": 1}\n')
    assert mlflow_models.get_version_by_alias("m", "champion", root=tmp_path) is None  # no model yet
    assert (tmp_path / "mlflow.db").is_file()  # the store was created on first use
    v1 = mlflow_models.register_version("m", str(source), {"note": "x" * 6000, "accuracy": 0.5})
    v2 = mlflow_models.register_version("m", str(source), {"note": "second"})
    assert (v1, v2) == ("1", "2")
    assert mlflow_models.get_version_by_alias("m", "champion", root=tmp_path) is None  # no such alias
    mlflow_models.set_alias("m", "champion", v1, root=tmp_path)
    mlflow_models.set_alias("m", "challenger", 2, root=tmp_path)  # an int version is fine
    champion = mlflow_models.get_version_by_alias("m", "champion", root=tmp_path)
    assert champion == {"name": "m", "version": "1", "run_id": champion["run_id"], "source": str(source),
                        "tags": {"note": "x" * 5000, "accuracy": "0.5"}, "aliases": ["champion"]}
    mlflow_models.set_alias("m", "champion", v2, root=tmp_path)  # the alias moves
    moved = mlflow_models.get_version_by_alias("m", "champion", root=tmp_path)
    assert moved["version"] == "2" and sorted(moved["aliases"]) == ["challenger", "champion"]
    assert moved["tags"] == {"note": "second"}
    dst = mlflow_models.download_model_artifacts("models:/m@champion", tmp_path / "dl" / "new", root=tmp_path)
    assert (dst / "cascade.json").read_text() == '{"a": 1}\n' and dst.is_relative_to(tmp_path / "dl" / "new")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where a fresh directory goes
    fresh = mlflow_models.download_model_artifacts("models:/m/1", root=tmp_path)
    assert fresh.parent == tmp_path / "tmp" and fresh.name.startswith("cascade-model-")
    assert (fresh / "cascade.json").read_text() == '{"a": 1}\n'
