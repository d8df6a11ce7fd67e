from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

from pipeline.cli import main, resolve_model_uri
from pipeline.routing.package import load_cascade
from pipeline.routing.recognize import collect_image_paths, recognize_files
from tests.routing.test_package import save_tiny, write_image_files


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return save_tiny(tmp_path_factory.mktemp("cli") / "model")[1]
    finally:
        torch.set_num_threads(threads)


@pytest.fixture()
def images(tmp_path: Path) -> dict[str, Path]:
    return write_image_files(tmp_path / "images")


def test_recognize_table_answers_good_files_and_flags_the_corrupt_one(
    model_dir: Path, images: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = images["grey_png"].parent
    status = main(["recognize", str(folder), "--model", str(model_dir)])
    out, err = capsys.readouterr()
    assert status == 1
    assert err.strip().splitlines() == [err.strip()]  # exactly one error line
    assert err.startswith(f"error: {images['corrupt']}: ")
    lines = out.strip().splitlines()
    assert lines[0].split() == ["path", "class", "confidence", "exit", "subnets", "MACs"]
    assert len(lines) == 1 + 4
    for name in ("grey_png", "rgb_png", "grey_jpg", "rgb_jpeg"):
        assert any(line.startswith(str(images[name])) for line in lines[1:]), name
    assert "e_corrupt.png" not in out and "notes.txt" not in out + err  # folders list images only
    rows, _ = recognize_files(load_cascade(model_dir), collect_image_paths([folder])[0])
    for line, row in zip(lines[1:], rows, strict=True):
        assert f" {row['confidence']:.3f} " in line and row["class_name"] in line


def test_recognize_json_equals_recognize_files(
    model_dir: Path, images: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [images["rgb_jpeg"], images["corrupt"], images["grey_png"].parent / "sub"]
    status = main(["recognize", *map(str, paths), "--model", str(model_dir), "--json", "--batch-size", "1"])
    out, err = capsys.readouterr()
    assert status == 1 and str(images["corrupt"]) in err
    files, _ = collect_image_paths(paths)
    expected, errors = recognize_files(load_cascade(model_dir), files)
    assert json.loads(out) == expected and len(expected) == 3
    assert [e["path"] for e in errors] == [str(images["corrupt"])]


def test_recognize_clean_run_and_non_image_file(
    model_dir: Path, images: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["recognize", str(images["grey_jpg"]), "--model", str(model_dir)]) == 0
    assert capsys.readouterr().err == ""
    notes = images["grey_png"].parent / "notes.txt"
    assert main(["recognize", str(notes), str(images["grey_jpg"]), "--model", str(model_dir)]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"error: {notes}: ") and str(images["grey_jpg"]) in out
    missing = images["grey_png"].parent / "missing.png"
    assert main(["recognize", str(missing), "--model", str(model_dir)]) == 1
    assert f"error: {missing}: no such file" in capsys.readouterr().err


def test_bad_model_is_exit_2(
    tmp_path: Path, images: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["recognize", str(images["grey_png"]), "--model", str(tmp_path / "nowhere")]) == 2
    assert "error: cannot load model" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["info", "--model", str(tmp_path / "empty")]) == 2
    assert "cascade.json is missing" in capsys.readouterr().err


def test_registry_uri_without_registry(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pipeline.registry.register", None)  # import fails, as when it is absent
    assert main(["info", "--model", "models:/cascade@champion"]) == 2
    assert capsys.readouterr().err.strip() == "error: registry support not available"
    with pytest.raises(ValueError, match="models:/<name>@<alias>"):
        resolve_model_uri("models:/cascade")
    assert resolve_model_uri("some/dir") == Path("some/dir")


def test_registry_uri_goes_through_download_cascade(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[str] = []
    fake = types.ModuleType("pipeline.registry.register")
    scratch: list[Path] = []

    def download(uri: str, dst: str | None = None) -> Path:  # copies the model in, as the registry does
        asked.append(uri)
        if dst is None:
            return model_dir
        scratch.append(Path(dst))
        return Path(shutil.copytree(model_dir, Path(dst) / "cascade"))

    fake.download_cascade = download  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pipeline.registry.register", fake)
    assert resolve_model_uri("models:/cascade/3") == model_dir
    assert main(["info", "--model", "models:/cascade@champion", "--json"]) == 0
    assert asked == ["models:/cascade/3", "models:/cascade@champion"]
    assert json.loads(capsys.readouterr().out)["classes"] == ["ant", "bee", "cat", "dog"]
    assert scratch and not scratch[0].exists()  # the download is removed once the model is loaded


def test_info_text_and_json(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--model", str(model_dir)]) == 0
    text = capsys.readouterr().out
    assert "threshold 0.6" in text and "threshold 0.515" in text and "last exit" in text
    assert "ant, bee, cat, dog" in text and "predictor MACs" in text
    assert "metrics.accuracy: 0.75" in text and "lineage.commit" in text
    assert main(["info", "--model", str(model_dir), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [m["threshold"] for m in summary["modules"]] == [0.6, 0.515, None]
    assert [len(m["candidates"]) for m in summary["modules"]] == [1, 2, 1]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["recognize"], ["recognize", "x.png", "--batch-size", "0"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
    capsys.readouterr()
