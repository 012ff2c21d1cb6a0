import json
import os

import numpy as np
import pytest
from hallulog.storage import CorruptShardError, ManifestError, open_store, open_writer

from tests.storage.conformance import StoreConformance, check_store, make_sample, persist


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


def test_an_emptied_commit_log_beside_data_is_refused_not_restarted(tmp_path):
    """A commit log cut to nothing while a shard holds data is damage: reopening for writing
    names the log instead of starting a new one (which would drop every committed sample).
    An empty log without data (a crash while the store was being created) starts afresh."""
    w = open_writer("packed", tmp_path, layer_ids=[0], hidden_size=4)
    w.write("a_0", *make_sample(0, 1, 4))
    w.close()
    log_path = tmp_path / "activations" / "commit.log"
    log_path.write_bytes(b"")
    with pytest.raises(ManifestError, match="commit.log: the commit log is empty but"):
        open_writer("packed", tmp_path, layer_ids=[0], hidden_size=4)
    assert log_path.read_bytes() == b""  # untouched
    fresh = tmp_path / "fresh"
    (fresh / "activations").mkdir(parents=True)
    (fresh / "activations" / "commit.log").write_bytes(b"")
    open_writer("packed", fresh, layer_ids=[0], hidden_size=4).close()
    assert len(open_store(fresh)) == 0


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


def _flip_a_byte(shard) -> None:
    with open(shard, "r+b") as f:
        f.seek(7)
        byte = f.read(1)
        f.seek(7)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_new_stores_checksum_with_crc32c(tmp_path):
    import google_crc32c

    w = open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=8)
    acts = [make_sample(k, 2, 8) for k in range(3)]
    for k, (a, meta) in enumerate(acts):
        w.write(f"k_{k}", a, meta)
    w.close()
    d = tmp_path / "activations"
    header = json.loads((d / "commit.log").read_text().splitlines()[0])
    assert header["schema_version"] == 2 and header["checksum"] == "crc32c"
    r = open_store(tmp_path)
    assert r.manifest["checksum"] == "crc32c"
    want = [google_crc32c.value(np.ascontiguousarray(a, np.float16).tobytes()) for a, _ in acts]
    assert np.load(d / "crc32.npy").tolist() == want
    r.verify()


def _as_schema_1(path) -> None:
    """Rewrite a header or manifest as a schema-1 store wrote it: no ``checksum``."""
    import hallulog.storage.packed_layout as pl

    if path.name == "commit.log":
        lines = path.read_text().splitlines(keepends=True)
        head = json.loads(lines[0])
        assert head.pop("checksum") == "crc32"
        head["schema_version"] = 1
        path.write_text(json.dumps(head, sort_keys=True) + "\n" + "".join(lines[1:]))
        return
    m = json.loads(path.read_text())
    assert m.pop("checksum") == "crc32"
    m["schema_version"] = 1
    ix = {name: np.load(path.parent / f"{name}.npy") for name in pl.INDEX_ARRAYS}
    m["content_hash"] = pl.hash_content(pl.hashed_head(m), ix)
    path.write_text(json.dumps(m))


def test_schema_1_stores_keep_zlib_crc32(tmp_path, monkeypatch):
    """A store written before schema 2 is read, verified and resumed with zlib's CRC-32."""
    import zlib

    from hallulog import storage

    monkeypatch.setattr(storage.packed, "DEFAULT_CHECKSUM", "crc32")  # what the old writer did
    w = open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=8)
    first = make_sample(0, 2, 8)
    w.write("k_0", *first)
    w.commit()
    monkeypatch.undo()
    d = tmp_path / "activations"
    _as_schema_1(d / "commit.log")  # the old writer crashed here; the new one resumes it
    w = open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=8)
    assert w.checksum == "crc32"
    w.write("k_1", *make_sample(1, 2, 8))
    w.close()
    r = open_store(tmp_path)
    assert (r.manifest["schema_version"], r.manifest["checksum"]) == (2, "crc32")
    r.verify()
    _as_schema_1(d / "manifest.json")  # as the old writer would have finalized it
    r = open_store(tmp_path)
    assert r.checksum == "crc32" and "checksum" not in r.manifest
    crc = np.load(d / "crc32.npy")
    assert crc[0] == zlib.crc32(np.ascontiguousarray(first[0], np.float16).tobytes())
    r.verify()
    _flip_a_byte(d / "shard_000000.bin")
    with pytest.raises(CorruptShardError, match="checksum"):
        open_store(tmp_path).verify()


def test_unknown_checksum_is_a_manifest_error(tmp_path):
    w = open_writer("packed", tmp_path, layer_ids=[0], hidden_size=4)
    w.write("a_0", *make_sample(0, 1, 4))
    w.close()
    p = tmp_path / "activations" / "manifest.json"
    m = json.loads(p.read_text())
    m["checksum"] = "md5"
    p.write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="unknown checksum 'md5'") as err:
        open_store(tmp_path, verify_hash=False)
    assert str(p) in str(err.value)


def test_writeback_starts_in_page_aligned_runs_while_a_group_is_written(tmp_path, monkeypatch):
    """Once WRITEBACK_BYTES wait, write() starts their writeback; only commit() syncs."""

    from hallulog import storage

    started = []
    real = storage.packed.start_writeback
    monkeypatch.setattr(
        storage.packed,
        "start_writeback",
        lambda fd, off, n: (started.append((off, n)), real(fd, off, n)),
    )
    monkeypatch.setattr(storage.packed, "WRITEBACK_BYTES", 10_000)
    w = open_writer("packed", tmp_path, layer_ids=[0, 1], hidden_size=64)
    locs = [w.write(f"k_{k}", *make_sample(k, 2, 64, t=20 + k)) for k in range(8)]
    end = locs[-1]["byte_offset"] + locs[-1]["size_bytes"]
    assert started and started[0][0] == 0
    for (off, n), (nxt, _) in zip(started, started[1:] + [(None, None)]):
        assert off % 4096 == 0 and n % 4096 == 0 and n >= 10_000 - 4096
        assert nxt is None or nxt == off + n  # contiguous: each byte written back once
    assert started[-1][0] + started[-1][1] > end - 10_000
    w.commit()
    started.clear()
    w.write("k_8", *make_sample(8, 2, 64, t=20))  # below the budget after the commit's sync
    assert started == []
    w.close()
    assert len(open_store(tmp_path)) == 9
    read_r, write_w = os.pipe()
    try:  # not a file: nothing happens (the commit's fdatasync reports real errors)
        real(write_w, 0, 10)
    finally:
        os.close(read_r)
        os.close(write_w)
