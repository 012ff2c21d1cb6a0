"""The coalescing reader (storage/_ranged.py): the same bytes as a plain read, whatever the plan."""

from __future__ import annotations

import numpy as np
import pytest
from hallulog.storage import (
    ActivationPairsDataset,
    SampleMeta,
    convert_store,
    open_store,
    open_writer,
)
from hallulog.storage._ranged import (
    LocalFiles,
    ReadPolicy,
    is_remote,
    plan_ranges,
    policy_for,
    read_extents,
)
from hallulog.storage.errors import CorruptShardError

L, H = 6, 32
REMOTE = ReadPolicy(concurrency=8, gap=64 << 10, inline_below=0)


def _store(tmp_path, fmt="packed", n=20, seed=0):
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 40, n)  # zero-token samples included
    w = open_writer("packed", tmp_path / "packed", layer_ids=list(range(L)), hidden_size=H)
    want = {}
    for i, t in enumerate(lens):
        acts = rng.standard_normal((L, int(t), H)).astype(np.float16)
        w.write(f"k{i}", acts, SampleMeta(int(t) // 2, int(t) - int(t) // 2, i % 2))
        want[i] = acts
        if i % 5 == 4:
            w.commit()
    w.close()
    if fmt != "packed":
        convert_store(tmp_path / "packed", tmp_path / fmt, fmt)
    return open_store(tmp_path / fmt), want


def _pairs(n, count, seed=1):
    rng = np.random.default_rng(seed)
    samples = rng.integers(0, n, count).tolist()
    layers = rng.integers(0, L, count).tolist()
    # every layer of one sample in order (touching extents: one merged range), and a repeat
    samples += [3] * L + [5, 5]
    layers += list(range(L)) + [2, 2]
    return samples, layers


def test_plan_merges_touching_and_near_extents_only():
    sizes = [100, 100, 100, 50, 10]
    jobs = [(0, 300, 1), (0, 0, 0), (0, 500, 2), (1, 0, 3), (0, 100, 4)]
    # gap 0: 0..100 and 100..110 touch; 300 and 500 stand alone; file 1 apart
    assert plan_ranges(jobs, sizes, gap=0, max_range=1 << 20) == [
        (0, 0, [(0, 0), (4, 0)]),
        (0, 300, [(1, 0)]),
        (0, 500, [(2, 0)]),
        (1, 0, [(3, 0)]),
    ]
    # gap 200: 110..300 (190 bytes) and 400..500 (100 bytes) are read and dropped
    assert plan_ranges(jobs, sizes, gap=200, max_range=1 << 20) == [
        (0, 0, [(0, 0), (4, 0), (-1, 190), (1, 0), (-1, 100), (2, 0)]),
        (1, 0, [(3, 0)]),
    ]
    # max_range cuts a run of neighbours
    assert [r[1] for r in plan_ranges(jobs, sizes, gap=200, max_range=400)] == [0, 500, 0]
    # the same extent twice: two ranges, never a negative gap
    assert plan_ranges([(0, 0, 0), (0, 0, 1)], [8, 8], gap=64, max_range=1 << 20) == [
        (0, 0, [(0, 0)]),
        (0, 0, [(1, 0)]),
    ]


@pytest.mark.parametrize("fmt", ["packed", "npy"])
def test_coalesced_concurrent_reads_equal_plain_reads(tmp_path, fmt):
    r, want = _store(tmp_path, fmt)
    samples, layers = _pairs(len(r), 60)
    plain = [want[s][l] for s, l in zip(samples, layers)]
    for policy in (
        REMOTE,
        ReadPolicy(concurrency=3, gap=0, inline_below=0),
        ReadPolicy(concurrency=1, gap=1 << 20, inline_below=0),
        policy_for(False),
    ):
        r._policy = policy
        got = r.read_pairs(samples, layers)
        assert len(got) == len(plain)
        for g, p in zip(got, plain):
            assert g.shape == p.shape and g.tobytes() == p.tobytes()
    r.close()


def test_dataset_batches_equal_under_both_policies(tmp_path):
    r, _ = _store(tmp_path)
    batches = []
    for policy in (policy_for(False), REMOTE):
        ds = ActivationPairsDataset(open_store(r.path), seed=4)
        ds.reader._policy = policy
        batches.append(ds.__getitems__(list(range(len(ds)))).collated["acts"].numpy().copy())
    assert batches[0].tobytes() == batches[1].tobytes()


def test_local_files_scatter_read_and_truncation(tmp_path):
    path = tmp_path / "f.bin"
    data = np.arange(1000, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    src = LocalFiles(lambda k: str(path))
    a, gap, b = np.empty(10, np.uint8), np.empty(5, np.uint8), np.empty(0, np.uint8)
    c = np.empty(20, np.uint8)
    src.read_into(0, 100, [memoryview(a), memoryview(gap), memoryview(b), memoryview(c)])
    assert a.tolist() == list(range(100, 110)) and c.tolist() == list(range(115, 135))
    with pytest.raises(CorruptShardError, match="truncated.*f.bin|f.bin.*truncated"):
        src.read_into(0, 990, [memoryview(np.empty(20, np.uint8))])
    src.close()
    with pytest.raises(CorruptShardError, match="missing"):
        LocalFiles(lambda k: str(tmp_path / "nope")).read_into(0, 0, [memoryview(a)])


class FileObjectSource:
    """A second range source (buffered file objects, one ``readinto`` per buffer): what an
    object store's ranged GET plugs in as. Counts its calls."""

    remote = True

    def __init__(self, path_of):
        self.path_of, self.calls = path_of, 0

    def read_into(self, file_no, offset, buffers):
        self.calls += 1
        with open(self.path_of(file_no), "rb") as f:
            f.seek(offset)
            for b in buffers:
                if len(b) and f.readinto(b) != len(b):
                    raise CorruptShardError("short read", self.path_of(file_no))

    def close(self):
        pass


def test_another_range_source_plugs_in(tmp_path):
    r, want = _store(tmp_path)
    src = FileObjectSource(r._file_path)
    r.set_range_source(src)
    assert r.read_policy.concurrency == policy_for(True).concurrency
    samples, layers = _pairs(len(r), 30)
    got = r.read_pairs(samples, layers)
    assert all(g.tobytes() == want[s][l].tobytes() for g, s, l in zip(got, samples, layers))
    # the L touching extents of sample 3 were one call, not L
    assert 0 < src.calls < len(samples)
    r.verify()  # checksums read through the same source


def test_read_extents_reports_the_first_error_after_every_read_ended(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"x" * 100)
    outs = [np.empty(40, np.uint8) for _ in range(4)]
    jobs = [(0, 0, 0), (0, 200, 1), (0, 50, 2), (0, 400, 3)]
    with pytest.raises(CorruptShardError, match="short.bin"):
        read_extents(
            LocalFiles(lambda k: str(path), remote=True),
            jobs,
            outs,
            REMOTE,
            lambda: __import__("concurrent.futures").futures.ThreadPoolExecutor(4),
        )
    assert outs[0].tobytes() == b"x" * 40


def test_is_remote_by_mount_type(tmp_path):
    assert is_remote(str(tmp_path)) is False  # the test's tmp dir: a local disk or tmpfs
    assert is_remote("/proc/self") is False


def test_environment_overrides_the_policy(monkeypatch):
    monkeypatch.setenv("HALLULOG_READ_CONCURRENCY", "5")
    monkeypatch.setenv("HALLULOG_READ_GAP_BYTES", "4096")
    p = policy_for(False)
    assert (p.concurrency, p.gap) == (5, 4096)
    monkeypatch.setenv("HALLULOG_READ_CONCURRENCY", "many")
    with pytest.raises(ValueError, match="HALLULOG_READ_CONCURRENCY"):
        policy_for(True)
