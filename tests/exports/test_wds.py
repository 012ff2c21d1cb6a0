"""WebDataset Option A export (seed 002): converter, plain readers, streaming Dataset adapter."""

import io
import json
import os
import tarfile

import numpy as np
import pytest
import torch
from hallulog.exports import wds as swds
from hallulog.exports.wds_dataset import WdsPairsDataset
from hallulog.storage import (
    ActivationPairsDataset,
    CorruptShardError,
    ManifestError,
    SampleMeta,
    collate_pairs,
    open_store,
    open_writer,
)

from tests.storage.test_storage_docs import tables

L, H = 4, 8


def make_store(root, n=10, fmt="packed", seed=0, lengths=None):
    """A store of ``n`` samples with ragged prompt/response lengths; returns {key: (acts, meta)}."""
    rng = np.random.default_rng(seed)
    w = open_writer(fmt, root, layer_ids=[0, 3, 7, 12][:L], hidden_size=H)
    want = {}
    for i in range(n):
        p, r = lengths[i] if lengths else (int(rng.integers(0, 6)), int(rng.integers(1, 7)))
        acts = rng.standard_normal((L, p + r, H)).astype(np.float16)
        meta = SampleMeta(p, r, int(rng.integers(-1, 2)))
        key = f"{i:016x}_{i % 3}"
        w.write(key, acts, meta)
        want[key] = (acts, meta)
    w.close()
    return want


@pytest.fixture
def exported(tmp_path):
    want = make_store(tmp_path / "run", n=12)
    texts = {k: {"prompt": f"q{k}", "response": f"a{k}"} for k in want}
    m = swds.export_wds(
        tmp_path / "run", tmp_path / "wds", shard_bytes=12000, texts=texts, split="train"
    )
    return tmp_path, want, m


def test_manifest_and_sidecar(exported):
    tmp, want, m = exported
    d = tmp / "wds"
    assert len(m["shards"]) > 1 and m["num_records"] == len(want)
    assert [s["file"] for s in m["shards"]] == [f"wds-{k:05d}.tar" for k in range(len(m["shards"]))]
    assert sum(s["num_records"] for s in m["shards"]) == len(want)
    for s in m["shards"]:
        assert os.path.getsize(d / s["file"]) == s["size_bytes"]
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]
    rows = [json.loads(l) for l in open(d / "samples.jsonl")]
    assert [r["sample_key"] for r in rows] == list(want) and rows[0][
        "prompt"
    ] == f"q{rows[0]['sample_key']}"
    assert set(m) == set(swds.MANIFEST_FIELDS) and set(rows[0]) == set(swds.TEXT_FIELDS)


def test_plain_tarfile_and_numpy_round_trip(exported):
    tmp, want, m = exported
    seen = {}
    for s in m["shards"]:
        with tarfile.open(tmp / "wds" / s["file"]) as tar:
            names = tar.getnames()
            for name in names:
                if name.endswith(".meta.json"):
                    key = name[: -len(".meta.json")]
                    meta = json.loads(tar.extractfile(name).read())
                    pa = np.load(io.BytesIO(tar.extractfile(f"{key}.prompt_acts.npy").read()))
                    ra = np.load(io.BytesIO(tar.extractfile(f"{key}.response_acts.npy").read()))
                    seen[key] = (meta, pa, ra)
    assert list(seen) == list(want)
    for i, (key, (acts, sm)) in enumerate(want.items()):
        meta, pa, ra = seen[key]
        assert set(meta) == set(swds.META_FIELDS)
        assert meta == {
            "sample_index": i,
            "prompt_len": sm.prompt_len,
            "response_len": sm.response_len,
            "hallu_label": sm.label,
            "split": "train",
            "sample_key": key,
        }
        assert pa.dtype == np.float16 and pa.shape == (L, sm.prompt_len, H)
        np.testing.assert_array_equal(np.concatenate([pa, ra], axis=1), acts)


def test_webdataset_library_reads_the_shards(exported):
    import webdataset as wds

    tmp, want, m = exported
    urls = [str(tmp / "wds" / s["file"]) for s in m["shards"]]
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode()
    got = {r["__key__"]: r for r in ds}
    assert list(got) == list(want)
    for key, (acts, sm) in want.items():
        r = got[key]
        assert r["meta.json"]["prompt_len"] == sm.prompt_len
        np.testing.assert_array_equal(
            np.concatenate([r["prompt_acts.npy"], r["response_acts.npy"]], axis=1), acts
        )


