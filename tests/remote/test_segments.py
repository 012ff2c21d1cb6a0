"""Segments of a worker directory in a real S3 server (moto, its own process on loopback): a
restore keeps what the disk already holds, a fence stops an earlier writer, pieces without their
manifest (a node lost mid-upload) are ignored, npy activation files travel whole."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.s3_server import MotoServer


@pytest.fixture(scope="module")
def s3():
    with MotoServer() as server:
        yield server


@pytest.fixture
def bucket(s3, monkeypatch, tmp_path, request):
    from hallulog.remote.client import Bucket

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    name = request.node.name.replace("_", "-")[:50].strip("-").lower()
    s3.create_bucket(name, versioned=True)
    return Bucket(f"s3://{name}/run")


def _group(pid: str):
    from hallulog.workers.persist import GenerationRecord

    gens = [
        GenerationRecord(
            row={"prompt_id": pid, "sample_id": sid, "text": "x" * 40},
            acts=np.full((2, 3 + sid, 4), sid + 1, dtype="float16"),
            prompt_rows=1,
            response_rows=2 + sid,
            label=1,
            activation_row={"prompt_id": pid, "sample_id": sid, "activation_key": f"{pid}_{sid}"},
        )
        for sid in range(2)
    ]
    return {"prompt_id": pid, "prompt": "q?"}, gens


def _writer(root, fmt="packed"):
    from hallulog.workers.persist import WorkerDir

    return WorkerDir(
        root / "worker_0",
        worker_id=0,
        storage_format=fmt,
        layer_ids=[0, 1],
        hidden_size=4,
        dtype="float16",
    )


def _recover(root, fmt="packed") -> set[str]:
    from hallulog.workers.persist import recover_worker_dir

    return recover_worker_dir(
        root / "worker_0", storage_format=fmt, layer_ids=[0, 1], hidden_size=4, dtype="float16"
    )


def _files(wdir) -> dict[str, bytes]:
    return {
        str(p.relative_to(wdir)): p.read_bytes()
        for p in sorted(wdir.rglob("*"))
        if p.is_file() and p.name not in ("writer.lock", "manifest.json") and p.stat().st_size
    }


def _chain_ids(bucket, worker: str = "worker_0") -> set[str]:
    from hallulog.remote.epochs import EpochRule
    from hallulog.remote.restore import chain_prompt_ids, read_chain, segment_chains

    by_seq = segment_chains(bucket, worker)[worker]
    return chain_prompt_ids(read_chain(bucket, worker, by_seq, EpochRule.read(bucket))[0])


def _versions(s3, bucket) -> set[int]:
    from collections import Counter

    pages = s3.client().get_paginator("list_object_versions").paginate(Bucket=bucket.bucket)
    return set(Counter(v["Key"] for p in pages for v in p.get("Versions", [])).values())


def test_a_restore_keeps_the_bytes_on_disk_and_drops_the_unshipped_tail(tmp_path, bucket, caplog):
    from hallulog.remote.restore import restore_staging
    from hallulog.remote.shipper import SegmentShipper

    root = tmp_path / "stage"
    wd = _writer(root)
    wd.persist_group(*_group("p1"))
    wd.persist_group(*_group("p2"))
    assert SegmentShipper(root, bucket, {}, interval=60).ship() == 1
    shipped = _files(root / "worker_0")
    wd.persist_group(*_group("p3"))  # committed here, never shipped: the bucket is the truth
    wd.close()

    caplog.set_level(logging.INFO, logger="hallulog.remote.restore")
    states = restore_staging(root, bucket)
    assert "0 piece(s), 0 bytes downloaded" in caplog.text  # the same node: its own disk
    assert states["worker_0"].seq == 1
    assert _files(root / "worker_0") == shipped
    assert _recover(root) == {"p1", "p2"}

    shard = next((root / "worker_0" / "activations").glob("shard_*.bin"))
    data = bytearray(shard.read_bytes())
    data[5] ^= 0xFF  # a byte the disk lost: that piece comes from the bucket again
    shard.write_bytes(bytes(data))
    caplog.clear()
    restore_staging(root, bucket)
    assert "0 piece(s)" not in caplog.text
    assert _files(root / "worker_0") == shipped


def test_a_fence_stops_the_earlier_writer_and_the_chain_continues_after_it(tmp_path, bucket, s3):
    from hallulog.remote.client import ObjectExistsError
    from hallulog.remote.restore import fence_chain, restore_staging
    from hallulog.remote.shipper import SegmentShipper

    old = tmp_path / "cut-off-node"
    wd = _writer(old)
    wd.persist_group(*_group("p1"))
    shipper = SegmentShipper(old, bucket, {}, interval=60)
    shipper.ship()
    assert fence_chain(bucket, "worker_0", "test", 0) == 1
    assert _chain_ids(bucket) == {"p1"}
    wd.persist_group(*_group("p2"))  # the writer that was given up goes on...
    with pytest.raises(ObjectExistsError, match="another writer of worker_0"):
        shipper.ship()  # ...but cannot ship after the fence
    wd.close()

    new = tmp_path / "new-node"
    states = restore_staging(new, bucket)
    assert states["worker_0"].seq == 2 and _recover(new) == {"p1"}
    wd = _writer(new)
    wd.persist_group(*_group("p3"))
    SegmentShipper(new, bucket, states, interval=60).ship()
    wd.close()
    assert fence_chain(bucket, "worker_0", "test", 0) == 3
    assert _chain_ids(bucket) == {"p1", "p3"}
    third = tmp_path / "third"
    restore_staging(third, bucket)
    assert _recover(third) == {"p1", "p3"}
    assert _versions(s3, bucket) == {1}  # every key written once, the fences included


def test_pieces_without_their_manifest_are_ignored(tmp_path, bucket):
    """A node lost mid-upload: the pieces of its unsealed segment are there, its manifest is
    not; the segment does not exist, and the next writer takes its number."""
    from hallulog.remote.restore import restore_staging
    from hallulog.remote.segments import advance
    from hallulog.remote.shipper import SegmentShipper

    root = tmp_path / "lost"
    wd = _writer(root)
    wd.persist_group(*_group("p1"))
    shipper = SegmentShipper(root, bucket, {}, interval=60)
    shipper.ship()
    wd.persist_group(*_group("p2"))
    wd.close()
    st = shipper.states["worker_0"]
    _, grown, _, ids = advance(root / "worker_0", st)
    assert ids == ["p2"]
    for rel, end in grown.items():  # the pieces land, the node goes before the manifest
        shipper._ship_piece(root / "worker_0", "worker_0", st.seq, rel, st.ends.get(rel, 0), end)

    new = tmp_path / "new"
    states = restore_staging(new, bucket)
    assert states["worker_0"].seq == 1 and _recover(new) == {"p1"}
    wd = _writer(new)
    wd.persist_group(*_group("p4"))
    assert SegmentShipper(new, bucket, states, interval=60).ship() == 1
    wd.close()
    third = tmp_path / "third"
    restore_staging(third, bucket)
    assert _recover(third) == {"p1", "p4"}


def test_npy_activation_files_travel_whole(tmp_path, bucket):
    from hallulog.remote.restore import restore_staging
    from hallulog.remote.shipper import SegmentShipper

    from hallulog import storage

    root = tmp_path / "stage"
    wd = _writer(root, "npy")
    wd.persist_group(*_group("p1"))
    shipper = SegmentShipper(root, bucket, {}, interval=60)
    shipper.ship()
    wd.persist_group(*_group("p2"))
    shipper.ship()
    wd.close()
    keys = [k for k in bucket.list(".hallulog-run/") if ".npy.whole-" in k]
    assert len(keys) == 4  # one object per activation file, once

    new = tmp_path / "new"
    restore_staging(new, bucket)
    assert _files(new / "worker_0") == _files(root / "worker_0")
    assert _recover(new, "npy") == {"p1", "p2"}
    reader = storage.open_store(new / "worker_0")
    assert sorted(reader.keys()) == ["p1_0", "p1_1", "p2_0", "p2_1"]
    np.testing.assert_array_equal(reader.read(reader.keys().index("p2_1"), 1), np.full((4, 4), 2))


def test_zarr_chunks_and_metadata_travel_and_restore(tmp_path, bucket):
    """A zarr store: each committed sample's chunk files once, the array's metadata again when
    zarr rewrote it (more samples, longer ones); the restored store reads the same."""
    from hallulog.remote.restore import restore_staging
    from hallulog.remote.shipper import SegmentShipper
    from hallulog.workers.persist import GenerationRecord

    from hallulog import storage

    root = tmp_path / "stage"
    wd = _writer(root, "zarr")
    shipper = SegmentShipper(root, bucket, {}, interval=60)
    expected = {}
    for n, t in enumerate([3, 5, 40, 2, 1500]):  # 1500 tokens: past the first T chunk
        pid = f"p{n}"
        acts = np.arange(2 * t * 4, dtype="float16").reshape(2, t, 4) + n
        gen = GenerationRecord(
            row={"prompt_id": pid, "sample_id": 0, "text": "x"},
            acts=acts,
            prompt_rows=1,
            response_rows=t - 1,
            label=1,
            activation_row={"prompt_id": pid, "sample_id": 0, "activation_key": f"{pid}_0"},
        )
        wd.persist_group({"prompt_id": pid, "prompt": "q?"}, [gen])
        expected[f"{pid}_0"] = acts
        shipper.ship()
    wd.close()
    metadata = [
        k for k in bucket.list(".hallulog-run/") if k.rsplit("/", 1)[1].startswith(".zarray")
    ]
    assert len(metadata) >= 2  # shipped again after zarr resized the array

    new = tmp_path / "new"
    restore_staging(new, bucket)
    assert _recover(new, "zarr") == set(f"p{n}" for n in range(5))
    reader = storage.open_store(new / "worker_0")
    assert sorted(reader.keys()) == sorted(expected)
    for key, acts in expected.items():
        i = reader.keys().index(key)
        for layer in range(2):
            np.testing.assert_array_equal(reader.read(i, layer), acts[layer])
