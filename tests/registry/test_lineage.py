"""``pipeline.registry.lineage``, function by function (tests/registry/test_register.py runs it inside the
register stage and checks ``dvc_md5`` against DVC itself): ``dvc_md5`` of a file (read in blocks) and of a directory
(its listing: names and contents count, creation order does not; a missing path named),
``input_hashes``, ``metric_tags`` / ``metrics_from_tags`` (exact round trip, other and unparsable tags
left out) and ``lineage_tags`` on unusual locks (invalid YAML named, no ``stages``, odd entries, tag
keys made safe, params hashed whatever their key order, every stale input named)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from pipeline.registry.lineage import (
    LINEAGE_OUTS,
    METRIC_TAG_PREFIX,
    dvc_md5,
    input_hashes,
    lineage_tags,
    metric_tags,
    metrics_from_tags,
)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()  # noqa: S324


def test_dvc_md5_of_a_file_is_the_md5_of_its_bytes_read_in_blocks(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000  # 1.28 MB: more than one 1 MiB block
    (tmp_path / "w.bin").write_bytes(data)
    assert dvc_md5(tmp_path / "w.bin") == md5(data)
    (tmp_path / "empty").write_bytes(b"")
    assert dvc_md5(str(tmp_path / "empty")) == md5(b"")


def test_dvc_md5_of_a_directory_is_the_md5_of_its_listing(tmp_path: Path) -> None:
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "b.txt").write_bytes(b"bb")
    (d / "a.txt").write_bytes(b"a")
    listing = [{"md5": md5(b"a"), "relpath": "a.txt"}, {"md5": md5(b"bb"), "relpath": "sub/b.txt"}]
    assert dvc_md5(d) == md5(json.dumps(listing, sort_keys=True).encode()) + ".dir"
    (tmp_path / "empty").mkdir()
    assert dvc_md5(tmp_path / "empty") == md5(b"[]") + ".dir"


def test_dvc_md5_of_a_directory_follows_names_and_contents_not_creation_order(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for root, order in ((one, ("x", "y/z", "y/a")), (two, ("y/a", "x", "y/z"))):
        for name in order:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(name)
    assert dvc_md5(one) == dvc_md5(two)
    (two / "y" / "a").rename(two / "y" / "b")
    renamed = dvc_md5(two)
    assert renamed != dvc_md5(one)
    (two / "y" / "b").write_text("changed")
    assert dvc_md5(two) not in (renamed, dvc_md5(one))
    before = dvc_md5(one)
    (one / "y" / "empty_dir").mkdir()  # DVC lists files only
    assert dvc_md5(one) == before


def test_a_missing_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'gone'} does not exist: cannot hash it"):
        dvc_md5(tmp_path / "gone")


def test_input_hashes_by_name(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"f")
    (tmp_path / "d").mkdir()
    assert input_hashes({"data/f": tmp_path / "f", "models/d": str(tmp_path / "d")}) == {
        "data/f": md5(b"f"), "models/d": md5(b"[]") + ".dir"}
    assert input_hashes({}) == {}


def test_metric_tags_round_trip_exactly() -> None:
    metrics = {"accuracy": 0.1 + 0.2, "mean_macs": 12345, "tiny": 1e-300}
    tags = metric_tags(metrics)
    assert tags == {"test.accuracy": "0.30000000000000004", "test.mean_macs": "12345.0",
                    "test.tiny": "1e-300"}
    assert metrics_from_tags(tags) == metrics  # floats, to the last bit


def test_metrics_from_tags_skip_other_and_unparsable_tags() -> None:
    tags = {"test.accuracy": "0.9", "test.bad": "n/a", "git_commit": "abc", "dvc.out.x": "1.0",
            "testing": "3", f"{METRIC_TAG_PREFIX}nested.name": " 2 "}
    assert metrics_from_tags(tags) == {"accuracy": 0.9, "nested.name": 2.0}
    assert metrics_from_tags({}) == {}


def write_lock(path: Path, lock: object) -> Path:
    path.write_text(yaml.safe_dump(lock))
    return path


def test_an_invalid_lock_is_named(tmp_path: Path) -> None:
    lock = tmp_path / "dvc.lock"
    lock.write_text("stages: [unclosed\n")
    with pytest.raises(ValueError, match=f"{lock} is not valid YAML"):
        lineage_tags(tmp_path, lock, {})


@pytest.mark.parametrize("content", [[1, 2], {"schema": "2.0"}, {"stages": ["a"]}, None])
def test_a_lock_without_stages_counts_as_missing(tmp_path: Path, content: object) -> None:
    tags = lineage_tags(tmp_path, write_lock(tmp_path / "dvc.lock", content), {"accuracy": 0.5},
                        inputs={"data/x": "abc"})
    assert tags["dvc.lock"] == "missing" and tags["lineage.lock_agrees"] == "n/a"
    assert tags["run.in.data/x"] == "abc" and tags["test.accuracy"] == "0.5"
    assert not any(k.startswith(("dvc.out.", "dvc.params.")) for k in tags)


def test_odd_entries_are_skipped_and_the_lock_itself_hashed(tmp_path: Path) -> None:
    lock = write_lock(tmp_path / "dvc.lock", {"stages": {
        "broken": "not a mapping",
        "empty": {"cmd": "x", "outs": None, "params": {}},
        "grade": {"cmd": "x",
                  "outs": ["data/graded", {"path": "data/graded"}, {"path": "models/cascade", "md5": 7}],
                  "params": {"params.yaml": {"b": 1, "a": {"y": 2, "x": 1}}}},
    }})
    tags = lineage_tags(tmp_path, lock, {})
    assert tags["dvc.lock"] == hashlib.sha256(lock.read_bytes()).hexdigest()[:16]
    assert tags["dvc.out.models/cascade"] == "7"  # the md5 as a string; outs without one are skipped
    assert "dvc.out.data/graded" not in tags
    assert "dvc.params.empty" not in tags and "dvc.params.broken" not in tags
    # params hashed whatever their key order: the same as the run's own params, written in another order
    same = lineage_tags(tmp_path, lock, {}, params={"params.yaml": {"a": {"x": 1, "y": 2}, "b": 1}},
                        stage="grade")
    assert same["run.params.grade"] == tags["dvc.params.grade"]


def test_tag_keys_are_made_safe(tmp_path: Path) -> None:
    lock = write_lock(tmp_path / "dvc.lock", {"stages": {
        "train@m1": {"params": {"p": 1}}, "eval#x": {"outs": [{"path": "models/cascade", "md5": "m"}]}}})
    tags = lineage_tags(tmp_path, lock, {}, inputs={"data/my file+v2.csv": "h", "a:b_c-d.e/f": "g"},
                        params={}, stage="reg@1")
    assert {"run.in.data/my file.v2.csv", "run.in.a:b_c-d.e/f", "run.params.reg.1", "dvc.params.train.m1",
            "dvc.out.models/cascade"} <= set(tags)
    assert "run.params.reg.1" in tags  # an empty params mapping is still hashed (only None is not)


def test_every_stale_input_is_named_in_input_order(tmp_path: Path) -> None:
    lock = write_lock(tmp_path / "dvc.lock", {"stages": {
        "ingest": {"outs": [{"path": "data/prepared", "md5": "p1"}]},
        "grade": {"outs": [{"path": "data/graded", "md5": "g1"}, {"path": "plots/x", "md5": "x1"}]}}})
    inputs = {"data/graded": "g2", "params.yaml": "zz", "data/prepared": "p2", "plots/x": "x1"}
    tags = lineage_tags(tmp_path, lock, {}, inputs=inputs)
    assert tags["lineage.lock_agrees"] == "no: data/graded, data/prepared"  # params.yaml: not in the lock
    assert "dvc.out.plots/x" not in tags  # compared, but not one of the lineage outs
    tags = lineage_tags(tmp_path, lock, {}, outs=("plots/x",), inputs={"plots/x": "x1"})
    assert tags["dvc.out.plots/x"] == "x1" and tags["lineage.lock_agrees"] == "yes"
    assert "dvc.out.data/prepared" not in tags
    assert LINEAGE_OUTS == ("data/prepared", "data/graded", "models/cascade")
