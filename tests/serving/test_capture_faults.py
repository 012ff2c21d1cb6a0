"""The test-only capture fault hook: the n-th capture file a server writes gets the fault named
for it (zeros, a NaN in hidden dimension 0, every row a copy of the first); the rest and the
token ids stay as they were."""

from __future__ import annotations

import pytest
import torch
from hallulog.serving.capture import SpoolWriter
from hallulog.serving.capture_faults import ENV, install_from_env, parse_faults
from safetensors.torch import load_file


def test_parse_faults():
    assert parse_faults("zeros@2, nan0@4,constant@6") == {2: "zeros", 4: "nan0", 6: "constant"}
    for bad in ("zeros", "ones@2", "nan0@0", "nan0@x"):
        with pytest.raises(ValueError, match=ENV):
            parse_faults(bad)


def test_the_nth_files_get_their_faults(tmp_path, monkeypatch):
    spool = SpoolWriter(tmp_path)
    monkeypatch.setenv(ENV, "zeros@2,nan0@3,constant@4")
    install_from_env(spool)
    hidden = torch.randn(5, 3, 8)
    ids = [7, 8, 9, 10, 11]
    files = [load_file(spool.write(hidden, ids, row0=2)) for _ in range(5)]
    assert torch.equal(files[0]["hidden_states"], hidden)
    assert not files[1]["hidden_states"].any()
    nan = files[2]["hidden_states"]
    assert torch.isnan(nan[:, :, 0]).all() and torch.equal(nan[:, :, 1:], hidden[:, :, 1:])
    assert torch.equal(files[3]["hidden_states"], hidden[:1].expand(5, 3, 8))
    assert torch.equal(files[4]["hidden_states"], hidden)  # the caller's tensor untouched
    assert all(f["token_ids"].tolist() == ids for f in files)


def test_nothing_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    spool = SpoolWriter(tmp_path)
    write = spool.write
    install_from_env(spool)
    assert spool.write == write
