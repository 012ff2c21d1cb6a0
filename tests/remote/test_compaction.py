"""Compaction and fencing of segment chains against a real S3 server (moto, its own process on
loopback), with real worker directories:

- a chain compacted every few segments holds a bounded number of objects and restores to the
  same bytes (packed and npy stores; small pieces packed, large ones left in place);
- a kill at every step of a compaction (before each of its writes and deletes) loses nothing:
  the chain restores to the committed prefix, and the next writer continues and compacts it;
- a stale writer's segment (an older lease epoch than a fence before it, or a chain its
  successor did not know) is never restored; the epoch rule itself;
- the root's ``labels.jsonl`` travels in its own chain, whole lines only.
"""

from __future__ import annotations

import pytest

from tests.remote.test_segments import _files, _group, _recover, _writer
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
    import hashlib

    tag = hashlib.sha256(request.node.name.encode()).hexdigest()[:8]
    name = request.node.name.replace("_", "-")[5:45].strip("-").lower() + "-" + tag
    s3.create_bucket(name)
    return Bucket(f"s3://{name}/run")


def _segments(bucket) -> list[str]:
    return [k for k in bucket.list(".hallulog-run/segments/")]


@pytest.mark.parametrize("fmt", ["packed", "npy"])
def test_a_compacted_chain_is_bounded_and_restores_the_same_bytes(
    tmp_path, bucket, monkeypatch, fmt
):
    from hallulog.remote import compact
    from hallulog.remote.restore import restore_staging
    from hallulog.remote.shipper import SegmentShipper

    monkeypatch.setattr(compact, "COMPACT_EVERY", 4)
    # an index piece of two groups (916 bytes) stays in place, every other piece is packed
    monkeypatch.setattr(compact, "PACK_BYTES", 900)
    root = tmp_path / "stage"
    wd = _writer(root, fmt)
    shipper = SegmentShipper(root, bucket, {}, interval=60)
    counts = []
    for i in range(10):
        wd.persist_group(*_group(f"p{i}"))
        if i % 2:
            wd.persist_group(*_group(f"q{i}"))  # some segments hold two groups: larger pieces
        assert shipper.ship() == 1
        if shipper.states["worker_0"].since_checkpoint == 0:  # compacted: the stated bound
            size = sum(len(data) for data in _files(root / "worker_0").values())
            assert len(_segments(bucket)) <= 2 * size / compact.PACK_BYTES + 2, i
        counts.append(len(_segments(bucket)))
    committed = _files(root / "worker_0")  # before close() writes the store's own index
    wd.close()
    shipper.stop()  # the last segments compacted too
    st = shipper.states["worker_0"]
    assert st.chain[0]["checkpoint"] and len(st.chain) == 1
    final = _segments(bucket)
    size = sum(len(data) for data in committed.values())
    assert len(final) <= 2 * size / compact.PACK_BYTES + 2, (len(final), size)
    assert len(final) < 10 * 6 / 2, (final, counts)  # uncompacted: 6 or more per segment
    assert [k for k in final if "/pack-" in k], final
    stays = [k for k in final if "/activation_index.jsonl." in k]
    assert len(stays) == (5 if fmt == "packed" else 0), final  # larger pieces stay in place

    new = tmp_path / "new"
    states = restore_staging(new, bucket)
    assert _files(new / "worker_0") == committed
    expected = {f"p{i}" for i in range(10)} | {f"q{i}" for i in range(1, 10, 2)}
    assert _recover(new, fmt) == expected
    assert states["worker_0"].seq == st.seq
    assert states["worker_0"].lines["prompt_index.jsonl"] == len(expected)


class _Killed(BaseException):
    """The process ends here (raised before the write or delete it stands for)."""


@pytest.mark.slow
def test_a_kill_at_any_step_of_a_compaction_loses_nothing(tmp_path, s3, monkeypatch):
    """Every write and delete of a compaction, in turn, is where the process dies: the chain
    still restores to the committed prefix, and the next writer continues and compacts it."""
    from hallulog.remote import compact
    from hallulog.remote.client import Bucket
    from hallulog.remote.restore import restore_staging
    from hallulog.remote.shipper import SegmentShipper

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(compact, "PACK_BYTES", 400)
    s3.create_bucket("kills")

    class Dying(Bucket):
        left: int | None = None

        def _step(self):
            if self.left is not None:
                if self.left == 0:
                    raise _Killed
                self.left -= 1

        def put_tagged(self, *args, **kwargs):
            self._step()
            return super().put_tagged(*args, **kwargs)

        def delete(self, key):
            self._step()
            return super().delete(key)

    root = tmp_path / "stage"
    wd = _writer(root)
    groups = [f"p{i}" for i in range(5)]
    for pid in groups:
        wd.persist_group(*_group(pid))
    committed = _files(root / "worker_0")  # before close() writes the store's own index
    wd.close()
    kill = 0
    while True:
        bucket = Dying(f"s3://kills/at-{kill}")
        shipper = SegmentShipper(root, bucket, {}, interval=60)
        before = len(_segments(bucket))
        assert before == 0
        for n in range(1, 6):  # 5 segments: ship what the directory holds, a prefix at a time
            _truncate_to_groups(root / "worker_0", tmp_path / "full", n)
            shipper.ship(compact_from=99)
        bucket.left = kill
        try:
            shipper.ship(compact_from=1)
            finished = True
        except _Killed:
            finished = False
        bucket.left = None
        new = tmp_path / f"new-{kill}"
        states = restore_staging(new, bucket)
        assert _files(new / "worker_0") == committed, kill
        assert _recover(new) == set(groups), kill
        # the next writer (a resumed run) continues the chain and compacts it
        again = SegmentShipper(new, Bucket(bucket.url), states, interval=60)
        again.ship(compact_from=1)
        third = tmp_path / f"third-{kill}"
        restore_staging(third, bucket)
        assert _files(third / "worker_0") == committed, kill
        if finished:
            break
        kill += 1
    assert kill >= 4  # packs, the checkpoint, and deletes were each a place to die


