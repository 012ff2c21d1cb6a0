"""Stores read straight from a bucket (a real S3 server: moto), against the same store on disk:
packed (ranged GETs through the coalescing planner), multi (consolidated/), zarr (zarr's
ObjectStore), the PyTorch dataset in DataLoader workers; damaged objects name their URL."""

from __future__ import annotations

import numpy as np
import pytest
from hallulog.remote.bucket_store import BucketPackedReader
from hallulog.remote.client import Bucket
from hallulog.remote.sync import scan_tree, upload_tree
from hallulog.storage import SampleMeta, open_store, open_writer, write_multi_manifest
from hallulog.storage.errors import CorruptShardError, UnknownFormatError

from tests.s3_server import MotoServer


@pytest.fixture(scope="module")
def s3():
    with MotoServer() as server:
        server.create_bucket("reads")
        yield server


@pytest.fixture
def s3env(s3, monkeypatch, tmp_path):
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HALLULOG_CACHE_DIR", str(tmp_path / "cache"))
    return s3


def _write(root, fmt, n, seed, **options):
    w = open_writer(fmt, root, layer_ids=[0, 4, 8], hidden_size=32, **options)
    rng = np.random.default_rng(seed)
    for i in range(n):
        t = 3 + (i * 7) % 29
        w.write(
            f"s{seed}_{i:03d}",
            rng.standard_normal((3, t, 32)).astype(np.float16),
            SampleMeta(prompt_len=1, response_len=t - 1, label=i % 2),
        )
    w.close()


@pytest.fixture
def uploaded(tmp_path, s3env, request):
    """Two packed worker stores (small shards: several objects each), a multi manifest over
    them and a zarr store, uploaded under a fresh prefix; returns (local root, URL)."""
    root = tmp_path / "root"
    _write(root / "worker_0", "packed", 23, 0, shard_bytes=20_000)
    _write(root / "worker_1", "packed", 9, 1, shard_bytes=20_000)
    write_multi_manifest(
        root / "consolidated" / "activations",
        [root / "worker_0" / "activations", root / "worker_1" / "activations"],
    )
    _write(root / "zarr_worker", "zarr", 7, 2)
    url = f"s3://reads/{request.node.name}"
    upload_tree(root, Bucket(url), scan_tree(root))
    return root, url


def _same(a, b):
    assert len(a) == len(b) and a.layer_ids == b.layer_ids and a.keys() == b.keys()
    rng = np.random.default_rng(5)
    samples = rng.integers(0, len(a), 40)
    layers = rng.integers(0, a.num_layers, 40)
    for x, y in zip(a.read_pairs(samples, layers), b.read_pairs(samples, layers)):
        assert np.array_equal(x, y)
    assert np.array_equal(a.read(len(a) - 1, 2), b.read(len(b) - 1, 2))
    assert [a.meta(i) for i in range(len(a))] == [b.meta(i) for i in range(len(b))]


def test_packed_multi_and_zarr_read_from_the_bucket(uploaded):
    root, url = uploaded
    remote = open_store(f"{url}/worker_0")
    assert isinstance(remote, BucketPackedReader) and len(remote.manifest["shards"]) > 2
    _same(remote, open_store(root / "worker_0"))
    remote.verify()  # every sample's checksum over bytes read from the bucket
    _same(open_store(f"{url}/consolidated"), open_store(root / "consolidated"))
    _same(open_store(f"{url}/zarr_worker"), open_store(root / "zarr_worker"))


@pytest.mark.e2e  # spawned workers import torch: seconds each
def test_dataset_reads_the_bucket_in_dataloader_workers(uploaded):
    import torch
    from hallulog.storage import ActivationPairsDataset, collate_pairs

    root, url = uploaded
    remote = ActivationPairsDataset(f"{url}/consolidated", layers_per_sample=2, seed=3)
    local = ActivationPairsDataset(str(root / "consolidated"), layers_per_sample=2, seed=3)
    loader = torch.utils.data.DataLoader(
        remote,
        batch_size=8,
        num_workers=2,
        collate_fn=collate_pairs,
        multiprocessing_context="spawn",
    )
    want = torch.utils.data.DataLoader(local, batch_size=8, collate_fn=collate_pairs)
    n = 0
    for got, exp in zip(loader, want):
        assert torch.equal(got["acts"], exp["acts"]) and torch.equal(got["layers"], exp["layers"])
        n += len(got["index"])
    assert n == len(local) == 32


def test_damaged_objects_name_their_url(uploaded, s3env):
    root, url = uploaded
    shard = "worker_0/activations/shard_000001.bin"
    key = f"{url.removeprefix('s3://reads/')}/{shard}"
    s3env.client().put_object(Bucket="reads", Key=key, Body=b"short")
    with pytest.raises(CorruptShardError, match=f"{url}/{shard}.*manifest says"):
        open_store(f"{url}/worker_0")
    with pytest.raises(UnknownFormatError, match="no packed or zarr"):
        open_store(f"{url}/nothing-here")


def test_a_forked_child_gets_one_line_not_a_hang(uploaded):
    """obstore's runtime does not survive fork(): a forked child is told so at once."""
    import os

    _, url = uploaded
    reader = open_store(f"{url}/worker_0")
    reader.read(0, 0)  # the parent's client is running
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            reader.read(1, 0)
            msg = b"read"
        except Exception as exc:  # noqa: BLE001
            msg = str(exc).encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    msg = os.read(r, 4096).decode()
    assert "forked" in msg and "spawn" in msg and url in msg


@pytest.mark.e2e
def test_reads_survive_5xx_slow_and_dropped_responses(uploaded, s3env, monkeypatch):
    """Through a proxy that fails every 4th request with a 503, cuts every 5th GET body
    half-way and delays some: the bucket reader's reads still equal the disk's."""
    from tests.e2e.faulty_proxy import FaultyProxy

    root, url = uploaded
    count = {"n": 0, "get": 0}

    def fault(method, path, body):
        count["n"] += 1
        if count["n"] % 4 == 0:
            return "503"
        if method == "GET":
            count["get"] += 1
            if count["get"] % 5 == 0:
                return "drop"
            if count["get"] % 7 == 0:
                return ("slow", 0.3)
        return None

    with FaultyProxy(s3env.endpoint, fault=fault) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("HALLULOG_CACHE_DIR", str(root.parent / "cache-through-proxy"))
        _same(open_store(f"{url}/consolidated"), open_store(root / "consolidated"))
    assert {"503", "drop", "slow"} <= {k for k, _, _ in proxy.injected}
