"""bfloat16 stores beyond the conformance suite (which runs every format in bfloat16 too):
how each format spells and holds it, converters, exports, the PyTorch side."""

import io
import json
import os
import tarfile

import ml_dtypes
import numpy as np
import pytest
import torch
from hallulog.exports import SaevReader, export_saev, export_wds, saelens
from hallulog.exports import wds as swds
from hallulog.exports.wds_dataset import WdsPairsDataset
from hallulog.storage import (
    ActivationPairsDataset,
    CorruptShardError,
    ManifestError,
    SampleMeta,
    StorageError,
    collate_pairs,
    convert_store,
    dtypes,
    open_store,
    open_writer,
    write_multi_manifest,
)

from tests.storage.conformance import assert_bits_equal, bits, check_store, persist

BF16 = np.dtype(ml_dtypes.bfloat16)
LAYERS, H = [0, 3, 7], 8
LENGTHS = [(2, 3), (0, 4), (5, 6), (1, 1), (3, 0), (4, 4)]


def bf16_store(root, fmt="packed", seed=0, lengths=LENGTHS):
    """A bfloat16 store of every bit pattern but NaNs (the exports widen to float32 and compare
    values); returns {key: (acts, meta)}."""
    rng = np.random.default_rng(seed)
    w = open_writer(fmt, root, layer_ids=LAYERS, hidden_size=H, dtype="bfloat16")
    want = {}
    for i, (p, r) in enumerate(lengths):
        words = rng.integers(0, 1 << 16, (len(LAYERS), p + r, H), dtype=np.uint16)
        words[(words & 0x7F80) == 0x7F80] &= 0xBFFF  # no NaN, no infinity: finite values only
        acts = words.view(BF16)
        meta = SampleMeta(p, r, int(rng.integers(-1, 2)))
        key = f"{i:016x}_{i % 3}"
        persist(w, root, key, acts, meta)
        want[key] = (acts, meta)
    w.close()
    return want


# ---- how each format spells and holds bfloat16 ------------------------------------------------
def test_each_format_records_bfloat16_by_name(tmp_path):
    for fmt in ("packed", "npy", "zarr"):
        want = bf16_store(tmp_path / fmt, fmt)
        r = check_store(
            tmp_path / fmt,
            {k: a for k, (a, _) in want.items()},
            {k: m for k, (_, m) in want.items()},
        )
        assert r.dtype == BF16 and r.read(0, 0).dtype == BF16
    d = tmp_path / "packed" / "activations"
    assert json.load(open(d / "manifest.json"))["dtype"] == "bfloat16"
    assert json.loads(open(d / "commit.log").readline())["dtype"] == "bfloat16"
    # npy: a '<u2' header (np.load gives the words), "bfloat16" in the index line
    line = json.loads(open(tmp_path / "npy" / "activation_index.jsonl").readline())
    assert line["dtype"] == "bfloat16" and line["size_bytes"] == np.prod(line["shape"]) * 2
    words = np.load(tmp_path / "npy" / line["file_path"])
    assert words.dtype == np.dtype("<u2")
    assert_bits_equal(words.view(BF16), want[line["activation_key"]][0])
    # zarr: a '<u2' array (zarr-python has no bfloat16 data type), "bfloat16" in the root attrs
    z = tmp_path / "zarr" / "activations" / "activations.zarr"
    assert json.load(open(z / "arrays" / "activations" / ".zarray"))["dtype"] == "<u2"
    assert json.load(open(z / ".zattrs"))["dtype"] == "bfloat16"
    # multi-store manifest
    m = write_multi_manifest(
        tmp_path / "m", [tmp_path / "packed", tmp_path / "zarr"], check_unique_keys=False
    )
    assert m["dtype"] == "bfloat16" and open_store(tmp_path / "m").dtype == BF16


def test_npy_reads_a_file_numpy_saved_from_an_ml_dtypes_array(tmp_path):
    """``np.save`` of an ml_dtypes bfloat16 array writes a ``<V2`` header: read as bfloat16 too."""
    want = bf16_store(tmp_path, "npy", lengths=[(2, 3)])
    key, (acts, _) = next(iter(want.items()))
    np.save(tmp_path / "activations" / f"{key}.npy", acts)
    assert_bits_equal(open_store(tmp_path).read(0, 2), acts[2])


