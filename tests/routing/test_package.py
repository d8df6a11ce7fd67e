from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from pipeline.cli import describe_cascade, format_subnets
from pipeline.io import file_sha256
from pipeline.models.cascade import CascadeSpec, build_modules, feature_shapes
from pipeline.models.modules import ModuleSpec
from pipeline.params.config import CalibrateConfig, ParamsRecord
from pipeline.routing.engine import Stage, build_stage, run_cascade
from pipeline.routing.package import (
    FORMAT_VERSION,
    MANIFEST,
    CascadeMeta,
    LoadedCascade,
    load_cascade,
    manifest_checksum,
)
from pipeline.routing.packaging import packaged, save_cascade, with_thresholds
from pipeline.routing.predictor import Predictor
from pipeline.routing.recognize import collect_image_paths, preprocess, recognize_arrays, recognize_files
from pipeline.search.space import Arch

SPEC = CascadeSpec(
    in_channels=1,
    num_classes=4,
    image_size=16,
    modules=(
        # Global-pool heads before the last module: THRESHOLDS below were read off their confidences.
        ModuleSpec("fixed", 8, 1, 1, head="gap"),
        ModuleSpec("supernet", 16, 2, 2, ("conv3", "dw3", "ir3_e3", "skip"), "conv3", head="gap"),
        ModuleSpec("supernet", 16, 2, 1, ("conv3", "dw3"), "conv3", head_grid=2, head_hidden=8),
    ),
)
CANDIDATES = (
    (Arch(),),
    (Arch((("op@l1", "conv3"), ("op@l2", "skip"))), Arch((("op@l1", "ir3_e3"), ("op@l2", "dw3")))),
    (Arch((("op@l1", "dw3"),)),),  # a static choice that is not the default op
)
THRESHOLDS = (0.6, 0.515, 1.01)  # module 2's confidences sit near 0.5
META = CascadeMeta(
    classes=("ant", "bee", "cat", "dog"),
    image_shape=(1, 16, 16),
    mean=(0.5,),
    std=(0.25,),
    confidence_kind="maxprob",
    num_classes=4,
    info={"metrics": {"accuracy": 0.75, "mean_macs": 12345}, "lineage": {"commit": "abc123"}},
)