def _truncate_to_groups(wdir, full, n: int) -> None:
    """Make ``wdir`` its first ``n`` committed groups (a directory growing commit by commit),
    from a copy of the complete one kept in ``full``."""
    import shutil

    from hallulog.remote.segments import WorkerState, advance

    if not full.exists():
        shutil.copytree(wdir, full)
    shutil.rmtree(wdir)
    shutil.copytree(full, wdir)
    lines = (full / "prompt_index.jsonl").read_bytes().splitlines(keepends=True)
    (wdir / "prompt_index.jsonl").write_bytes(b"".join(lines[:n]))
    st, _, _, _ = advance(wdir, WorkerState("worker_0"))
    for rel, end in st.ends.items():  # what the first n commits cover, and nothing more
        with open(wdir / rel, "r+b") as f:
            f.truncate(end)


def test_a_stale_writers_segment_is_never_restored(tmp_path, bucket):
    """Writer A (epoch 1) ships; session B (epoch 2) fences every chain and records its epoch.
    A's next segment meets B's fence (412); a segment A starts in a chain B did not know lands,
    but is skipped by every restore; B's own chain goes on."""
    from hallulog.remote.client import ObjectExistsError
    from hallulog.remote.epochs import EpochRule
    from hallulog.remote.restore import fence_session, restore_staging
    from hallulog.remote.shipper import SegmentShipper

    old = tmp_path / "paused-holder"
    wd = _writer(old)
    wd.persist_group(*_group("p1"))
    a = SegmentShipper(old, bucket, {}, interval=60, epoch=1)
    a.ship()
    fences = fence_session(bucket, 2, "run", ["worker_0"])
    assert fences == {"_root": 0, "worker_0": 1}
    wd.persist_group(*_group("p2"))
    with pytest.raises(ObjectExistsError, match="another writer of worker_0"):
        a.ship()
    wd.close()
    # a late segment in a chain the new session did not know: it lands, it never counts
    from hallulog.workers.persist import WorkerDir

    other = WorkerDir(
        old / "worker_7",
        worker_id=7,
        storage_format="packed",
        layer_ids=[0, 1],
        hidden_size=4,
        dtype="float16",
    )
    other.persist_group(*_group("late"))
    other.close()
    a.states.pop("worker_0")
    a.chains = ["worker_7"]
    assert a.ship() == 1
    assert any("/worker_7/" in k for k in _segments(bucket))

    new = tmp_path / "successor"
    states = restore_staging(new, bucket)
    assert not (new / "worker_7").exists()
    assert states["worker_7"].seq == 1  # the successor's writer of worker_7 goes after it
    assert _recover(new) == {"p1"}
    wd = _writer(new)
    wd.persist_group(*_group("p3"))
    wd.close()
    SegmentShipper(new, bucket, states, interval=60, epoch=2).ship()
    third = tmp_path / "third"
    restore_staging(third, bucket)
    assert _recover(third) == {"p1", "p3"} and not (third / "worker_7").exists()

    rule = EpochRule({2: {"worker_0": 1}, 4: {"worker_0": 5, "worker_1": 0}})
    assert rule.stale("worker_0", 0, 1) is None  # before every later fence
    assert "fenced the chain at 1" in rule.stale("worker_0", 1, 1)
    assert rule.stale("worker_0", 3, 2) is None and rule.stale("worker_0", 3, None) is not None
    assert "did not know the chain" in rule.stale("worker_1", 0, 1)
    assert rule.stale("worker_1", 1, 4) is None


def test_labels_travel_in_the_root_chain_whole_lines_only(tmp_path, bucket):
    from hallulog.remote.restore import restore_staging
    from hallulog.remote.shipper import SegmentShipper

    root = tmp_path / "stage"
    root.mkdir()
    labels = root / "labels.jsonl"
    labels.write_bytes(b'{"prompt_id": "p1", "label": 0}\n{"prompt_id": "p2", "lab')  # torn
    shipper = SegmentShipper(root, bucket, {}, interval=60)
    assert shipper.ship() == 1
    new = tmp_path / "new"
    new.mkdir()
    (new / "labels.jsonl").write_bytes(b"stale labels of nothing\n")
    states = restore_staging(new, bucket)
    assert (new / "labels.jsonl").read_bytes() == b'{"prompt_id": "p1", "label": 0}\n'
    assert states["_root"].lines == {"labels.jsonl": 1}
    with open(labels, "r+b") as f:  # the judge's next line, whole
        f.truncate(len(b'{"prompt_id": "p1", "label": 0}\n'))
        f.seek(0, 2)
        f.write(b'{"prompt_id": "p2", "label": 1}\n')
    assert shipper.ship() == 1
    restore_staging(new, bucket)
    assert (new / "labels.jsonl").read_bytes() == labels.read_bytes()
    assert not list(new.glob("worker_*"))
