"""The attention summaries' parts: written whole, read back, resumable by key."""

import json

import numpy as np
import pytest
from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError
from hallulog.storage.attention_format import (
    FEATURES,
    METADATA_FIELDS,
    TENSORS,
    done_keys,
    has_attention,
    iter_generations,
    part_paths,
    write_part,
)
from safetensors import safe_open


def _feats(tokens, layers=2, heads=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, size=(tokens, layers, heads, len(FEATURES))).astype(np.float32)


def test_parts_round_trip_in_order(tmp_path):
    a, b, c = _feats(3), _feats(1, seed=1), _feats(5, seed=2)
    write_part(tmp_path, [("p1", 0, "c1", 7), ("p1", 1, "c1", 7)], [a, b])
    write_part(tmp_path, [("p2", 0, "c2", 4)], [c])
    assert [p.name for p in part_paths(tmp_path)] == [
        layout.attention_part(0),
        layout.attention_part(1),
    ]
    got = list(iter_generations(tmp_path))
    assert [(g.prompt_id, g.sample_id, g.commit_id, g.prompt_tokens) for g in got] == [
        ("p1", 0, "c1", 7),
        ("p1", 1, "c1", 7),
        ("p2", 0, "c2", 4),
    ]
    for g, want in zip(got, (a, b, c)):
        np.testing.assert_allclose(g.features, want, atol=1e-3)  # float16 on disk
    assert done_keys(tmp_path) == {("p1", 0, "c1"), ("p1", 1, "c1"), ("p2", 0, "c2")}


def test_a_part_has_exactly_the_documented_tensors_and_metadata(tmp_path):
    path = write_part(tmp_path, [("p", 0, "c", 2)], [_feats(2)])
    with safe_open(str(path), framework="np") as f:
        assert set(f.keys()) == set(TENSORS)
        assert set(f.metadata()) == set(METADATA_FIELDS)
        assert f.metadata()["features"].split(",") == list(FEATURES)
        assert json.loads(f.metadata()["generations"]) == [["p", 0, "c", 2]]
    header = json.loads(path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")])
    assert {k: header[k]["dtype"] for k in TENSORS} == TENSORS


def test_an_unfinished_part_is_not_read(tmp_path):
    """A pass killed while writing leaves a hidden temporary file: never listed or read."""
    write_part(tmp_path, [("p", 0, "c", 2)], [_feats(2)])
    (layout.attention_dir(tmp_path) / ".part-000001.safetensors.partial").write_bytes(b"torn")
    assert len(part_paths(tmp_path)) == 1
    assert [g.prompt_id for g in iter_generations(tmp_path)] == ["p"]


def test_a_corrupt_part_is_one_error_naming_it(tmp_path):
    assert not has_attention(tmp_path)
    folder = layout.attention_dir(tmp_path)
    folder.mkdir()
    (folder / layout.attention_part(0)).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ArtifactError, match="part-000000.safetensors"):
        list(iter_generations(tmp_path))


def test_mismatched_shapes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="share"):
        write_part(tmp_path, [("p", 0, "c", 2), ("q", 0, "c", 2)], [_feats(2), _feats(2, 3)])
