"""Packed SFT export (seed 004): writer, FFD packer, loss-mask roll, readers, legacy converter."""

import json
import os
import tracemalloc

import numpy as np
import pytest
import torch
from hallulog.exports import sft_packed as sp
from hallulog.storage import ManifestError, StorageError

from tests.storage.test_storage_docs import tables


def make_consolidated(d, n_prompts=12, k=2, seed=0):
    """prompt_index.jsonl + generations.jsonl as consolidation writes them (the fields used)."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    seqs = {}
    with open(d / "prompt_index.jsonl", "w") as fp, open(d / "generations.jsonl", "w") as fg:
        for p in range(n_prompts):
            pid = f"{p:016x}"
            ptoks = rng.integers(1, 1000, int(rng.integers(2, 9))).tolist()
            label = [0, 1, None][p % 3]
            fp.write(
                json.dumps(
                    {"prompt_id": pid, "prompt_token_ids": ptoks, "label": label, "prompt": "q"}
                )
                + "\n"
            )
            for s in range(k + 1):
                rtoks = rng.integers(1000, 2000, int(rng.integers(1, 12))).tolist()
                glabel = None if s == 0 else int(rng.integers(0, 2))
                fg.write(
                    json.dumps(
                        {
                            "prompt_id": pid,
                            "sample_id": s,
                            "token_ids": rtoks,
                            "label": glabel,
                            "text": "a",
                        }
                    )
                    + "\n"
                )
                seqs[(pid, s)] = (ptoks, rtoks, label if s == 0 else glabel)
    return seqs


def test_export_round_trip_and_roll(tmp_path):
    seqs = make_consolidated(tmp_path / "consolidated")
    summary = sp.export_sft(
        tmp_path / "consolidated",
        tmp_path / "sft",
        pack_size=24,
        select="correct",
        bins_per_shard=3,
    )
    chosen = {k: v for k, v in seqs.items() if v[2] == 0}
    assert summary["num_sequences"] == len(chosen) and len(summary["shards"]) > 1
    assert set(summary) == set(sp.EXPORT_FIELDS)
    placed = [json.loads(l) for l in open(tmp_path / "sft" / "sequences.jsonl")]
    assert {(r["prompt_id"], r["sample_id"]) for r in placed} == set(chosen)
    assert set(placed[0]) == set(sp.SEQUENCE_FIELDS)
    ds = sp.open_packed_sft(tmp_path / "sft")
    assert len(ds) == summary["num_bins"]
    offsets = dict(zip(summary["shards"], ds.shard_offsets))
    for r in placed:
        item = ds[int(offsets[r["shard"]]) + r["bin"]]
        ptoks, rtoks, _ = chosen[(r["prompt_id"], r["sample_id"])]
        full = np.array(ptoks + rtoks)[: r["length"]]
        a, b = r["start"], r["start"] + r["length"]
        np.testing.assert_array_equal(item["input_ids"][a:b], full)
        assert r["start"] in item["seq_boundaries"] and item["seq_boundaries"][-1] == len(
            item["input_ids"]
        )
        # §1.2: unrolled mask is 0 on prompt tokens, 1 on response tokens; stored = rolled right by one
        mask = np.r_[np.zeros(len(ptoks)), np.ones(len(rtoks))][: r["length"]]
        np.testing.assert_array_equal(item["loss_mask"][a + 1 : b], mask[:-1])
    for i in range(len(ds)):
        assert ds[i]["loss_mask"][0] == 0
    for shard in summary["shards"]:
        man = json.load(open(tmp_path / "sft" / shard / "manifest.json"))
        assert (
            set(man) == set(sp.MANIFEST_FIELDS)
            and man["dtype"] == "<i4"
            and man["index_dtype"] == "<u4"
        )
        for name, dt in sp.ARRAYS.items():
            assert np.load(tmp_path / "sft" / shard / f"{name}.npy", mmap_mode="r").dtype.str == dt
    assert not [f for _, _, fs in os.walk(tmp_path / "sft") for f in fs if f.endswith(".tmp")]


def test_selection_rules(tmp_path):
    seqs = make_consolidated(tmp_path / "c", n_prompts=9)
    for select, rule in [
        ("correct_primary", lambda k, v: k[1] == 0 and v[2] == 0),
        ("primary", lambda k, v: k[1] == 0),
        ("all", lambda k, v: True),
    ]:
        s = sp.export_sft(tmp_path / "c", tmp_path / select, pack_size=32, select=select)
        assert s["num_sequences"] == sum(rule(k, v) for k, v in seqs.items()), select


def test_truncation_and_ffd():
    bins = sp.first_fit_decreasing([5, 9, 3, 7, 2, 20], 10)
    assert bins == [[5], [1], [3, 2], [0, 4]]
    ids = {0: np.arange(1, 16)}
    buf, mask = np.zeros(10, np.int32), np.zeros(10, np.uint8)
    n, starts = sp.materialize_bin_arrays(
        lambda k: (ids[k], np.ones(15, np.uint8)), [0], 10, buf, mask
    )
    assert (
        n == 10
        and list(starts) == [0]
        and list(buf) == list(range(1, 11))
        and mask[0] == 0
        and mask[1:].all()
    )


def test_memmap_writer_roundtrip(tmp_path):  # seed 004 "Unit Tests"
    w = sp.MemmapShardWriter(tmp_path, num_bins=3, pack_size=10, total_seq_starts=6)
    data = [
        ([1, 2, 3], [0, 1, 1], [0]),
        ([4, 5, 6, 7], [0, 0, 1, 1], [0, 2]),
        ([8, 9], [0, 1], [0, 1, 2]),
    ]
    for i, (a, m, s) in enumerate(data):
        w.write_bin(i, np.array(a), np.array(m), np.array(s))
    man = w.finalize()
    assert man["format"] == "memmap_padded_v1" and man["bins_written"] == 3
    ds = sp.PackedSftDataset(tmp_path)
    for i, (a, m, s) in enumerate(data):
        assert ds[i]["input_ids"].tolist() == a and ds[i]["loss_mask"].tolist() == m
        assert ds[i]["seq_boundaries"] == s + [len(a)]
    with pytest.raises(StorageError, match="not finalizing"):
        sp.MemmapShardWriter(tmp_path / "x", 2, 4, 2).finalize()


def _peak_write(d, num_bins, pack_size=256):
    tracemalloc.start()
    w = sp.MemmapShardWriter(
        d, num_bins=num_bins, pack_size=pack_size, total_seq_starts=4 * num_bins
    )
    ids, mask, starts = (
        np.arange(250, dtype=np.int32),
        np.ones(250, np.uint8),
        np.array([0, 50, 100, 200], np.uint32),
    )
    for i in range(num_bins):
        w.write_bin(i, ids, mask, starts)
    w.finalize()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_peak_memory_flat_in_number_of_bins(tmp_path):
    small = _peak_write(tmp_path / "a", 200)
    big = _peak_write(tmp_path / "b", 4000)  # ~5 MB of arrays on disk
    assert big < small + 256 * 1024 and big < 2 * 1024 * 1024, (small, big)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_dataloader_four_workers_sees_every_bin_once(tmp_path):
    w = sp.MemmapShardWriter(tmp_path, num_bins=100, pack_size=64, total_seq_starts=200)
    for i in range(100):
        w.write_bin(
            i,
            np.arange(i, i + 50, dtype=np.int32),
            np.ones(50, np.uint8),
            np.array([0, 25], np.uint32),
        )
    w.finalize()
    ds = sp.PackedSftDataset(tmp_path)
    ds[0]  # opens the memmaps in the parent: pickling to the workers must drop them
    assert "input_ids" not in ds.__getstate__()
    loader = torch.utils.data.DataLoader(
        ds, batch_size=8, num_workers=4, persistent_workers=True, multiprocessing_context="fork"
    )
    firsts = [int(x) for b in loader for x in b["input_ids"][:, 0]]
    assert sorted(firsts) == list(range(100))
    batch = sp.collate_packed_sft([ds[1], ds[2]])
    assert batch["input_ids"].shape == (2, 50) and batch["attention_mask"].all()


def test_multi_shard_offsets(tmp_path):
    for k, nb in enumerate([3, 1, 4]):
        w = sp.MemmapShardWriter(tmp_path / f"shard_{k:06d}", nb, 4, nb)
        for i in range(nb):
            w.write_bin(i, np.array([k, i]), np.array([0, 1]), np.array([0]))
        w.finalize()
    ds = sp.open_packed_sft(tmp_path)
    assert len(ds) == 8 and list(ds.shard_offsets) == [0, 3, 4, 8]
    assert [ds[i]["input_ids"].tolist() for i in range(8)] == [
        [0, 0],
        [0, 1],
        [0, 2],
        [1, 0],
        [2, 0],
        [2, 1],
        [2, 2],
        [2, 3],
    ]
    assert ds[-1]["input_ids"].tolist() == [2, 3]


def test_legacy_pickle_converter(tmp_path):
    legacy = [
        {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "seq_start_id": [0]},
        {"input_ids": [4, 5], "loss_mask": [0, 1], "seq_start_id": [0, 1]},
    ]
    path = tmp_path / "legacy.npy"
    np.save(path, np.array(legacy, dtype=object), allow_pickle=True)
    man = sp.convert_legacy_to_memmap(path, tmp_path / "out")
    assert man["pack_size"] == 3 and man["num_bins"] == 2
    ds = sp.PackedSftDataset(tmp_path / "out")
    assert [ds[i]["input_ids"].tolist() for i in range(2)] == [[1, 2, 3], [4, 5]]
    assert ds[1]["seq_boundaries"] == [0, 1, 2]
    # the reader never unpickles: a pickled array in a shard is an error, not code execution
    np.save(
        tmp_path / "out" / "seq_starts.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True
    )
    with pytest.raises((ValueError, ManifestError)):
        sp.PackedSftDataset(tmp_path / "out")[0]


def test_bad_input_names_file_and_line(tmp_path):
    make_consolidated(tmp_path / "c", n_prompts=2)
    with open(tmp_path / "c" / "generations.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(ManifestError, match=r"generations.jsonl:7"):
        sp.export_sft(tmp_path / "c", tmp_path / "o")
    with pytest.raises(ManifestError, match="manifest.json"):
        sp.PackedSftDataset(tmp_path / "nothing")


def test_doc_tables_match_code():
    t = tables("sft-packed.md")
    assert {k: v[0] for k, v in t["arrays"].items()} == sp.ARRAYS
    assert list(t["manifest.json"]) == list(sp.MANIFEST_FIELDS)
    assert list(t["export.json"]) == list(sp.EXPORT_FIELDS)
    assert list(t["sequences.jsonl"]) == list(sp.SEQUENCE_FIELDS)
