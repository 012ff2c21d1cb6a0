"""The conformance suite every activation format passes (zarr ``testing/store.py`` style).

A format's test module subclasses ``StoreConformance`` and sets ``fmt`` (and the hooks at the
bottom). ``persist`` plays the worker: write the activations, then append the index line.
Every test runs once per dtype of ``STORE_DTYPES`` (``self.dtype``): float16, the default, and
bfloat16, which must come back bit for bit as ``ml_dtypes.bfloat16`` arrays and ``torch.bfloat16``
tensors.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
from hallulog.storage import (
    CorruptShardError,
    ManifestError,
    SampleMeta,
    StorageError,
    open_store,
    open_writer,
    write_multi_manifest,
)
from hallulog.storage.dtypes import store_dtype, to_numpy, torch_dtype
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: every conformance test runs in each (float32 is in the round trip's draw)
STORE_DTYPES = ("float16", "bfloat16")
HYPO = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
)


def make_sample(seed: int, L: int, H: int, dtype="float16", t: int | None = None):
    rng = np.random.default_rng(seed)
    t = int(rng.integers(1, 24)) if t is None else t
    acts = rng.standard_normal((L, t, H)).astype(store_dtype(dtype))
    p = int(rng.integers(0, t + 1))
    return acts, SampleMeta(prompt_len=p, response_len=t - p, label=int(rng.integers(-1, 2)))


def bits(a: np.ndarray) -> np.ndarray:
    """The elements' bit patterns (bit-exact comparison: -0.0, NaN payloads, bfloat16)."""
    return np.ascontiguousarray(a).view(f"<u{a.dtype.itemsize}")


def assert_bits_equal(got: np.ndarray, want: np.ndarray, err_msg: str = "") -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (
        got.dtype,
        got.shape,
        want.dtype,
        want.shape,
    )
    np.testing.assert_array_equal(bits(got), bits(want), err_msg=err_msg)


def persist(writer, root, key, acts, meta):
    """What the worker does: activations first (written, then committed), then the index line."""
    loc = writer.write(key, acts, meta)
    writer.commit()
    append_index(writer, root, key, acts, meta, loc)
    return loc


def append_index(writer, root, key, acts, meta, loc):
    line = {
        "activation_key": key,
        "layers": list(writer.layer_ids),
        "sequence_mode": "all",
        "prompt_token_count": meta.prompt_len,
        "response_token_count": meta.response_len,
        "row0_position": 0,
        "num_rows": acts.shape[1],
        "label": meta.label,
        **loc,
    }
    with open(os.path.join(root, "activation_index.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()
        os.fsync(f.fileno())


def index_keys(root) -> list[str]:
    p = os.path.join(root, "activation_index.jsonl")
    if not os.path.exists(p):
        return []
    with open(p) as f:
        return [json.loads(l)["activation_key"] for l in f if l.endswith("\n")]


def check_store(root, expected: dict, meta: dict | None = None):
    r = open_store(root)
    assert sorted(r.keys()) == sorted(expected)
    for i in range(len(r)):
        m = r.meta(i)
        want = expected[m["sample_key"]]
        assert m["seq_len"] == want.shape[1]
        assert r.index_of(m["sample_key"]) == i
        if meta is not None:
            sm = meta[m["sample_key"]]
            assert (m["prompt_len"], m["response_len"], m["label"]) == (
                sm.prompt_len,
                sm.response_len,
                sm.label,
            )
        for l in range(want.shape[0]):
            assert_bits_equal(r.read(i, l), want[l])
    if len(r):
        rng = np.random.default_rng(0)
        s = rng.integers(0, len(r), 12)
        ls = rng.integers(0, r.num_layers, 12)
        for a, i, l in zip(r.read_pairs(s, ls), s, ls):
            assert_bits_equal(a, expected[r.meta(int(i))["sample_key"]][l])
    r.verify()
    return r


def _char_bytes(a: np.ndarray) -> np.ndarray:
    """tensorstore's Python binding hands zarr ``|S<w>`` (its ``char`` dtype) to numpy as ``|S0``
    (itemsize 0, strides still 1 byte): copy the bytes it decoded from its buffer and view them
    as ``|S<w>`` again."""
    import ctypes

    n, w = a.shape
    if n * w == 0:
        return np.zeros(n, f"|S{max(w, 1)}")
    ptr = a.__array_interface__["data"][0]
    raw = np.ctypeslib.as_array(
        ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)), shape=(n * w,)
    ).copy()
    return raw.view(f"|S{w}")


