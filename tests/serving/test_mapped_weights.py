"""A weight read from its checkpoint's pages (serving/mapped_weights.py): equal to the loaded
one, backed by the file, and refused when the file does not hold it as loaded."""

from __future__ import annotations

import json

import pytest
import torch
from hallulog.serving.mapped_weights import map_weight
from safetensors.torch import save_file


@pytest.fixture
def checkpoint(tmp_path):
    weights = {"model.embed_tokens.weight": torch.randn(300, 64), "norm": torch.randn(64)}
    save_file(weights, tmp_path / "model.safetensors")
    return tmp_path, weights


def test_the_mapped_weight_equals_the_loaded_one(checkpoint):
    path, weights = checkpoint
    loaded = weights["model.embed_tokens.weight"].clone()
    mapped = map_weight(path, "model.embed_tokens.weight", loaded)
    assert mapped is not None and torch.equal(mapped, loaded)
    assert mapped.data_ptr() != loaded.data_ptr()


def test_a_sharded_checkpoint_is_found_through_its_index(tmp_path):
    weight = torch.randn(40, 16)
    save_file({"w": weight}, tmp_path / "model-00002-of-00002.safetensors")
    index = {"weight_map": {"w": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(map_weight(tmp_path, "w", weight), weight)


@pytest.mark.parametrize(
    "loaded",
    [
        lambda w: w.to(torch.bfloat16),  # cast on load
        lambda w: w[:-1].clone(),  # another shape
        lambda w: w.clone().index_fill_(0, torch.tensor([299]), 0.0),  # other values
    ],
)
def test_a_weight_the_file_does_not_hold_as_loaded_is_not_mapped(checkpoint, loaded):
    path, weights = checkpoint
    assert (
        map_weight(path, "model.embed_tokens.weight", loaded(weights["model.embed_tokens.weight"]))
        is None
    )


def test_no_checkpoint_or_no_such_tensor_is_not_mapped(checkpoint, tmp_path_factory):
    path, weights = checkpoint
    w = weights["norm"]
    assert map_weight(tmp_path_factory.mktemp("empty"), "norm", w) is None
    assert map_weight(path, "missing", w) is None
