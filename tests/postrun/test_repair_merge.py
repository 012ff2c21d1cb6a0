"""Quarantine of malformed worker lines, the physical merge of worker stores, and ENOSPC during
that merge on a real small filesystem."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import numpy as np
import pytest
from hallulog.contracts import layout
from hallulog.contracts.jsonl import iter_rows
from hallulog.postrun.repair import quarantine_malformed_lines
from hallulog.storage import SampleMeta

from hallulog import storage
from tests.fuzzing import snapshot

LAYERS, HIDDEN = [0, 1], 16


def test_quarantine_moves_every_kind_of_malformed_line(tmp_path):
    wdir = tmp_path / "worker_0"
    wdir.mkdir()
    good = [{"prompt_id": "a" * 16, "commit_id": "c1"}, {"prompt_id": "b" * 16, "commit_id": "c2"}]
    lines = [
        json.dumps(good[0]).encode() + b"\n",
        b'{"prompt_id": "broken\n',  # malformed JSON
        b"[1, 2, 3]\n",  # JSON, not an object
        b'{"prompt_id": "\xff\xfe"}\n',  # not UTF-8
        json.dumps(good[1]).encode() + b"\n",
        b'{"prompt_id": "torn',
    ]  # torn tail: recovery's business
    (wdir / layout.PROMPT_INDEX).write_bytes(b"".join(lines))
    moved = quarantine_malformed_lines(wdir)
    assert moved == 3
    assert list(iter_rows(wdir / layout.PROMPT_INDEX)) == good  # now readable, order kept
    assert (wdir / layout.PROMPT_INDEX).read_bytes().endswith(b'{"prompt_id": "torn')
    quarantined = [json.loads(x) for x in (wdir / "quarantine.jsonl").read_text().splitlines()]
    assert [q["line"] for q in quarantined] == [2, 3, 4]
    assert all(q["file"] == layout.PROMPT_INDEX for q in quarantined)
    assert quarantine_malformed_lines(wdir) == 0  # idempotent


def _store(root, keys, seed):
    rng = np.random.default_rng(seed)
    w = storage.open_writer("packed", root=root, layer_ids=LAYERS, hidden_size=HIDDEN)
    data = {}
    for key in keys:
        t = int(rng.integers(2, 40))
        acts = rng.standard_normal((len(LAYERS), t, HIDDEN)).astype("float16")
        w.write(key, acts, SampleMeta(prompt_len=1, response_len=t - 1, label=0))
        data[key] = acts
    w.close()
    return storage.store_dir(root), data


def _check_merged(dst, data):
    r = storage.open_store(dst)
    assert sorted(r.keys()) == sorted(data)
    for i, key in enumerate(r.keys()):
        for layer in range(len(LAYERS)):
            np.testing.assert_array_equal(np.asarray(r.read(i, layer)), data[key][layer])


@pytest.fixture
def sources(tmp_path):
    s0, d0 = _store(tmp_path / "w0", [f"{i:016x}_0" for i in range(12)], 0)
    s1, d1 = _store(tmp_path / "w1", [f"{i:016x}_1" for i in range(12)], 1)
    return [s0, s1], {**d0, **d1}


def test_merge_of_worker_stores_reads_back_every_sample(tmp_path, sources):
    stores, data = sources
    storage.merge_stores(stores, tmp_path / "merged", "packed")
    _check_merged(tmp_path / "merged", data)


@pytest.fixture
def tiny_fs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a size-limited tmpfs ({proc.stderr.strip()}): a full "
            "filesystem cannot be made without it (RLIMIT_FSIZE caps one file only)"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_merge_on_a_full_disk_fails_cleanly_then_completes(tmp_path, sources, tiny_fs):
    stores, data = sources
    before = snapshot(tmp_path / "w0"), snapshot(tmp_path / "w1")
    dst = tiny_fs / "merged"
    with pytest.raises((OSError, storage.StorageError)) as info:
        storage.merge_stores(stores, dst, "packed")
    exc = info.value
    assert getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc), exc
    assert (snapshot(tmp_path / "w0"), snapshot(tmp_path / "w1")) == before  # sources intact
    subprocess.run(["mount", "-o", "remount,size=4m", str(tiny_fs)], check=True)  # space freed
    storage.merge_stores(stores, dst, "packed")
    _check_merged(dst, data)
    assert not [p for p in os.listdir(dst) if p.startswith("tmp")]  # no leftovers


@pytest.mark.parametrize("export", ["wds", "saev"])
def test_export_on_a_full_disk_leaves_nothing_half_done(tmp_path, sources, tiny_fs, export):
    from hallulog.exports.saev import export_saev
    from hallulog.exports.wds import export_wds

    stores, data = sources
    src = tmp_path / "merged"
    storage.merge_stores(stores, src, "packed")
    before = snapshot(src)
    dst = tiny_fs / export
    run = (lambda: export_wds(src, dst)) if export == "wds" else (lambda: export_saev(src, dst))
    with pytest.raises((OSError, storage.StorageError)) as info:
        run()
    assert getattr(info.value, "errno", None) == errno.ENOSPC or "No space left" in str(info.value)
    assert snapshot(src) == before  # the source store is untouched
    if export == "wds":  # shards are written in place; the manifest, written last, is absent
        from hallulog.exports.wds import read_wds_manifest

        with pytest.raises(storage.ManifestError, match="not finished"):
            read_wds_manifest(dst)
    else:  # staged in a sibling and renamed at the end
        assert not dst.exists() or not any(dst.iterdir())
    assert not [p for p in os.listdir(tiny_fs) if ".partial" in p]  # staging removed
    subprocess.run(["mount", "-o", "remount,size=8m", str(tiny_fs)], check=True)  # space freed
    run()
    assert any(dst.rglob("*"))