def uint8_images(n: int, seed: int, size: int = 16) -> np.ndarray:
    """Grey images with a per-image contrast, so confidences (and so exits and routes) vary."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(5, 120, size=(n, 1, 1, 1))
    return np.clip(128 + rng.standard_normal((n, 1, size, size)) * scale, 0, 255).astype(np.uint8)


def _randomise_buffers(modules: nn.Module, seed: int) -> None:
    """Non-default BN statistics, so a loader that dropped buffers would change the answers."""
    g = torch.Generator().manual_seed(seed)
    for m in modules.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


def tiny_stages(seed: int = 0) -> list[Stage]:
    """The three-module test cascade: fixed, routed supernet (2 candidates), static supernet."""
    modules = build_modules(SPEC, seed=seed)
    modules.eval()
    shapes = feature_shapes(SPEC)
    x = preprocess(uint8_images(64, seed=99), META)  # (64, 1, 16, 16): centres the predictor
    stages = []
    with torch.no_grad():
        _randomise_buffers(modules, seed)
        for module in modules:
            module.head.fc.weight *= 30  # sharper exits: confidences spread well beyond float noise
        h = x
        for k, (module, candidates) in enumerate(zip(modules, CANDIDATES, strict=True)):
            predictor = None
            if len(candidates) > 1:
                predictor = Predictor(shapes[k][0], len(candidates), hidden=8, seed=seed + 10)
                predictor.fc2.weight *= 20
                predictor.fc2.bias -= predictor(h).mean(dim=0)  # both candidates get used
            stages.append(build_stage(module, shapes[k], candidates, THRESHOLDS[k], predictor))
            h, _ = module(h, candidates[0])
    return stages


def save_tiny(directory: Path, seed: int = 0) -> tuple[list[Stage], Path]:
    stages = tiny_stages(seed)
    return stages, save_cascade(directory, stages, META)


def write_image_files(folder: Path, seed: int = 0) -> dict[str, Path]:
    """Real PNG/JPEG files (grey and RGB, several sizes), one corrupt PNG and a non-image file."""
    rng = np.random.default_rng(seed)
    (folder / "sub").mkdir(parents=True, exist_ok=True)
    paths = {
        "grey_png": folder / "a_grey.png",
        "rgb_png": folder / "b_rgb.png",
        "grey_jpg": folder / "sub" / "c_grey.jpg",
        "rgb_jpeg": folder / "sub" / "d_rgb.jpeg",
    }
    sizes = {"grey_png": (16, 16), "rgb_png": (40, 30), "grey_jpg": (20, 20), "rgb_jpeg": (28, 28)}
    for name, path in paths.items():
        h, w = sizes[name]
        shape = (h, w) if name.startswith("grey") else (h, w, 3)
        scale = rng.uniform(10, 120)
        pixels = np.clip(128 + rng.standard_normal(shape) * scale, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(path)
    paths["corrupt"] = folder / "e_corrupt.png"
    paths["corrupt"].write_bytes(rng.integers(0, 256, 300, dtype=np.uint8).tobytes())
    (folder / "notes.txt").write_text("not an image")
    return paths


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Stage], Path]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # runs before the autouse one_thread fixture of conftest
    try:
        return save_tiny(tmp_path_factory.mktemp("pkg") / "model")
    finally:
        torch.set_num_threads(threads)


def test_round_trip_gives_identical_predictions(saved: tuple[list[Stage], Path]) -> None:
    stages, directory = saved
    loaded = load_cascade(directory)
    assert loaded.meta == META and loaded.meta.info == META.info
    arrays = uint8_images(300, seed=1)
    x = preprocess(arrays, META)
    expected = run_cascade(stages, x)
    got = run_cascade(loaded.stages, x)
    # Only meaningful if images leave at every exit and module 2 routes both ways.
    assert torch.bincount(expected.exit_index, minlength=3).min() >= 10
    assert set(expected.choices[:, 1].tolist()) >= {0, 1}
    for name in ("pred", "exit_index", "choices", "macs"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    assert torch.equal(got.conf, expected.conf)
    assert got.calls == expected.calls

    rows = recognize_arrays(loaded, arrays, batch_size=64)
    assert [r["class_index"] for r in rows] == expected.pred.tolist()
    assert [r["exit"] for r in rows] == (expected.exit_index + 1).tolist()
    assert [r["macs"] for r in rows] == expected.macs.tolist()
    # module 1 is fixed: named so, in JSON as in the table
    assert {r["subnets"][0] for r in rows} == {"fixed"}
    for row, choices in zip(rows, expected.choices.tolist(), strict=True):
        assert row["class_name"] == META.classes[row["class_index"]]
        assert row["subnets"] == [
            "-" if c < 0 else stages[k].candidates[c].key() or "fixed" for k, c in enumerate(choices)
        ]


def test_manifest_records_modules_and_costs(saved: tuple[list[Stage], Path]) -> None:
    stages, directory = saved
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["version"] == FORMAT_VERSION
    assert sorted(p.name for p in directory.iterdir()) == [
        MANIFEST, "module_1.pt", "module_2.pt", "module_3.pt", "predictor_2.pt"
    ]
    entries = manifest["modules"]
    assert [e["in_channels"] for e in entries] == [1, 8, 16]
    assert [e["threshold"] for e in entries] == list(THRESHOLDS)
    assert entries[1]["spec"]["ops"] == ["conv3", "dw3", "ir3_e3", "skip"]
    assert entries[1]["candidates"] == [a.key() for a in CANDIDATES[1]]
    assert entries[1]["candidate_macs"] == list(stages[1].candidate_macs)
    assert entries[1]["predictor"] == {"in_channels": 8, "num_candidates": 2, "hidden": 8, "pool": 1}
    assert entries[1]["predictor_macs"] == stages[1].predictor_macs > 0
    assert entries[0]["predictor"] is None and entries[2]["predictor"] is None


def test_describe_and_format(saved: tuple[list[Stage], Path]) -> None:
    summary = describe_cascade(load_cascade(saved[1]))
    assert [m["input_shape"] for m in summary["modules"]] == [[1, 16, 16], [8, 16, 16], [16, 8, 8]]
    assert [m["threshold"] for m in summary["modules"]] == [0.6, 0.515, None]
    assert [m["routing"] for m in summary["modules"]] == ["static", "predictor", "static"]
    assert summary["info"]["metrics"]["accuracy"] == 0.75
    assert format_subnets(["", "op@l1=dw3", "-"]) == "fixed ; op@l1=dw3 ; -"


def test_save_replaces_atomically(tmp_path: Path) -> None:
    directory = tmp_path / "model"
    stages, _ = save_tiny(directory)
    save_cascade(directory, stages, META)  # overwriting an existing model directory is fine
    bad_meta = dataclasses.replace(META, info={"not json": object()})
    with pytest.raises(TypeError):
        save_cascade(directory, stages, bad_meta)
    assert load_cascade(directory).meta == META  # the old directory is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary left behind


def test_save_rejects_what_cannot_be_rebuilt() -> None:
    stages = tiny_stages()
    subnet = stages[0].module.export(Arch())
    exported = dataclasses.replace(stages[0], module=subnet)
    with pytest.raises(ValueError, match="module 1 is a Subnet"):
        save_cascade("unused", [exported, *stages[1:]], META)
    with pytest.raises(ValueError, match="module 1 takes 1 input channels, but receives 3"):
        save_cascade("unused", stages, dataclasses.replace(META, image_shape=(3, 16, 16), mean=(0,) * 3,
                                                           std=(1,) * 3))
    with pytest.raises(ValueError, match="answers over 4 classes"):
        save_cascade("unused", stages, CascadeMeta(("a", "b"), (1, 16, 16), (0.5,), (0.25,)))
    assert not Path("unused").exists()


def _edit_manifest(directory: Path, edit: object, *, reseal: bool = True) -> None:
    """Edit the manifest; ``reseal`` recomputes its checksum (a careful hand edit), so the check
    behind the checksum is the one that speaks."""
    path = directory / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)  # type: ignore[operator]
    if reseal:
        manifest["checksum"] = manifest_checksum(manifest)
    path.write_text(json.dumps(manifest))


def _replace_weights(directory: Path, name: str, state: dict) -> None:
    """Other weights in ``name``, with the manifest's sha256 of it updated (and resealed)."""
    torch.save(state, directory / name)
    _edit_manifest(directory, lambda m: m["sha256"].update({name: file_sha256(directory / name)}))


