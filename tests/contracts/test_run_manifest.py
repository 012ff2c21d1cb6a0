"""contracts/run_manifest.py: one frozen manifest value, its defaults, the file kept as it is."""

from __future__ import annotations

import json

import pytest
from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError
from hallulog.contracts.run_manifest import DEFAULT_STORAGE_FORMAT, MANIFEST_VERSION, RunManifest

DOC = {
    "run_id": "r1",
    "k_samples": 2,
    "storage_format": "zarr",
    "from_the_future": {"x": [1]},
    "layer_ids": [0, 3],
}


def _write(root, doc) -> None:
    (root / layout.MANIFEST).write_text(json.dumps(doc, indent=2), encoding="utf-8")


def test_no_manifest_is_none(tmp_path):
    assert RunManifest.load(tmp_path) is None
    with pytest.raises(ArtifactError, match="no run manifest"):
        RunManifest.require(tmp_path)


def test_dump_of_a_loaded_manifest_is_byte_identical(tmp_path):
    _write(tmp_path, DOC)
    before = (tmp_path / layout.MANIFEST).read_bytes()
    RunManifest.load(tmp_path).dump(tmp_path)
    assert (tmp_path / layout.MANIFEST).read_bytes() == before


def test_unknown_keys_and_order_survive_a_replace(tmp_path):
    _write(tmp_path, DOC)
    m = RunManifest.load(tmp_path).replace(k_samples=5, consolidation={"prompts": 3})
    m.dump(tmp_path)
    back = json.loads((tmp_path / layout.MANIFEST).read_text())
    assert list(back) == [*DOC, "consolidation"]
    assert back["from_the_future"] == {"x": [1]} and back["k_samples"] == 5


def test_values_and_defaults(tmp_path):
    _write(tmp_path, DOC)
    m = RunManifest.load(tmp_path)
    assert (m.run_id, m.storage_format, m.layer_ids, m["k_samples"]) == ("r1", "zarr", [0, 3], 2)
    assert m.version == 1 and m.shard is None and "storage_format" in m
    bare = RunManifest({"run_id": "r2"})
    assert bare.storage_format == DEFAULT_STORAGE_FORMAT == "packed"
    assert "storage_format" not in bare and bare.to_dict() == {"run_id": "r2"}
    assert bare.get("k_samples", 0) == 0
    with pytest.raises(TypeError):
        bare.fields["run_id"] = "changed"  # type: ignore[index]


def test_bad_files_are_one_line_naming_the_file(tmp_path):
    (tmp_path / layout.MANIFEST).write_text('{\n  "run_id": \n}')
    with pytest.raises(ArtifactError, match=rf"{layout.MANIFEST}:3: malformed manifest"):
        RunManifest.load(tmp_path)
    _write(tmp_path, [1, 2])
    with pytest.raises(ArtifactError, match="not a JSON object"):
        RunManifest.load(tmp_path)
    _write(tmp_path, {**DOC, "manifest_version": MANIFEST_VERSION + 1})
    with pytest.raises(ArtifactError, match="newer than this hallulog"):
        RunManifest.load(tmp_path)
