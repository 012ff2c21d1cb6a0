"""Property-based tests (hypothesis) over every activation-store reader: packed, zarr, npy,
saev and WebDataset shards, each file of a small store in turn truncated, corrupted or replaced
by random bytes. The contract (tests/fuzzing.py): a documented error naming a file of the store,
never a hang, never another exception, never a file deleted or rewritten by reading.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hallulog.exports.saev import SaevReader, export_saev
from hallulog.exports.wds import decode_npy, export_wds, iter_wds_records, read_wds_manifest
from hallulog.storage import SampleMeta
from hallulog.storage.npy import index_line
from hypothesis import given
from hypothesis import strategies as st

from hallulog import storage
from tests.fuzzing import FUZZ, check_reader, mutations, write_mutated

LAYERS, HIDDEN = [0, 1], 8


def _samples():
    rng = np.random.default_rng(0)
    for i, t in enumerate((3, 5, 2)):
        yield f"{i:016x}_0", rng.standard_normal((len(LAYERS), t, HIDDEN)).astype("float16"), t


def _build(fmt: str, root: Path) -> Path:
    """A finished small store; returns the path its reader opens."""
    w = storage.open_writer(fmt, root=root, layer_ids=LAYERS, hidden_size=HIDDEN)
    lines = []
    for key, acts, t in _samples():
        loc = w.write(key, acts, SampleMeta(prompt_len=1, response_len=t - 1, label=1))
        lines.append(
            {
                **index_line(
                    key,
                    {"seq_len": t, "prompt_len": 1, "response_len": t - 1, "label": 1},
                    LAYERS,
                    HIDDEN,
                    acts.dtype,
                ),
                **loc,
            }
        )
    w.close()
    if fmt == "npy":
        with open(root / "activation_index.jsonl", "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in lines)
    return root


def _read_all(path) -> None:
    r = storage.open_store(path)
    for i in range(len(r)):
        r.meta(i)
        for layer in range(r.num_layers):
            np.asarray(r.read(i, layer)).sum()
    if hasattr(r, "verify"):
        r.verify()


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("stores")
    out = {fmt: _build(fmt, base / fmt) for fmt in ("packed", "npy", "zarr")}
    saev_root = base / "saev"
    out["saev"] = Path(export_saev(out["packed"], saev_root))
    export_wds(out["packed"], base / "wds")
    out["wds"] = base / "wds"
    return out


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_size > 0)


def _fuzz_one(src: Path, work: Path, pick: int, m, read) -> None:
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(src, work)
    files = _files(work)
    target = files[pick % len(files)]
    write_mutated(target, target.read_bytes(), m)
    check_reader(lambda: read(work), names=[str(work)], root=work)


@pytest.mark.parametrize("fmt", ["packed", "npy", "zarr"])
@FUZZ
@given(pick=st.integers(0, 1000), m=mutations)
def test_store_readers(stores, tmp_path, fmt, pick, m):
    _fuzz_one(stores[fmt], tmp_path / fmt, pick, m, _read_all)


def _read_saev(path: Path) -> None:
    r = SaevReader(path, check_hash=False)
    for i in range(len(r)):
        r.meta(i)
        for layer in range(r.num_layers):
            np.asarray(r.read(i, layer)).sum()


@FUZZ
@given(pick=st.integers(0, 1000), m=mutations)
def test_saev_reader(stores, tmp_path, pick, m):
    work = tmp_path / "saev" / "shards" / stores["saev"].name  # the layout saev asserts
    work.parent.mkdir(parents=True, exist_ok=True)
    _fuzz_one(stores["saev"], work, pick, m, _read_saev)


def _read_wds(path: Path) -> None:
    manifest = read_wds_manifest(path)
    for shard in manifest["shards"]:
        name = shard["file"]
        for rec in iter_wds_records(os.path.join(path, name)):
            for member, data in rec.items():
                if member.endswith(".npy"):
                    decode_npy(data, os.path.join(path, name))


@FUZZ
@given(pick=st.integers(0, 1000), m=mutations)
def test_wds_reader(stores, tmp_path, pick, m):
    _fuzz_one(stores["wds"], tmp_path / "wds", pick, m, _read_wds)