def _nan_weights(directory: Path) -> None:
    state = torch.load(directory / "module_2.pt", weights_only=True)
    key = next(k for k, v in state.items() if v.is_floating_point())
    state[key] = torch.full_like(state[key], float("nan"))
    _replace_weights(directory, "module_2.pt", state)


CORRUPTIONS = {
    "garbage manifest": (lambda d: (d / MANIFEST).write_text("{not json"), MANIFEST),
    "no manifest": (lambda d: (d / MANIFEST).unlink(), MANIFEST),
    "wrong version": (lambda d: _edit_manifest(d, lambda m: m.update(version=99)), MANIFEST),
    "unknown candidate": (
        lambda d: _edit_manifest(d, lambda m: m["modules"][1]["candidates"].__setitem__(0, "op@l1=dw9")),
        MANIFEST,
    ),
    "broken chain": (lambda d: _edit_manifest(d, lambda m: m["modules"][2].update(in_channels=7)), MANIFEST),
    "meta mismatch": (lambda d: _edit_manifest(d, lambda m: m["meta"].update(num_classes=3)), MANIFEST),
    "no module weights": (lambda d: (d / "module_2.pt").unlink(), "module_2.pt"),
    "no predictor weights": (lambda d: (d / "predictor_2.pt").unlink(), "predictor_2.pt"),
    "truncated weights": (lambda d: (d / "module_3.pt").write_bytes(b"PK\x03\x04"), "module_3.pt"),
    "wrong weights": (lambda d: _replace_weights(d, "module_2.pt", nn.Linear(3, 3).state_dict()),
                      "module_2.pt"),
    "non-finite weights": (_nan_weights, "module_2.pt"),
    "edited, not resealed": (lambda d: _edit_manifest(d, lambda m: m["modules"][0].update(threshold=0.1),
                                                      reseal=False), MANIFEST),
    "no checksum": (lambda d: _edit_manifest(d, lambda m: m.pop("checksum"), reseal=False), MANIFEST),
    "a file without its sha256": (lambda d: _edit_manifest(d, lambda m: m.pop("sha256")), "module_1.pt"),
    "weights outside the folder": (
        lambda d: _edit_manifest(d, lambda m: m["modules"][0].update(weights="../module_1.pt")), MANIFEST),
    "a million layers": (lambda d: _edit_manifest(d, lambda m: m["modules"][2]["spec"].update(layers=10**6)),
                         MANIFEST),
    "a huge image": (lambda d: _edit_manifest(d, lambda m: m["meta"].update(image_shape=[1, 10**6, 10**6])),
                     MANIFEST),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_bad_model_directory_names_the_file(
    case: str, saved: tuple[list[Stage], Path], tmp_path: Path
) -> None:
    corrupt, culprit = CORRUPTIONS[case]
    directory = tmp_path / "model"
    directory.mkdir()
    for path in saved[1].iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    corrupt(directory)
    with pytest.raises(ValueError, match=culprit.replace(".", r"\.")) as info:
        load_cascade(directory)
    assert str(directory) in str(info.value)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_cascade(tmp_path / "nowhere")


def test_preprocess_normalises_and_checks() -> None:
    arrays = np.array([0, 255, 128], dtype=np.uint8).repeat(256).reshape(3, 1, 16, 16)
    x = preprocess(arrays, META)
    assert x.dtype == torch.float32 and x.shape == (3, 1, 16, 16)
    expected = torch.tensor([(0 - 0.5) / 0.25, (1 - 0.5) / 0.25, (128 / 255 - 0.5) / 0.25])
    assert torch.allclose(x[:, 0, 0, 0], expected, atol=1e-6)
    with pytest.raises(ValueError, match="uint8"):
        preprocess(arrays.astype(np.float32), META)
    with pytest.raises(ValueError, match=r"\(N, 1, 16, 16\)"):
        preprocess(arrays[:, :, :8], META)


def test_meta_checks() -> None:
    with pytest.raises(ValueError, match="one value per channel"):
        CascadeMeta(("a", "b"), (3, 8, 8), (0.5,), (0.25,))
    with pytest.raises(ValueError, match="std"):
        CascadeMeta(("a", "b"), (1, 8, 8), (0.5,), (0.0,))
    with pytest.raises(ValueError, match="confidence_kind"):
        CascadeMeta(("a", "b"), (1, 8, 8), (0.5,), (0.25,), confidence_kind="entropy")
    assert CascadeMeta(["a", "b"], [1, 8, 8], [0.5], [0.25]).num_classes == 2  # JSON lists are fine
    with pytest.raises(ValueError, match="ensemble_decay"):
        CascadeMeta(("a", "b"), (1, 8, 8), (0.5,), (0.25,), ensemble_decay=2.0)


def test_the_exit_ensemble_travels_with_the_model(saved: tuple[list[Stage], Path], tmp_path: Path) -> None:
    stages, _ = saved
    meta = dataclasses.replace(META, ensemble_decay=0.5)
    loaded = load_cascade(save_cascade(tmp_path / "ens", stages, meta))
    assert loaded.meta.ensemble_decay == 0.5
    old = META.to_dict()
    old.pop("ensemble_decay")  # a manifest written before the exit ensemble existed
    assert CascadeMeta.from_dict(old).ensemble_decay == 0.0
    images = np.random.default_rng(0).integers(0, 256, (20, 1, 16, 16), dtype=np.uint8)
    x = preprocess(images, meta)
    rows = recognize_arrays(loaded, images)
    expected = run_cascade(loaded.stages, x, ensemble_decay=0.5)
    assert [r["class_index"] for r in rows] == expected.pred.tolist()


def test_recognize_files_collects_errors(saved: tuple[list[Stage], Path], tmp_path: Path) -> None:
    loaded: LoadedCascade = load_cascade(saved[1])
    paths = write_image_files(tmp_path / "images")
    files, missing = collect_image_paths([tmp_path / "images", tmp_path / "nowhere.png"])
    assert [p.name for p in files] == ["a_grey.png", "b_rgb.png", "e_corrupt.png", "c_grey.jpg", "d_rgb.jpeg"]
    assert missing == [{"path": str(tmp_path / "nowhere.png"), "error": "no such file or folder"}]

    rows, errors = recognize_files(loaded, files, batch_size=2)
    assert [e["path"] for e in errors] == [str(paths["corrupt"])]
    assert str(paths["corrupt"]) in errors[0]["error"]
    good = [p for p in files if p != paths["corrupt"]]
    assert [r["path"] for r in rows] == [str(p) for p in good]
    from pipeline.data.sources import decode_image_file

    arrays = np.stack([decode_image_file(p, 1, 16) for p in good])
    assert [{k: v for k, v in r.items() if k != "path"} for r in rows] == recognize_arrays(loaded, arrays)


def test_a_cost_priced_predictor_keeps_its_price_through_the_package(tmp_path: Path) -> None:
    stages = tiny_stages(seed=3)
    routed = stages[1]
    assert routed.predictor is not None
    priced = Predictor(routed.predictor.in_channels, routed.predictor.num_candidates, hidden=8, seed=13,
                       scoring="p_right", offsets=[0.0, -0.35])
    with torch.no_grad():
        priced.fc2.weight *= 20
    stages[1] = build_stage(routed.module, feature_shapes(SPEC)[1], routed.candidates, routed.threshold,
                            priced)
    directory = save_cascade(tmp_path / "model", stages, META)
    entry = json.loads((directory / MANIFEST).read_text())["modules"][1]
    assert entry["predictor"]["scoring"] == "p_right"
    assert entry["predictor"]["offsets"] == pytest.approx([0.0, -0.35])
    loaded = load_cascade(directory)
    x = preprocess(uint8_images(200, seed=4), META)
    expected, got = run_cascade(stages, x), run_cascade(loaded.stages, x)
    assert torch.equal(got.choices, expected.choices) and torch.equal(got.pred, expected.pred)
    assert torch.equal(loaded.stages[1].predictor.offsets, torch.tensor([0.0, -0.35]))


# ------------------------------------------------------------------------------ fitted thresholds


def test_with_thresholds_sets_them_in_order_and_leaves_the_rest() -> None:
    stages = tiny_stages()
    out = with_thresholds(stages, [0.25, 0.75])
    assert [s.threshold for s in out] == [0.25, 0.75, float("inf")]  # past the list: never exits early
    assert [s.threshold for s in stages] == list(THRESHOLDS)  # the originals are untouched
    for old, new in zip(stages, out, strict=True):
        assert new is not old and new.module is old.module and new.predictor is old.predictor
        assert (new.candidates, new.candidate_macs, new.predictor_macs) == (
            old.candidates, old.candidate_macs, old.predictor_macs)
    assert [s.threshold for s in with_thresholds(stages, [0.1, 0.2, 0.3, 0.4])] == [0.1, 0.2, 0.3]


def test_packaged_carries_the_fit_and_its_lineage_through_the_model_directory(tmp_path: Path) -> None:
    res = {"thresholds": [0.5, 0.55], "ensemble_decay": 0.25, "accuracy": 0.8, "mean_macs": 1000.0,
           "sweep": [{"accuracy": 0.7}]}
    fit_cfg = CalibrateConfig.from_params({"calibrate": {"mode": "delta", "delta": 0.01, "grid": 5}})
    params = {"modules": {"m1": {"after": "data/prepared"}}, "train": {"epochs": 1}, "seed": 3}
    stages, meta = packaged(tiny_stages(), META, res, "selected", fit_cfg, ParamsRecord.from_params(params))
    assert [s.threshold for s in stages] == [0.5, 0.55, float("inf")]
    assert meta.info == {"routing": "selected",
                         "calibrate": {"thresholds": [0.5, 0.55], "ensemble_decay": 0.25, "accuracy": 0.8,
                                       "mean_macs": 1000.0},
                         "params": {"calibrate": fit_cfg.section(), "modules": params["modules"],
                                    "train": params["train"]}}
    assert meta.ensemble_decay == 0.25
    assert (meta.classes, meta.image_shape, meta.mean, meta.std, meta.confidence_kind) == (
        META.classes, META.image_shape, META.mean, META.std, META.confidence_kind)
    loaded = load_cascade(save_cascade(tmp_path / "model", stages, meta))
    assert [s.threshold for s in loaded.stages[:-1]] == [0.5, 0.55]
    assert loaded.meta.info == meta.info and loaded.meta.ensemble_decay == 0.25
    with pytest.raises(KeyError, match="modules"):
        packaged(tiny_stages(), META, res, "selected", fit_cfg, ParamsRecord.from_params({"train": {}}))


def test_a_manifest_within_every_limit_but_too_large_in_all_is_refused_before_allocating(
    saved: tuple[list[Stage], Path], tmp_path: Path
) -> None:
    """Every key within its own bound (4096 channels, a 4096-wide head), the product GiBs of weights: refused
    from shapes alone (built on the meta device), naming the manifest and the module."""
    directory = tmp_path / "model"
    directory.mkdir()
    for path in saved[1].iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    _edit_manifest(directory, lambda m: m["modules"][2]["spec"].update(channels=4096, head_hidden=4096, head_grid=8))
    with pytest.raises(ValueError, match=r"GiB of weights by module 3 .* over the limit of 1 GiB") as info:
        load_cascade(directory)
    assert str(directory / MANIFEST) in str(info.value)