def test_mixing_dtypes_is_refused(tmp_path):
    bf16_store(tmp_path / "b", "packed", lengths=[(1, 1)])
    for fmt in ("packed", "zarr"):
        w = open_writer(fmt, tmp_path / fmt, layer_ids=LAYERS, hidden_size=H, dtype="float16")
        with pytest.raises(StorageError, match="dtype"):
            w.write("a_0", np.zeros((3, 2, H), BF16), SampleMeta(1, 1))
        w.write("a_0", np.zeros((3, 2, H), np.float16), SampleMeta(1, 1))
        w.close()
        with pytest.raises(StorageError):
            open_writer(fmt, tmp_path / fmt, layer_ids=LAYERS, hidden_size=H, dtype="bfloat16")
    with pytest.raises(StorageError, match="dtype"):
        write_multi_manifest(tmp_path / "m", [tmp_path / "b", tmp_path / "packed"])
    # a manifest naming a dtype that is no float type
    p = tmp_path / "b" / "activations" / "manifest.json"
    m = json.load(open(p))
    m["dtype"] = "<V2"
    json.dump(m, open(p, "w"))
    with pytest.raises(ManifestError, match="floating point"):
        open_store(tmp_path / "b")


@pytest.mark.parametrize("src,dst", [("packed", "npy"), ("npy", "zarr"), ("zarr", "packed")])
def test_convert_keeps_bfloat16_bit_for_bit(tmp_path, src, dst):
    want = bf16_store(tmp_path / "a", src)
    convert_store(tmp_path / "a", tmp_path / "b", dst)
    r = check_store(tmp_path / "b", {k: a for k, (a, _) in want.items()})
    assert r.dtype == BF16


# ---- PyTorch ----------------------------------------------------------------------------------
def test_dataset_gives_bfloat16_tensors_over_the_read_bytes(tmp_path):
    want = bf16_store(tmp_path)
    ds = ActivationPairsDataset(tmp_path, seed=1)
    item = ds[2]
    assert item["acts"].dtype == torch.bfloat16
    key = open_store(tmp_path).meta(2)["sample_key"]
    for q, p in enumerate(item["layer_pos"].tolist()):
        assert_bits_equal(dtypes.to_numpy(item["acts"][q]), want[key][0][p])
    batch = collate_pairs(ds.__getitems__([0, 2, 4]))
    assert batch["acts"].dtype == torch.bfloat16
    assert torch.equal(batch["acts"], collate_pairs([ds[i] for i in (0, 2, 4)])["acts"])
    # the float32 a model trains on is the exact widening
    assert torch.equal(
        item["acts"].float(), torch.from_numpy(dtypes.to_float32(dtypes.to_numpy(item["acts"])))
    )


def test_tensor_views_share_memory():
    a = np.arange(6, dtype=np.float32).astype(BF16)
    t = dtypes.to_tensor(a)
    assert t.dtype == torch.bfloat16 and t.data_ptr() == a.__array_interface__["data"][0]
    back = dtypes.to_numpy(t)
    assert (
        back.dtype == BF16
        and back.__array_interface__["data"][0] == a.__array_interface__["data"][0]
    )
    assert (
        dtypes.torch_dtype("bfloat16") == torch.bfloat16
        and dtypes.torch_dtype("float16") == torch.float16
    )


def test_dtype_helpers():
    assert dtypes.store_dtype("bfloat16") == BF16 and dtypes.store_dtype("<f2") == np.float16
    assert dtypes.store_dtype(BF16) == BF16 and dtypes.dtype_str(BF16) == "bfloat16"
    assert dtypes.dtype_str("float16") == "<f2" and dtypes.dtype_str(np.float32) == "<f4"
    for bad in ("<V2", "<u2", "int8", "nonsense"):
        with pytest.raises(ValueError):
            dtypes.store_dtype(bad)
    words = np.arange(1 << 16, dtype=np.uint16).view(BF16)  # every bit pattern
    with np.errstate(invalid="ignore"):
        slow = words.astype(np.float32)
    assert bits(dtypes.to_float32(words)).tobytes() == bits(slow).tobytes()


