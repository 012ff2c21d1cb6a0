"""Capture hooks and the spool writer on a tiny random model (no real model needed)."""

import os

import pytest
import torch
from hallulog.serving.capture import (
    HiddenStateRecorder,
    SpoolWriter,
    num_layer_ids,
    parse_layer_ids,
)
from safetensors.torch import load_file

from tests.serving.tiny import tiny_model


def test_parse_layer_ids():
    assert parse_layer_ids(None, 4) == [0, 1, 2, 3]
    assert parse_layer_ids("3,0", 4) == [3, 0]
    for bad in ("4", "-1", "a", "1,1", ","):
        with pytest.raises(ValueError):
            parse_layer_ids(bad, 4)


def test_recorder_matches_transformers_and_is_pre_norm():
    model = tiny_model(layers=3)
    assert num_layer_ids(model) == 4
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    recorder = HiddenStateRecorder(model, [0, 1, 2, 3])
    with torch.no_grad():
        recorder.arm()
        ref = model(ids, output_hidden_states=True)
        got = recorder.collect()[0]  # [T, L, H]
    assert got.shape == (5, 4, 32)
    for k in range(3):
        torch.testing.assert_close(got[:, k], ref.hidden_states[k][0])
    # id 3 is the last decoder layer BEFORE the final norm: norm(id 3) == transformers' last entry
    torch.testing.assert_close(model.model.norm(got[:, 3]), ref.hidden_states[3][0])
    assert not torch.allclose(got[:, 3], ref.hidden_states[3][0])
    # disarmed: nothing recorded, subset order kept
    recorder.remove()
    sub = HiddenStateRecorder(model, [2, 0])
    with torch.no_grad():
        model(ids)
        sub.arm()
        model(ids)
    got2 = sub.collect()[0]
    torch.testing.assert_close(got2[:, 0], got[:, 2])
    torch.testing.assert_close(got2[:, 1], got[:, 0])


def test_spool_writer_round_trip(tmp_path):
    writer = SpoolWriter(tmp_path / "spool")
    states = torch.randn(4, 3, 8, dtype=torch.bfloat16)
    path = writer.write(states, [1, 2, 3, 4])
    assert os.path.isabs(path) and path.endswith(".safetensors")
    data = load_file(path)
    assert data["hidden_states"].dtype == torch.bfloat16
    assert torch.equal(data["hidden_states"], states)
    assert data["token_ids"].dtype == torch.int64 and data["token_ids"].tolist() == [1, 2, 3, 4]
    name = os.path.basename(path)  # no partial file left; vLLM-style lock file next to it
    assert sorted(os.listdir(tmp_path / "spool")) == [name, name + ".lock"]
    with pytest.raises(ValueError):
        writer.write(states, [1, 2])