def tensorstore_arrays(zarr_path: str, driver: str = "zarr") -> dict[str, np.ndarray]:
    """Every array under ``zarr_path/arrays`` opened and read by tensorstore (a second Zarr implementation)."""
    import tensorstore as ts

    out = {}
    base = os.path.join(zarr_path, "arrays")
    for name in sorted(os.listdir(base)):
        if not os.path.isdir(os.path.join(base, name)):
            continue
        t = ts.open(
            {"driver": driver, "kvstore": {"driver": "file", "path": os.path.join(base, name)}},
            read=True,
        ).result()
        a = t.read().result()
        out[name] = _char_bytes(a) if t.dtype.name == "char" else a
    return out


CHILD = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    from tests.storage.conformance import make_sample, persist
    from hallulog.storage import open_writer
    fmt, root, mode, dtype = {fmt!r}, {store!r}, {mode!r}, {dtype!r}
    w = open_writer(fmt, root, layer_ids=[0, 3, 7], hidden_size=16, dtype=dtype, **{opts!r})
    cls = type(w)
    orig = cls._commit
    def commit(self, key, record):
        if mode == "partial" and key == "k_3":
            print("PARTIAL", flush=True)
            time.sleep(60)
        orig(self, key, record)
    cls._commit = commit
    for k in range(10**6):
        acts, meta = make_sample(k, 3, 16, dtype, t=64 if k == 3 else None)
        persist(w, root, f"k_{{k}}", acts, meta)
        print("COMMITTED", k, flush=True)
""")


def _slow_use_count(_worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: every use-count read of the worker's buffers sleeps 5 ms
    before and after, and thread switches are as frequent as they get."""
    from hallulog.storage import _worker_buffers

    read = _worker_buffers.use_count

    def slow(t):
        time.sleep(0.005)
        n = read(t)
        time.sleep(0.005)
        return n

    sys.setswitchinterval(1e-6)
    _worker_buffers.use_count = slow


