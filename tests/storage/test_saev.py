"""saev shard protocol export (seed 001): layout, §3 sizing, §4.2 offsets, padding/truncation."""

import base64
import json
import os
import pickle

import numpy as np
import pytest
from test_storage_docs import tables
from test_wds import H, L, make_store

from storage import ManifestError, StorageError
from storage import saev

LAYERS = [0, 3, 7, 12]


def raw_vector(out, md, ex, layer, token):
    """§4.2 by hand: shard file + byte offset, then one seek + read of d_model values."""
    Lc, T, D = len(md["layers"]), md["patches_per_ex"], md["d_model"]
    S = md["patches_per_shard"] // (T * Lc)
    itemsize = np.dtype(md["dtype"]).itemsize
    shard, ex_in = divmod(ex, S)
    off = ((ex_in * Lc * T) + md["layers"].index(layer) * T + token) * D * itemsize
    with open(os.path.join(out, f"acts{shard:06d}.bin"), "rb") as f:
        f.seek(off)
        return np.frombuffer(f.read(D * itemsize), dtype=md["dtype"])


@pytest.mark.parametrize("align", ["left", "right"])
def test_layout_offsets_and_round_trip(tmp_path, align):
    lengths = [(2, 3), (0, 4), (5, 6), (1, 1), (3, 0), (4, 4), (2, 2)]
    want = make_store(tmp_path / "run", n=len(lengths), lengths=lengths)
    T = 8
    out = saev.export_saev(tmp_path / "run", tmp_path / "dump", tokens_per_ex=T, patches_per_shard=3 * T * L,
                           align=align, ckpt="smollm2")
    md = json.load(open(os.path.join(out, "metadata.json")))
    assert os.path.basename(out) == saev.metadata_hash(md)
    assert md["protocol"] == "2.1" and md["dtype"] == "float32" and md["cls_token"] is False
    assert md["layers"] == LAYERS and md["patches_per_ex"] == T and md["n_examples"] == len(lengths)
    assert isinstance(md["data"], dict)
    shards = json.load(open(os.path.join(out, "shards.json")))
    assert shards == [{"name": "acts000000.bin", "n_examples": 3}, {"name": "acts000001.bin", "n_examples": 3},
                      {"name": "acts000002.bin", "n_examples": 1}]
    for s in shards:
        assert os.path.getsize(os.path.join(out, s["name"])) == s["n_examples"] * L * T * H * 4
    side = [json.loads(l) for l in open(os.path.join(out, saev.SIDECAR))]
    r = saev.SaevReader(out)
    for i, (acts, sm) in enumerate(want.values()):
        t = acts.shape[1]
        s0, t0, kept = saev.window(t, T, align)
        assert (side[i]["seq_len"], side[i]["kept"], side[i]["src_start"], side[i]["tok_start"]) == (t, kept, s0, t0)
        for li, layer in enumerate(LAYERS):
            full = np.fromfile(os.path.join(out, shards[i // 3]["name"]), dtype=np.float32).reshape(-1, L, T, H)[i % 3, li]
            expect = np.zeros((T, H), np.float32)
            expect[t0:t0 + kept] = acts[li, s0:s0 + kept].astype(np.float32)
            np.testing.assert_array_equal(full, expect)  # C-order (S, L, T, D), zero padding
            np.testing.assert_array_equal(r.example(i, layer), expect)
            for tok in (0, T - 1, t0):
                path, off = r.locate(i, layer, tok)
                assert path.endswith(shards[i // 3]["name"])
                np.testing.assert_array_equal(raw_vector(out, md, i, layer, tok), expect[tok])
            got = r.read(i, li)  # store-side view: the real rows only
            np.testing.assert_array_equal(got, acts[li, s0:s0 + kept].astype(np.float32))
            assert got.astype(np.float16).tobytes() == acts[li, s0:s0 + kept].tobytes()  # f16 -> f32 is exact
    assert set(md) == set(saev.METADATA_FIELDS) and set(side[0]) == set(saev.SIDECAR_FIELDS)


def test_no_truncation_round_trips_identically_in_float16(tmp_path):
    want = make_store(tmp_path / "run", n=5)
    T = max(a.shape[1] for a, _ in want.values())
    out = saev.export_saev(tmp_path / "run", tmp_path / "dump", tokens_per_ex=T, dtype="float16",
                           layers=[3, 12])
    md = json.load(open(os.path.join(out, "metadata.json")))
    assert md["protocol"] == "2.2" and md["dtype"] == "float16" and md["layers"] == [3, 12]
    rd = saev.SaevReader(out)  # also the common reader interface (read by layer position)
    assert rd.layer_ids == [3, 12] and len(rd) == 5
    for i, (acts, sm) in enumerate(want.values()):
        m = rd.meta(i)
        assert (m["seq_len"], m["prompt_len"], m["response_len"], m["label"]) == (
            acts.shape[1], sm.prompt_len, sm.response_len, sm.label)
        np.testing.assert_array_equal(rd.read(i, 0), acts[1])
        np.testing.assert_array_equal(rd.read(i, 1), acts[3])


def test_errors(tmp_path):
    make_store(tmp_path / "run", n=3)
    out = saev.export_saev(tmp_path / "run", tmp_path / "dump", tokens_per_ex=4, patches_per_shard=1000)
    r = saev.SaevReader(out)
    with pytest.raises(KeyError, match="layer 5 is not in"):
        r.locate(0, 5, 0)
    with pytest.raises(KeyError):
        r.example(0, 1)
    with pytest.raises(StorageError, match="exists"):
        saev.export_saev(tmp_path / "run", tmp_path / "dump", tokens_per_ex=4, patches_per_shard=1000)
    assert saev.export_saev(tmp_path / "run", tmp_path / "dump", tokens_per_ex=4, patches_per_shard=1000,
                            overwrite=True) == out
    with pytest.raises(StorageError, match="not stored"):
        saev.export_saev(tmp_path / "run", tmp_path / "d2", tokens_per_ex=4, layers=[99])
    with pytest.raises(ValueError, match="holds no example"):
        saev.export_saev(tmp_path / "run", tmp_path / "d2", tokens_per_ex=4, patches_per_shard=10)
    # a protocol-2.1 file written by saev itself carries a base64 pickle in `data`: refused
    mpath = os.path.join(out, "metadata.json")
    md = json.load(open(mpath))
    md["data"] = base64.b64encode(pickle.dumps({"evil": 1})).decode()
    json.dump(md, open(mpath, "w"))
    with pytest.raises(ManifestError, match="refusing to unpickle"):
        saev.SaevReader(out)
    # config drift: metadata no longer hashes to the directory name
    md["data"] = {"sidecar": saev.SIDECAR}
    json.dump(md, open(mpath, "w"))
    with pytest.raises(ManifestError, match="sha256"):
        saev.SaevReader(out)
    os.unlink(os.path.join(out, "shards.json"))
    with pytest.raises(ManifestError, match="shards.json"):
        saev.SaevReader(out, check_hash=False)


def test_doc_tables_match_code():
    t = tables("saev.md")
    assert list(t["metadata.json"]) == list(saev.METADATA_FIELDS)
    assert list(t["shards.json"]) == list(saev.SHARD_FIELDS)
    assert list(t["data"]) == list(saev.DATA_FIELDS)
    assert list(t["hallulog_examples.jsonl"]) == list(saev.SIDECAR_FIELDS)


def test_export_cli(tmp_path, capsys):
    from storage.export_cli import main

    make_store(tmp_path / "run", n=3)
    assert main(["saev", str(tmp_path / "run"), str(tmp_path / "dump"), "--tokens-per-ex", "4", "--layers", "3,7"]) == 0
    out = json.loads(capsys.readouterr().out)["path"]
    assert saev.SaevReader(out).layers == [3, 7]
    assert main(["wds", str(tmp_path / "run"), str(tmp_path / "wds"), "--shard-mb", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["num_records"] == 3
    assert main(["saev", str(tmp_path / "run"), str(tmp_path / "dump"), "--tokens-per-ex", "4", "--layers", "99"]) == 2
