"""Slow lane: the packed store read through a real FUSE mount with latency (bench/latency_fs.py).

The mount is a network file system to the reader (``is_remote``), so batches are read with many
ranges in flight; the bytes must equal the local store's, and the latency must overlap.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from hallulog.storage import ActivationPairsDataset, SampleMeta, open_store, open_writer
from hallulog.storage._ranged import ReadPolicy, is_remote

from bench import latency_fs

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


@pytest.fixture
def mount(tmp_path):
    why = latency_fs.fuse_available()
    if why is not None:
        pytest.skip(why if "install" in why else f"{why} ({latency_fs.INSTALL})")
    back = tmp_path / "back"
    back.mkdir()
    rng = np.random.default_rng(0)
    w = open_writer("packed", back / "packed", layer_ids=list(range(8)), hidden_size=2048)
    for i in range(24):
        t = int(rng.integers(16, 64))  # 64-256 KiB per extent: no readahead spans two
        w.write(
            f"k{i}",
            rng.standard_normal((8, t, 2048)).astype(np.float16),
            SampleMeta(t // 2, t - t // 2, i % 2),
        )
    w.close()
    with latency_fs.mounted(back, tmp_path / "mnt", latency_ms=20) as mnt:
        yield back / "packed", mnt / "packed"


def _drop_cache(path: Path) -> None:
    for f in path.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_reads_through_a_latency_mount_equal_local_and_overlap(mount):
    local_path, remote_path = mount
    assert is_remote(str(remote_path)) and not is_remote(str(local_path))
    local = ActivationPairsDataset(open_store(local_path), seed=3)
    remote = ActivationPairsDataset(open_store(remote_path), seed=3)
    assert remote.reader.read_policy.concurrency > 1
    idx = list(range(len(local)))
    want = local.__getitems__(idx).collated["acts"].numpy().copy()
    _drop_cache(remote_path)
    t0 = time.perf_counter()
    got = remote.__getitems__(idx).collated["acts"].numpy().copy()
    concurrent_s = time.perf_counter() - t0
    assert got.tobytes() == want.tobytes()
    # the same batch one range at a time: 48 extents, each at least one 20 ms read
    remote.reader.close()
    remote.reader._policy = ReadPolicy(concurrency=1, gap=0, inline_below=0)
    _drop_cache(remote_path)
    t0 = time.perf_counter()
    serial = remote.__getitems__(idx).collated["acts"].numpy().copy()
    serial_s = time.perf_counter() - t0
    assert serial.tobytes() == want.tobytes()
    assert serial_s >= 48 * 0.02
    assert concurrent_s < serial_s / 3, (concurrent_s, serial_s)
