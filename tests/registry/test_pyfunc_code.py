"""The registered model holds no pickle (MLflow models-from-code, ``pipeline/registry/pyfunc_code.py``):
a saved cascade pyfunc model carries no pickled file, loads and answers like the engine with every
pickle loader made to raise, and a model pickled the old way (``python_model`` an object) still loads."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.registry import mlflow_models
from pipeline.registry.register import image_frame, save_cascade_pyfunc
from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import recognize_arrays
from tests.routing.test_package import save_tiny, uint8_images

PICKLE_PROTOCOLS = tuple(bytes([0x80, p]) for p in range(2, 6))  # how a protocol 2-5 pickle starts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return save_tiny(tmp_path_factory.mktemp("pyfunc") / "model")[1]


@pytest.fixture(scope="module")
def saved(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_cascade_pyfunc(model_dir, tmp_path_factory.mktemp("saved") / "pyfunc", image_frame(uint8_images(1, 3)))


def forbid_pickles(monkeypatch: pytest.MonkeyPatch) -> None:
    import cloudpickle

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a pickle was loaded")

    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (cloudpickle, "load"),
                         (cloudpickle, "loads")):
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")


def test_the_saved_model_holds_no_pickle(saved: Path) -> None:
    files = [p for p in saved.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".pkl", ".pickle", ".cloudpickle")]
    assert not [p for p in files if p.read_bytes()[:2] in PICKLE_PROTOCOLS]
    flavor = yaml.safe_load((saved / "MLmodel").read_text())["flavors"]["python_function"]
    assert "python_model" not in flavor and Path(flavor["model_code_path"]).name == "pyfunc_code.py"
    assert (saved / "pyfunc_code.py").read_text() == mlflow_models.MODEL_CODE.read_text()


def test_it_loads_and_answers_like_the_engine_with_pickles_forbidden(saved: Path, model_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow.pyfunc

    forbid_pickles(monkeypatch)
    with pytest.raises(AssertionError, match="a pickle was loaded"):
        pickle.loads(pickle.dumps(1))  # the guard itself holds
    model = mlflow.pyfunc.load_model(str(saved))
    arrays = uint8_images(12, seed=11)
    assert model.predict(image_frame(arrays)).to_dict("records") == recognize_arrays(load_cascade(model_dir), arrays)


def test_a_model_pickled_before_models_from_code_still_loads(model_dir: Path, tmp_path: Path) -> None:
    """Versions registered before hold ``python_model.pkl`` naming ``mlflow_models.CascadeModel``."""
    import mlflow.pyfunc

    kwargs = mlflow_models._pyfunc_kwargs(model_dir, tmp_path / "code" / "pipeline", image_frame(uint8_images(1, 3)),
                                          (("image", "string"),), (("class_index", "long"),))
    kwargs["python_model"] = mlflow_models.CascadeModel()  # the old way: an object, cloudpickled
    mlflow.pyfunc.save_model(str(tmp_path / "old"), **kwargs)
    assert (tmp_path / "old" / "python_model.pkl").is_file()
    arrays = uint8_images(4, seed=5)
    got = mlflow.pyfunc.load_model(str(tmp_path / "old")).predict(image_frame(arrays))
    assert got.to_dict("records") == recognize_arrays(load_cascade(model_dir), arrays)
