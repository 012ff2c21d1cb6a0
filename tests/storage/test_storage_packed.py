import json
import os

import numpy as np
import pytest
from conformance import StoreConformance, check_store, make_sample, persist

from storage import CorruptShardError, ManifestError, open_store, open_writer


class TestPacked(StoreConformance):
    fmt = "packed"
    dataloader_cases = [(0, None), (2, "fork"), (2, "spawn")]

    def assert_partial_on_disk(self, root):
        shard = os.path.join(root, "activations", "shard_000000.bin")
        with open(os.path.join(root, "activations", "commit.log")) as f:
            recs = [json.loads(l) for l in f][1:]
        committed = sum(3 * r["seq_len"] * 16 * 2 for r in recs)
        assert len(recs) == 3 and os.path.getsize(shard) > committed

    def truncate_data(self, root):
        p = os.path.join(root, "activations", "shard_000000.bin")
        os.truncate(p, os.path.getsize(p) - 10)
        return p

    def corrupt_metadata(self, root):
        p = os.path.join(root, "activations", "manifest.json")
        m = json.load(open(p))
        m["dtype"] = "<f4"
        json.dump(m, open(p, "w"))
        return p, "dtype <f4"


def test_rollover_and_crash_across_shards(tmp_path):
    w = open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=8, shard_bytes=2000)
    data = {}
    for k in range(12):
        acts, meta = make_sample(k, 2, 8)
        persist(w, tmp_path, f"k_{k}", acts, meta)
        data[f"k_{k}"] = acts
    shards = sorted(n for n in os.listdir(tmp_path / "activations") if n.endswith(".bin"))
    assert len(shards) > 2
    # simulate a crash: garbage after the last commit, and a half-started next shard
    with open(tmp_path / "activations" / shards[-1], "ab") as f:
        f.write(b"x" * 100)
    with open(tmp_path / "activations" / "shard_000099.bin", "wb") as f:
        f.write(b"y" * 10)
    with open(tmp_path / "activations" / "commit.log", "ab") as f:
        f.write(b'{"key": "k_12", "sha')
    del w  # no close: the process "died"
    w = open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=8)
    assert w.committed_keys() == set(data)
    assert not (tmp_path / "activations" / "shard_000099.bin").exists()
    w.close()
    r = check_store(tmp_path, data)
    assert len(r.manifest["shards"]) == len(shards)
    for s in r.manifest["shards"]:
        assert s["size_bytes"] <= 2000 or s["num_samples"] == 1


def test_content_hash_and_checksum(tmp_path):
    w = open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=8)
    for k in range(3):
        w.write(f"k_{k}", *make_sample(k, 2, 8))
    w.close()
    d = tmp_path / "activations"
    lab = np.load(d / "label.npy")
    np.save(d / "label.npy", (lab + 1).astype(lab.dtype))
    with pytest.raises(ManifestError, match="content hash") as err:
        open_store(tmp_path)
    assert str(d / "manifest.json") in str(err.value)
    np.save(d / "label.npy", lab)
    with open(d / "shard_000000.bin", "r+b") as f:  # a bit flip: sizes fine, checksum not
        f.seek(5)
        f.write(b"\xff")
    r = open_store(tmp_path)
    with pytest.raises(CorruptShardError, match="checksum") as err:
        r.verify()
    assert err.value.path == str(d / "shard_000000.bin")


def test_unfinalized_store_says_how_to_recover(tmp_path):
    w = open_writer("packed", tmp_path, layer_ids=[0], hidden_size=4)
    w.write("a_0", *make_sample(0, 1, 4))
    with pytest.raises(ManifestError, match="not finalized"):
        open_store(tmp_path)
    w.close()
    assert len(open_store(tmp_path)) == 1


def test_reopen_with_other_shape_refused(tmp_path):
    open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=4).close()
    with pytest.raises(Exception, match="created with"):
        open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=8)


def test_group_commit_syncs_each_file_once(tmp_path, monkeypatch):
    """A group of samples costs one fdatasync of the shard and one of the commit log."""
    w = open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=8)
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd))[1])
    monkeypatch.setattr(os, "sync", lambda: pytest.fail("whole-filesystem sync"))
    for k in range(6):
        w.write(f"k_{k}", *make_sample(k, 2, 8))
    assert calls == []
    w.commit()
    assert len(calls) == 2 and len(set(calls)) == 2
    w.close()