# ---- exports ----------------------------------------------------------------------------------
def test_wds_export_holds_uint16_words_and_reads_back_bfloat16(tmp_path):
    want = bf16_store(tmp_path / "run")
    m = export_wds(tmp_path / "run", tmp_path / "wds", shard_bytes=4000)
    assert m["dtype"] == "bfloat16" and len(m["shards"]) > 1
    seen = 0
    for s in m["shards"]:
        with tarfile.open(tmp_path / "wds" / s["file"]) as tar:
            for info in tar:
                if not info.name.endswith("prompt_acts.npy"):
                    continue
                key = info.name.split(".")[0]
                raw = tar.extractfile(info).read()
                plain = np.load(io.BytesIO(raw))  # any numpy: the words
                assert plain.dtype == np.dtype("<u2")
                p = want[key][1].prompt_len
                assert_bits_equal(plain.view(BF16), want[key][0][:, :p])
                assert_bits_equal(swds.decode_npy(raw, info.name, m["dtype"]), want[key][0][:, :p])
                with pytest.raises(CorruptShardError, match="export's dtype is <f2"):
                    swds.decode_npy(raw, info.name, "float16")
                seen += 1
    assert seen == len(want)
    stream = {
        int(it["index"]): it for it in WdsPairsDataset(tmp_path / "wds", seed=3, shuffle_buffer=0)
    }
    ds = ActivationPairsDataset(tmp_path / "run", seed=3)
    for i, it in stream.items():
        assert it["acts"].dtype == torch.bfloat16 and torch.equal(it["acts"], ds[i]["acts"])


def test_saev_export_widens_exactly_to_float32(tmp_path):
    bf16_store(tmp_path / "run")
    out = export_saev(tmp_path / "run", tmp_path / "saev")
    md = json.load(open(os.path.join(out, "metadata.json")))
    assert md["dtype"] == "float32"  # saev's only dtype
    r, src = open_store(tmp_path / "run"), SaevReader(out)
    for i in range(len(r)):
        for l in range(len(LAYERS)):
            assert_bits_equal(src.read(i, l), dtypes.to_float32(r.read(i, l)))


def test_saelens_export_of_a_bfloat16_store(tmp_path):
    pytest.importorskip("datasets")
    from datasets import load_from_disk

    want = bf16_store(tmp_path / "run")
    rows = np.concatenate(
        [dtypes.to_float32(a[1]) for a, _ in want.values()]
    )  # layer 3, store order
    with np.errstate(over="ignore"):  # float16: bfloat16 has float32's range
        for dtype, expect in (("float32", rows), ("float16", rows.astype(np.float16))):
            side = saelens.export_saelens(
                tmp_path / "run", tmp_path / dtype, layer=3, context_size=4, dtype=dtype
            )
            ds = load_from_disk(str(tmp_path / dtype))
            assert ds.features[side["hook_name"]].dtype == dtype
            got = np.asarray(ds.with_format("numpy")[side["hook_name"]]).astype(
                dtype
            )  # numpy format: float32
            n = side["num_rows"] * 4
            assert_bits_equal(got.reshape(n, H), expect[:n])


def test_every_format_doc_says_how_bfloat16_is_stored():
    from tests.storage.test_storage_docs import DOCS

    for doc in (
        "packed.md",
        "npy.md",
        "zarr.md",
        "wds.md",
        "saev.md",
        "saelens.md",
        "sft-packed.md",
        "worker-jsonl.md",
        "consolidated-jsonl.md",
        "parquet.md",
    ):
        assert "bfloat16" in open(os.path.join(DOCS, doc)).read(), doc
    for doc in ("npy.md", "zarr.md", "wds.md"):  # the containers without a bfloat16 type
        assert "`<u2`" in open(os.path.join(DOCS, doc)).read(), doc