@pytest.mark.parametrize("backend", ["tarfile", "webdataset"])
def test_streaming_dataset_equals_pairs_dataset(exported, backend):
    tmp, want, m = exported
    ref = ActivationPairsDataset(open_store(tmp / "run"), seed=5)
    ds = WdsPairsDataset(tmp / "wds", seed=5, shuffle_buffer=4, backend=backend)
    assert len(ds) == len(ref)
    items = list(ds)
    assert sorted(int(it["index"]) for it in items) == list(range(len(ref)))
    assert [int(it["index"]) for it in items] != list(range(len(ref)))  # the buffer shuffled
    for it in items:
        r = ref[int(it["index"])]
        assert set(it) == set(r)
        for k in r:
            assert torch.equal(it[k], r[k]), k
    batch = collate_pairs(items[:5])
    assert batch["acts"].shape[:2] == (5, 2)
    ds.set_epoch(1)
    ref.set_epoch(1)
    assert all(torch.equal(it["layers"], ref[int(it["index"])]["layers"]) for it in ds)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_dataloader_workers_see_each_record_once(exported):
    tmp, want, m = exported
    ds = WdsPairsDataset(tmp / "wds", shuffle_buffer=3)
    for workers in (2, len(m["shards"]) + 1):  # shard split, then record split
        loader = torch.utils.data.DataLoader(
            ds,
            batch_size=3,
            num_workers=workers,
            collate_fn=collate_pairs,
            multiprocessing_context="fork",
        )
        idx = [int(i) for b in loader for i in b["index"]]
        assert sorted(idx) == list(range(len(want))), workers


def test_fixed_shapes_pad_with_zeros(tmp_path):
    want = make_store(tmp_path / "run", n=4, fmt="zarr")
    m = swds.export_wds(tmp_path / "run", tmp_path / "wds", fixed_shapes=True)
    assert m["fixed_shapes"] and m["samples_jsonl"] is None
    recs = list(swds.iter_wds_records(str(tmp_path / "wds" / m["shards"][0]["file"])))
    for rec, (_acts, sm) in zip(recs, want.values()):
        pa = swds.decode_npy(rec["prompt_acts.npy"])
        assert pa.shape == (L, m["P_max"], H)
        assert not pa[:, sm.prompt_len :].any()
    ref = ActivationPairsDataset(open_store(tmp_path / "run"))
    for it in WdsPairsDataset(tmp_path / "wds", shuffle_buffer=0):
        assert torch.equal(it["acts"], ref[int(it["index"])]["acts"])


def test_texts_from_jsonl_and_errors(tmp_path):
    want = make_store(tmp_path / "run", n=3)
    p = tmp_path / "texts.jsonl"
    p.write_text(
        "".join(
            json.dumps({"activation_key": k, "prompt": "p", "response": "r"}) + "\n" for k in want
        )
    )
    swds.export_wds(tmp_path / "run", tmp_path / "wds", texts=p)
    assert json.loads(open(tmp_path / "wds" / "samples.jsonl").readline())["response"] == "r"
    p.write_text("{bad\n")
    with pytest.raises(ManifestError, match="texts.jsonl:1"):
        swds.export_wds(tmp_path / "run", tmp_path / "wds2", texts=p)
    with pytest.raises(ManifestError, match="manifest.json"):
        WdsPairsDataset(tmp_path / "nothing")
    with pytest.raises(CorruptShardError, match="object-dtype"):
        buf = io.BytesIO()
        np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        swds.decode_npy(buf.getvalue(), "x.npy")


def test_doc_tables_match_code():
    t = tables("wds.md")
    assert list(t["manifest.json"]) == list(swds.MANIFEST_FIELDS)
    assert list(t["shards[]"]) == list(swds.SHARD_FIELDS)
    assert list(t["record members"]) == list(swds.RECORD_MEMBERS)
    assert list(t["meta.json"]) == list(swds.META_FIELDS)
    assert list(t["samples.jsonl"]) == list(swds.TEXT_FIELDS)