class StoreConformance:
    fmt: str = ""
    writer_options: dict = {}
    rollback_any_subset = False  # npy can drop any subset; packed/zarr only a tail
    tensorstore_driver = ""  # zarr: every array must also open in tensorstore with this driver
    replaces_existing = False  # npy replaces a key written again; packed/zarr refuse
    dtype = "float16"  # the test's store dtype (the fixture below sets it)

    @pytest.fixture(autouse=True, params=STORE_DTYPES)
    def store_dtype(self, request):
        """Every test of the suite, once per store dtype."""
        self.dtype = request.param
        return request.param

    def sample(self, seed, L=3, H=16, t=None):
        return make_sample(seed, L, H, self.dtype, t=t)

    def open(self, root, layer_ids=(0, 3, 7), hidden=16, dtype=None):
        return open_writer(
            self.fmt,
            root,
            layer_ids=list(layer_ids),
            hidden_size=hidden,
            dtype=dtype or self.dtype,
            **self.writer_options,
        )

    def fill(self, root, n, start=0, L=3, H=16, dtype=None, writer=None):
        dtype = dtype or self.dtype
        w = writer or self.open(root, layer_ids=range(L), hidden=H, dtype=dtype)
        data, metas = {}, {}
        for k in range(start, start + n):
            acts, meta = make_sample(k, L, H, dtype)
            persist(w, root, f"k_{k}", acts, meta)
            data[f"k_{k}"], metas[f"k_{k}"] = acts, meta
        if writer is None:
            w.close()
        return data, metas

    # ---- round trip ---------------------------------------------------------------------
    @HYPO
    @given(
        L=st.integers(1, 4),
        H=st.integers(1, 24),
        wide=st.booleans(),
        lens=st.lists(st.integers(0, 40), max_size=6),
        seed=st.integers(0, 2**31),
    )
    def test_roundtrip(self, L, H, wide, lens, seed):
        dtype = "float32" if wide else self.dtype
        with tempfile.TemporaryDirectory() as root:
            rng = np.random.default_rng(seed)
            layer_ids = sorted(rng.choice(64, L, replace=False).tolist())
            w = self.open(root, layer_ids=layer_ids, hidden=H, dtype=dtype)
            open(os.path.join(root, "activation_index.jsonl"), "w").close()
            data, metas = {}, {}
            for k, t in enumerate(lens):
                acts = rng.standard_normal((L, t, H)).astype(store_dtype(dtype))
                if (
                    store_dtype(dtype).itemsize == 2 and acts.size
                ):  # every bit pattern, NaNs and infinities too
                    acts.view(np.uint16)[...] = rng.integers(
                        0, 1 << 16, acts.shape, dtype=np.uint16
                    )
                p = int(rng.integers(0, t + 1))
                meta = SampleMeta(p, t - p, int(rng.integers(-1, 2)))
                persist(w, root, f"{seed:x}_{k}", acts, meta)
                data[f"{seed:x}_{k}"], metas[f"{seed:x}_{k}"] = acts, meta
            assert w.committed_keys() == set(data)
            w.close()
            r = check_store(root, data, metas)
            if data:
                assert (
                    r.layer_ids == layer_ids
                    and r.hidden_size == H
                    and r.dtype == store_dtype(dtype)
                )

    def test_reopen_append(self, tmp_path):
        data, _ = self.fill(tmp_path, 3)
        more, _ = self.fill(tmp_path, 2, start=3)
        check_store(tmp_path, {**data, **more})

    def test_rollback_tail(self, tmp_path):
        w = self.open(tmp_path)
        data, _ = self.fill(tmp_path, 5, writer=w)
        w.rollback({"k_0", "k_1", "k_2"})
        assert w.committed_keys() == {"k_0", "k_1", "k_2"}
        acts, meta = self.sample(99)
        w.write("k_3", acts, meta)
        w.close()
        self._rewrite_index(tmp_path, {"k_0", "k_1", "k_2", "k_3"}, {"k_3": (acts, meta)})
        check_store(
            tmp_path, {"k_0": data["k_0"], "k_1": data["k_1"], "k_2": data["k_2"], "k_3": acts}
        )

    def test_rollback_middle(self, tmp_path):
        w = self.open(tmp_path)
        self.fill(tmp_path, 4, writer=w)
        if self.rollback_any_subset:
            w.rollback({"k_0", "k_2", "k_3"})
            assert w.committed_keys() == {"k_0", "k_2", "k_3"}
        else:
            with pytest.raises(StorageError):
                w.rollback({"k_0", "k_2", "k_3"})
            assert w.committed_keys() == {"k_0", "k_1", "k_2", "k_3"}
        w.close()

    def test_write_existing_key(self, tmp_path):
        w = self.open(tmp_path)
        self.fill(tmp_path, 2, writer=w)
        acts, meta = self.sample(42)
        if self.replaces_existing:
            w.write("k_1", acts, meta)
            w.close()
            self._rewrite_index(tmp_path, {"k_0", "k_1"}, {"k_1": (acts, meta)})
            assert np.array_equal(open_store(tmp_path).read(1, 2), acts[2])
        else:
            with pytest.raises(StorageError, match="k_1"):
                w.write("k_1", acts, meta)
            w.close()

    def test_bad_input(self, tmp_path):
        w = self.open(tmp_path)
        acts, meta = self.sample(0)
        with pytest.raises(StorageError, match="dtype"):
            w.write("x_0", acts.astype("float32" if self.dtype != "float32" else "float16"), meta)
        with pytest.raises(StorageError, match="shape"):
            w.write("x_0", acts[:2], meta)
        with pytest.raises(StorageError, match="rows"):
            w.write("x_0", acts, SampleMeta(meta.prompt_len + 1, meta.response_len))
        w.close()

    def _rewrite_index(self, root, keep, replace=None):
        """The worker's index after a rollback / replacement (only npy reads it)."""
        p = os.path.join(root, "activation_index.jsonl")
        lines = [json.loads(l) for l in open(p)]
        out = {}
        for l in lines:
            if l["activation_key"] in keep:
                out[l["activation_key"]] = l
        for key, (acts, meta) in (replace or {}).items():
            out[key].update(
                shape=list(acts.shape),
                prompt_token_count=meta.prompt_len,
                response_token_count=meta.response_len,
                label=meta.label,
                num_rows=acts.shape[1],
            )
        with open(p, "w") as f:
            for l in out.values():
                f.write(json.dumps(l) + "\n")

    # ---- group commit -------------------------------------------------------------------
    def test_group_commit(self, tmp_path):
        """``write`` stages, ``commit`` commits the whole group; a crash before it loses the group."""
        w = self.open(tmp_path)
        data, lines = {}, []
        for k in range(3):
            acts, meta = self.sample(k)
            lines.append((f"k_{k}", acts, meta, w.write(f"k_{k}", acts, meta)))
            data[f"k_{k}"] = acts
        assert w.committed_keys() == set()
        with pytest.raises(StorageError, match="k_1"):
            w.write("k_1", *self.sample(1))
        w.commit()
        assert w.committed_keys() == set(data)
        for line in lines:
            append_index(w, tmp_path, *line)
        for k in range(3, 5):  # a group written, never committed: the process "dies"
            w.write(f"k_{k}", *self.sample(k))
        del w
        w = self.open(tmp_path)
        assert w.committed_keys() == set(data)
        w.rollback(set(data))
        w.close()
        self._index_for(tmp_path, data)
        check_store(tmp_path, data)

    def test_rollback_drops_uncommitted(self, tmp_path):
        w = self.open(tmp_path)
        data, _ = self.fill(tmp_path, 2, writer=w)
        w.write("k_9", *self.sample(9))
        w.rollback(set(data))
        assert w.committed_keys() == set(data)
        acts, meta = self.sample(10)
        persist(w, tmp_path, "k_10", acts, meta)
        w.close()
        self._index_for(tmp_path, {**data, "k_10": acts})
        check_store(tmp_path, {**data, "k_10": acts})

    def _index_for(self, root, data):
        """Keep only ``data``'s lines in the worker index (npy reads it)."""
        p = os.path.join(root, "activation_index.jsonl")
        if os.path.exists(p):
            lines = [l for l in open(p) if json.loads(l)["activation_key"] in data]
            with open(p, "w") as f:
                f.writelines(lines)

    # ---- crash safety -------------------------------------------------------------------
    def _spawn(self, store, mode):
        code = CHILD.format(
            fmt=self.fmt, store=str(store), mode=mode, dtype=self.dtype, opts=self.writer_options
        )
        # run from the repository root: `python -c` puts the working directory on sys.path
        return subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )

    def _resume_and_check(self, store, expect_keys=None):
        """The worker's resume: keep what the index committed, roll back the rest, read it all."""
        committed = index_keys(store)
        if expect_keys is not None:
            assert committed == expect_keys
        w = self.open(store)
        assert set(committed) <= w.committed_keys()
        w.rollback(set(committed))
        assert w.committed_keys() == set(committed)
        w.close()
        expected = {k: self.sample(int(k[2:]), t=64 if k == "k_3" else None)[0] for k in committed}
        check_store(store, expected)

    @pytest.mark.slow
    def test_sigkill_mid_sample(self, tmp_path):
        """SIGKILL after sample k_3's bytes hit the store but before its commit point."""
        proc = self._spawn(tmp_path, "partial")
        try:
            for line in proc.stdout:
                if line.startswith("PARTIAL"):
                    break
            else:
                pytest.fail("writer child exited early")
            self.assert_partial_on_disk(tmp_path)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        self._resume_and_check(tmp_path, ["k_0", "k_1", "k_2"])

    def test_sigkill_random_time(self, tmp_path):
        proc = self._spawn(tmp_path, "loop")
        try:
            n = 0
            for _line in proc.stdout:
                n += 1
                if n >= 5:
                    break
            time.sleep(np.random.default_rng().uniform(0, 0.05))
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        self._resume_and_check(tmp_path)

    # ---- damage -------------------------------------------------------------------------
    def test_truncated_data(self, tmp_path):
        self.fill(tmp_path, 4)
        damaged = self.truncate_data(tmp_path)
        with pytest.raises(CorruptShardError) as err:
            r = open_store(tmp_path)
            for i in range(len(r)):
                for l in range(r.num_layers):
                    r.read(i, l)
            r.verify()
        assert err.value.path == damaged and damaged in str(err.value)

    def test_bad_metadata(self, tmp_path):
        self.fill(tmp_path, 3)
        damaged, pattern = self.corrupt_metadata(tmp_path)
        with pytest.raises((ManifestError, CorruptShardError), match=pattern) as err:
            open_store(tmp_path).read(0, 0)
        assert damaged in str(err.value)

    # ---- process model ------------------------------------------------------------------
    def test_pickle_drops_handles(self, tmp_path):
        data, _ = self.fill(tmp_path, 3)
        r = open_store(tmp_path)
        r.read(0, 0)
        r2 = pickle.loads(pickle.dumps(r))
        for k in ("_fds", "_pool", "_z", "_arr", "_ix"):
            assert k not in r2.__dict__
        assert_bits_equal(r2.read(1, 2), data[r2.meta(1)["sample_key"]][2])

    dataloader_cases = [(0, None), (2, "fork")]

    def test_dataloader(self, tmp_path, dataloader_case):
        workers, ctx = dataloader_case
        import torch
        from hallulog.storage import ActivationPairsDataset, collate_pairs

        data, metas = self.fill(tmp_path, 10)
        ds = ActivationPairsDataset(tmp_path, seed=7)
        dl = torch.utils.data.DataLoader(
            ds,
            batch_size=3,
            num_workers=workers,
            collate_fn=collate_pairs,
            multiprocessing_context=ctx,
            shuffle=False,
        )
        seen = 0
        r = open_store(tmp_path)
        for b in dl:
            assert b["acts"].shape[:2] == (len(b["index"]), 2) and b["acts"].dtype == torch_dtype(
                self.dtype
            )
            for j, i in enumerate(b["index"].tolist()):
                key = r.meta(i)["sample_key"]
                t = int(b["seq_len"][j])
                assert b["mask"][j].sum() == t and t == data[key].shape[1]
                assert int(b["label"][j]) == metas[key].label
                pos = b["layer_pos"][j].tolist()
                assert pos == ds.layers_for(i).tolist() and len(set(pos)) == 2
                for q in range(2):
                    assert_bits_equal(to_numpy(b["acts"][j, q, :t]), data[key][pos[q]])
                    assert not bits(to_numpy(b["acts"][j, q, t:])).any()  # +0.0 padding
                seen += 1
        assert seen == 10

    def test_getitems_matches_items(self, tmp_path):
        """The batched read (``__getitems__``) gives exactly ``collate_pairs`` of the items."""
        import torch
        from hallulog.storage import ActivationPairsDataset, collate_pairs

        self.fill(tmp_path, 6)
        ds = ActivationPairsDataset(tmp_path, seed=3)
        idx = [4, 0, 4, 5, -1]
        got = collate_pairs(ds.__getitems__(idx))
        want = collate_pairs([ds[i % 6] for i in idx])
        assert got.keys() == want.keys()
        for key in want:
            assert got[key].dtype == want[key].dtype, key
            assert torch.equal(got[key], want[key]), key
        items = ds.__getitems__(idx)
        assert torch.equal(items[1]["acts"], ds[0]["acts"]) and len(items) == len(idx)
        # pooled output buffers: a batch (or a view of it) the caller holds is never overwritten
        view = collate_pairs(ds.__getitems__([1, 2]))["acts"][1]
        held = [collate_pairs(ds.__getitems__([j % 6, (j + 1) % 6])) for j in range(5)]
        assert torch.equal(view, ds[2]["acts"])
        for j, h in enumerate(held):
            assert torch.equal(h["acts"][0, :, : int(h["seq_len"][0])], ds[j % 6]["acts"])

    @pytest.mark.slow
    def test_worker_buffers_are_reused_only_once_released(self, tmp_path):
        """Workers reuse their shared output buffers, never one the main process still holds
        (a batch, or only a view of it)."""
        import torch
        from hallulog.storage import ActivationPairsDataset, collate_pairs

        self.fill(tmp_path, 6)
        ds = ActivationPairsDataset(tmp_path, seed=5)
        sampler = np.random.default_rng(0).integers(0, 6, 60).tolist()
        dl = torch.utils.data.DataLoader(
            ds,
            batch_size=2,
            sampler=sampler,
            num_workers=2,
            collate_fn=collate_pairs,
            multiprocessing_context="fork",
        )
        held, views, storages = [], [], set()
        for n, b in enumerate(dl):
            storages.add(b["acts"].untyped_storage().data_ptr())
            if n % 7 == 0:
                held.append(b)
            if n % 7 == 3:
                views.append(
                    (b["index"].tolist(), b["acts"][:, :, :1].clone(), b["acts"][:, :, :1])
                )
            for j, i in enumerate(b["index"].tolist()):
                assert torch.equal(b["acts"][j, :, : int(b["seq_len"][j])], ds[i]["acts"])
        for b in held:
            for j, i in enumerate(b["index"].tolist()):
                assert torch.equal(b["acts"][j, :, : int(b["seq_len"][j])], ds[i]["acts"])
        for _idx, copy, view in views:
            assert torch.equal(copy, view)
        assert len(storages) < 30  # 30 batches went through fewer buffers

    @pytest.mark.slow
    def test_worker_buffer_reuse_has_no_race_with_the_feeder(self, tmp_path):
        """A worker never refills a buffer its queue's feeder thread is sending.

        The feeder marks a batch's buffer as sent while it pickles the batch and lets go of the
        batch after; a worker that read the mark before the use count could see "not sent" and
        then "nobody uses it" around a send, and refill a batch the main process was about to
        receive (a rare CI failure: one batch's ``acts`` held another sample's rows). The workers
        here sleep around their use-count reads so that the feeder runs in that window."""
        import torch
        from hallulog.storage import ActivationPairsDataset, collate_pairs

        data, _ = self.fill(tmp_path, 12)
        ds = ActivationPairsDataset(tmp_path, seed=11)
        keys = [open_store(tmp_path).meta(i)["sample_key"] for i in range(12)]
        for epoch in range(4):
            ds.set_epoch(epoch)
            dl = torch.utils.data.DataLoader(
                ds,
                batch_size=3,
                num_workers=2,
                collate_fn=collate_pairs,
                multiprocessing_context="fork",
                worker_init_fn=_slow_use_count,
            )
            for b in dl:
                for j, i in enumerate(b["index"].tolist()):
                    t = int(b["seq_len"][j])
                    for q, p in enumerate(b["layer_pos"][j].tolist()):
                        assert_bits_equal(
                            to_numpy(b["acts"][j, q, :t]),
                            data[keys[i]][p],
                            err_msg=f"epoch {epoch} sample {i}",
                        )

    @pytest.mark.slow
    def test_multi_store(self, tmp_path):
        a, _ = self.fill(tmp_path / "w0", 3)
        b, _ = self.fill(tmp_path / "w1", 2, start=3)
        write_multi_manifest(
            tmp_path / "merged",
            [tmp_path / "w0" / "activations", tmp_path / "w1" / "activations"]
            if self.fmt != "npy"
            else [tmp_path / "w0", tmp_path / "w1"],
        )
        check_store(tmp_path / "merged", {**a, **b})
        with pytest.raises(StorageError, match="k_0"):
            write_multi_manifest(tmp_path / "dup", [tmp_path / "w0", tmp_path / "w0"])

    def test_arrays_open_in_tensorstore(self, tmp_path):
        """Valid under the Zarr spec for every array: tensorstore opens each one, values equal zarr-python's."""
        if not self.tensorstore_driver:
            pytest.skip("not a Zarr store, or a Zarr layout tensorstore does not read")
        import zarr

        self.fill(tmp_path, 5)
        zpath = open_store(tmp_path).path
        root = zarr.open_consolidated(zpath, mode="r")
        got = tensorstore_arrays(zpath, self.tensorstore_driver)
        assert sorted(got) == sorted(root["arrays"].array_keys())
        for name, a in got.items():
            want = root[f"arrays/{name}"][:]
            assert a.dtype == want.dtype and a.shape == want.shape, name
            np.testing.assert_array_equal(a, want)

    # ---- format hooks -------------------------------------------------------------------
    def assert_partial_on_disk(self, root):
        """The killed writer had stored bytes of the uncommitted sample."""

    def truncate_data(self, root) -> str:
        raise NotImplementedError

    def corrupt_metadata(self, root) -> tuple[str, str]:
        raise NotImplementedError
