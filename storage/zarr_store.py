"""``zarr``: seed 000's Zarr v2 directory store (zarr v3 + sharding as an option).

Normative description: docs/formats/zarr.md. Layout under the writer's directory::

    activations/
      commit.log                  # one JSON line per committed sample (crash safety)
      activations.zarr/           # plain Zarr, readable with zarr.open_consolidated(mode="r")
        arrays/activations        # (N, L, T_max, H), chunks (1, 1, T_chunk, H), uncompressed
        arrays/{seq_len, prompt_len, response_len, sample_key, hallu_label, split}
        text/samples.jsonl

Chunk files are written through zarr and synced by ``commit()`` (group commit): every chunk file
of the samples written since the last commit is fdatasync'ed once, then their new directories
and, if the array was resized, its metadata file; then their commit lines are appended in one
write and fdatasync'ed. Per-sample arrays, attrs and consolidated metadata are written by
``close()``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
import warnings

import numpy as np

from hallulog.storage._commitlog import (COMMIT_LOG, CommitLogWriter, cut_uncommitted,
                                         read_commit_log, record_line_bytes, tail_to_drop)
from hallulog.storage._io import (atomic_write_bytes, fsync_dir, fsync_file as _fsync_file,
                                  fsync_tree as _fsync_tree, fsync_tree_meta as _fsync_tree_meta,
                                  malformed_is_manifest_error)
from hallulog.storage.base import ActivationReader, ActivationWriter, SampleMeta
from hallulog.storage.dtypes import (as_container, container_dtype, dtype_str, from_container,
                                     store_dtype)
from hallulog.storage.errors import CorruptShardError, ManifestError, StorageError

log = logging.getLogger(__name__)

__all__ = ["ZarrWriter", "ZarrReader", "STORE_NAME", "FORMAT", "SCHEMA_VERSION", "sample_bytes",
           "sample_files"]

FORMAT = "hallulog.zarr"
SCHEMA_VERSION = 1
STORE_NAME = "activations.zarr"
TARGET_CHUNK_BYTES = 512 << 10
MAX_T_CHUNK = 1024

#: root group attrs (docs/formats/zarr.md, table "global attrs")
ATTR_FIELDS = (
    "schema_version", "format", "num_samples", "num_layers", "layer_ids", "hidden_size", "T_max",
    "T_chunk", "dtype", "zarr_format", "sharded", "created_unix", "model_id",
)
#: arrays under arrays/: name -> dtype (table "arrays")
ARRAYS = {
    "activations": "<f2",
    "seq_len": "<i4",
    "prompt_len": "<i4",
    "response_len": "<i4",
    "sample_key": "|S",
    "hallu_label": "|i1",
    "split": "|i1",
}
#: commit.log record lines (table "commit.log records")
RECORD_FIELDS = ("key", "i", "seq_len", "prompt_len", "response_len", "label")
#: keys of the dict ZarrWriter.write returns (table "writer location fields")
LOCATION_FIELDS = ("file_path", "zarr_index", "shape", "dtype", "size_bytes")
#: text/samples.jsonl fields (table "text/samples.jsonl")
TEXT_FIELDS = ("i", "sample_key", "prompt_len", "response_len", "label")


def choose_t_chunk(hidden_size: int, itemsize: int, target: int = TARGET_CHUNK_BYTES) -> int:
    """Largest power of two of tokens (1..MAX_T_CHUNK) with a chunk of at most ``target`` bytes."""
    t = min(MAX_T_CHUNK, max(1, target // max(1, hidden_size * itemsize)))
    return 1 << (t.bit_length() - 1)


def sample_bytes(*, layers: int, rows: float, hidden_size: int, itemsize: int, key_len: int) -> float:
    """Bytes one stored sample costs (a projection): whole chunks of ``T_chunk`` rows per layer,
    and its commit-log line."""
    t = choose_t_chunk(hidden_size, itemsize)
    return layers * math.ceil(max(rows, 1) / t) * t * hidden_size * itemsize \
        + record_line_bytes(key_len, rows)


_METADATA = (".zgroup", ".zattrs", ".zarray", "zarr.json")


def sample_files(store_dir: str, samples) -> tuple[list[str], list[str]]:
    """The files of a writer's store under ``store_dir`` (its ``activations/``) holding the
    chunks of the committed ``samples`` (their ``zarr_index``), each written once, and the
    store's metadata files, rewritten in place as the array grows (existing files only)."""
    store = os.path.join(store_dir, STORE_NAME)
    acts = os.path.join(store, "arrays", "activations")
    chunks = os.path.join(acts, "c") if os.path.exists(os.path.join(acts, "zarr.json")) else acts
    data = []
    for i in sorted(samples):
        for folder, _, names in os.walk(os.path.join(chunks, str(i))):
            data += [os.path.join(folder, n) for n in names]
    metadata = [os.path.join(folder, n) for folder in (store, os.path.join(store, "arrays"), acts)
                for n in _METADATA if os.path.isfile(os.path.join(folder, n))]
    return data, metadata


def _quiet():
    w = warnings.catch_warnings()
    w.__enter__()
    warnings.simplefilter("ignore")
    return w


class ZarrWriter(CommitLogWriter, ActivationWriter):
    def __init__(self, path, layer_ids, hidden_size, dtype="float16", t_chunk: int | None = None,
                 zarr_format: int = 2, sharded: bool = False, model_id: str = ""):
        import zarr

        self.path = os.fspath(path)
        self.store_path = os.path.join(self.path, STORE_NAME)
        self.layer_ids = [int(x) for x in layer_ids]
        self.hidden_size = int(hidden_size)
        self.dtype = store_dtype(dtype)
        # zarr-python has no bfloat16 data type: such a store's array holds its words as <u2
        self._container = container_dtype(self.dtype)
        self.zarr_format = int(zarr_format)
        self.sharded = bool(sharded)
        if self.sharded and self.zarr_format != 3:
            raise StorageError("the sharding codec needs zarr_format=3")
        self.model_id = model_id
        self.t_chunk = int(t_chunk or choose_t_chunk(self.hidden_size, self.dtype.itemsize))
        self._records: list[dict] = []
        self._line_starts: list[int] = []
        self._keys: set[str] = set()
        self._pending: list[tuple[str, dict]] = []  # written, not yet committed
        self._staged: list[bytes] = []
        self._resized = False
        self._closed = False
        os.makedirs(self.path, exist_ok=True)
        log_path = os.path.join(self.path, COMMIT_LOG)
        L, H = len(self.layer_ids), self.hidden_size
        w = _quiet()
        try:
            if os.path.exists(log_path) and os.path.exists(self.store_path):
                self._recover(log_path)
                self._root = zarr.open_group(self.store_path, mode="a", zarr_format=self.zarr_format)
                self._acts = self._root["arrays/activations"]
                # <u2 holds bfloat16 and nothing else: the container names the store dtype
                if self._acts.dtype != self._container or self._acts.shape[1:2] + self._acts.shape[3:] != (L, H):
                    raise StorageError(f"store holds {self._acts.dtype} {self._acts.shape}, reopened as "
                                       f"{self.dtype} (N, {L}, T, {H})", self.store_path)
                self.t_chunk = int(self._acts.chunks[2])
                self._truncate(len(self._records))
            else:
                if os.path.exists(self.store_path):
                    shutil.rmtree(self.store_path)
                fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.close(fd)
                self._root = zarr.open_group(self.store_path, mode="w", zarr_format=self.zarr_format)
                kw = dict(shape=(0, L, 0, H), chunks=(1, 1, self.t_chunk, H), dtype=self._container,
                          fill_value=0, compressors=None, filters=None)
                if self.zarr_format == 2:
                    kw.update(order="C", chunk_key_encoding={"name": "v2", "separator": "/"})
                if self.sharded:
                    kw.update(shards=(1, L, self.t_chunk, H))
                self._acts = self._root.require_group("arrays").create_array("activations", **kw)
            # open for writing: drop the consolidated view so no reader sees a stale store
            for name in (".zmetadata",):
                p = os.path.join(self.store_path, name)
                if os.path.exists(p):
                    os.unlink(p)
        finally:
            w.__exit__(None, None, None)
        fsync_dir(self.path)
        self._log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)

    def _recover(self, log_path: str) -> None:
        for n, pos, rec in read_commit_log(log_path):
            if rec.get("i") != len(self._records):
                raise ManifestError(f"record index {rec.get('i')} out of order", log_path, line=n)
            self._line_starts.append(pos)
            self._records.append(rec)
        self._keys = {r["key"] for r in self._records}
        cut_uncommitted(log_path)

    def _chunk_root(self) -> str:
        base = os.path.join(self.store_path, "arrays", "activations")
        return base if self.zarr_format == 2 else os.path.join(base, "c")

    def _truncate(self, n: int) -> None:
        """Forget samples >= n: shrink the array and delete their chunk directories."""
        w = _quiet()
        try:
            self._acts.resize((n,) + tuple(self._acts.shape[1:]))
        finally:
            w.__exit__(None, None, None)
        root = self._chunk_root()
        if os.path.isdir(root):
            for name in os.listdir(root):
                if name.isdigit() and int(name) >= n:
                    shutil.rmtree(os.path.join(root, name))

    def write(self, key: str, acts: np.ndarray, meta: SampleMeta) -> dict:
        if self._closed:
            raise StorageError("writer is closed", self.path)
        acts = self._check(key, acts, meta)
        if key in self._keys or any(key == k for k, _ in self._pending):
            raise StorageError(f"key {key} is already stored; rollback() it before writing it again", self.path)
        i = len(self._records) + len(self._pending)
        t = acts.shape[1]
        n_cap, L, t_max, H = self._acts.shape
        if i >= n_cap or t > t_max:
            t_new = max(t_max, -(-t // self.t_chunk) * self.t_chunk)
            w = _quiet()
            try:
                self._acts.resize((max(i + 1, 2 * n_cap, 16), L, t_new, H))
            finally:
                w.__exit__(None, None, None)
            self._resized = True
        if t:
            self._acts[i, :, :t, :] = as_container(acts)
        rec = {"key": key, "i": i, "seq_len": int(t), "prompt_len": meta.prompt_len,
               "response_len": meta.response_len, "label": meta.label}
        self._pending.append((key, rec))
        return {"file_path": f"activations/{STORE_NAME}", "zarr_index": i, "shape": list(acts.shape),
                "dtype": self.dtype.name, "size_bytes": int(acts.nbytes)}

    def commit(self, on_durable=None) -> None:
        if not self._pending:
            return
        root = self._chunk_root()
        for _key, rec in self._pending:
            top = os.path.join(root, str(rec["i"]))
            if os.path.isdir(top):
                _fsync_tree(top)
        if self._resized:
            meta = ".zarray" if self.zarr_format == 2 else "zarr.json"
            _fsync_file(os.path.join(self.store_path, "arrays", "activations", meta))
            self._resized = False
        for d in (root, os.path.dirname(root)) if self.zarr_format == 3 else (root,):
            if os.path.isdir(d):
                fsync_dir(d)
        if on_durable is not None:
            on_durable()
        self._append_pending()

    def committed_keys(self) -> set[str]:
        return set(self._keys)

    def rollback(self, keep: set[str]) -> None:
        drop_at = tail_to_drop([r["key"] for r in self._records], keep, "zarr", self.path)
        if drop_at is None and not self._pending:
            return
        self._pending = []
        if drop_at is not None:
            os.truncate(os.path.join(self.path, COMMIT_LOG), self._line_starts[drop_at])
            os.fsync(self._log_fd)
            del self._records[drop_at:]
            del self._line_starts[drop_at:]
        self._keys = {r["key"] for r in self._records}
        self._truncate(len(self._records))

    def close(self) -> None:
        if self._closed:
            return
        self.commit()
        self._closed = True
        os.close(self._log_fd)
        import zarr

        recs = self._records
        n = len(recs)
        w = _quiet()
        try:
            L, H = len(self.layer_ids), self.hidden_size
            t_max = max([r["seq_len"] for r in recs] + [0])
            t_max = -(-t_max // self.t_chunk) * self.t_chunk
            self._acts.resize((n, L, t_max, H))
            arrays = self._root["arrays"]
            keys = [r["key"].encode() for r in recs]
            width = max([len(k) for k in keys] + [1])
            cols = {
                "seq_len": np.array([r["seq_len"] for r in recs], "<i4"),
                "prompt_len": np.array([r["prompt_len"] for r in recs], "<i4"),
                "response_len": np.array([r["response_len"] for r in recs], "<i4"),
                "sample_key": np.array(keys, f"|S{width}"),
                "hallu_label": np.array([r["label"] for r in recs], "|i1"),
                "split": np.zeros(n, "|i1"),
            }
            for name, a in cols.items():
                kw = dict(compressors=None, filters=None)
                if self.zarr_format == 2:
                    kw["order"] = "C"
                # zarr v2 spec: a fixed-length bytes fill value is base64 of exactly itemsize bytes
                # ("" is not; tensorstore refuses it), so the fill is itemsize zero bytes
                z = arrays.create_array(name, shape=(n,), chunks=(max(n, 1),), dtype=a.dtype,
                                        fill_value=bytes(a.dtype.itemsize) if a.dtype.kind == "S" else 0,
                                        overwrite=True, **kw)
                if n:
                    z[:] = a
            text = os.path.join(self.store_path, "text")
            os.makedirs(text, exist_ok=True)
            lines = [json.dumps({"i": j, "sample_key": r["key"], "prompt_len": r["prompt_len"],
                                 "response_len": r["response_len"], "label": r["label"]}) + "\n"
                     for j, r in enumerate(recs)]
            atomic_write_bytes(os.path.join(text, "samples.jsonl"), "".join(lines).encode())
            self._root.attrs.update({
                "schema_version": SCHEMA_VERSION, "format": FORMAT, "num_samples": n, "num_layers": L,
                "layer_ids": self.layer_ids, "hidden_size": H, "T_max": t_max, "T_chunk": self.t_chunk,
                "dtype": dtype_str(self.dtype), "zarr_format": self.zarr_format, "sharded": self.sharded,
                "created_unix": int(time.time()), "model_id": self.model_id,
            })
            zarr.consolidate_metadata(self.store_path)
        finally:
            w.__exit__(None, None, None)
        # the array was resized and the metadata rewritten: make the finalized store durable
        _fsync_tree_meta(self.store_path)


class ZarrReader(ActivationReader):
    """Reads one finalized store through ``zarr.open_consolidated(mode='r')``, opened per process."""

    _unpicklable = ActivationReader._unpicklable + ("_z", "_zpid")

    @malformed_is_manifest_error
    def __init__(self, path):
        self.path = os.fspath(path)
        if os.path.isdir(os.path.join(self.path, STORE_NAME)):
            self.path = os.path.join(self.path, STORE_NAME)
        meta_file = ".zmetadata" if os.path.exists(os.path.join(self.path, ".zgroup")) else "zarr.json"
        mpath = os.path.join(self.path, meta_file)
        if meta_file == ".zmetadata" and not os.path.exists(mpath):
            raise ManifestError("no consolidated metadata: the store was not finalized (its writer did not "
                                "close); reopen it with hallulog.storage.open_writer('zarr', ...) and close()", mpath)
        root = self._zarr()
        attrs = dict(root.attrs)
        missing = [k for k in ATTR_FIELDS if k not in attrs]
        if missing or attrs.get("format") != FORMAT:
            raise ManifestError(f"not a {FORMAT} store (attrs lack {missing})", mpath)
        try:
            acts = root["arrays/activations"]
            cols = {k: root[f"arrays/{k}"][:] for k in ARRAYS if k != "activations"}
        except KeyError as e:
            raise ManifestError(f"missing array {e}: store not finalized?", mpath) from None
        self.attrs = attrs
        try:
            self.dtype = store_dtype(attrs["dtype"])
        except ValueError as exc:
            raise ManifestError(str(exc), mpath) from None
        if acts.dtype != container_dtype(self.dtype):
            raise ManifestError(f"attrs say dtype {attrs['dtype']} but arrays/activations is {acts.dtype}", mpath)
        self.layer_ids = list(attrs["layer_ids"])
        self.hidden_size = int(attrs["hidden_size"])
        self._n = int(attrs["num_samples"])
        if acts.shape[:2] != (self._n, len(self.layer_ids)) or acts.shape[3] != self.hidden_size:
            raise ManifestError(f"arrays/activations has shape {acts.shape}, attrs disagree", mpath)
        if any(len(c) != self._n for c in cols.values()):
            raise ManifestError("per-sample arrays differ in length from num_samples", mpath)
        self._cols = cols
        self.t_chunk = int(acts.chunks[2])

    def _zarr(self):
        z = self.__dict__.get("_z")
        if z is None or self.__dict__.get("_zpid") != os.getpid():
            import zarr

            w = _quiet()
            try:
                z = zarr.open_consolidated(self.path, mode="r")
            except Exception as e:  # noqa: BLE001 - zarr raises many kinds
                raise ManifestError(f"cannot open consolidated zarr store ({e})", self.path) from None
            finally:
                w.__exit__(None, None, None)
            self._z, self._zpid = z, os.getpid()
            self._arr = None
        return z

    def _array(self):
        z = self._zarr()
        arr = self.__dict__.get("_arr")
        if arr is None:
            arr = self._arr = z["arrays/activations"]
        return arr

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_arr", None)
        return state

    def __len__(self) -> int:
        return self._n

    def seq_len(self, i: int) -> int:
        return int(self._cols["seq_len"][i])

    def meta(self, i: int) -> dict:
        c = self._cols
        return {"sample_key": c["sample_key"][i].decode(), "seq_len": int(c["seq_len"][i]),
                "prompt_len": int(c["prompt_len"][i]), "response_len": int(c["response_len"][i]),
                "label": int(c["hallu_label"][i])}

    def keys(self) -> list[str]:
        return [k.decode() for k in self._cols["sample_key"]]

    def chunk_path(self, i: int, layer: int, t_block: int) -> str:
        base = os.path.join(self.path, "arrays", "activations")
        if self.attrs["zarr_format"] == 2:
            return os.path.join(base, str(i), str(layer), str(t_block), "0")
        if self.attrs["sharded"]:
            return os.path.join(base, "c", str(i), "0", str(t_block), "0")
        return os.path.join(base, "c", str(i), str(layer), str(t_block), "0")

    def read(self, i: int, layer: int) -> np.ndarray:
        i, layer = self._check_index(i, layer)
        t = self.seq_len(i)
        try:
            return from_container(np.asarray(self._array()[i, layer, :t, :]), self.dtype)
        except Exception as e:  # noqa: BLE001 - a damaged chunk surfaces as a codec error
            bad = next((p for b in range(-(-t // self.t_chunk))
                        if not self._chunk_ok(p := self.chunk_path(i, layer, b))), self.path)
            raise CorruptShardError(f"cannot read sample {i} layer position {layer} ({e})", bad) from None

    def _chunk_ok(self, p: str) -> bool:
        if not os.path.exists(p):
            return False
        chunk = self.t_chunk * self.hidden_size * self.dtype.itemsize
        if self.attrs["sharded"]:  # L inner chunks + index (offset, length: 16 bytes each) + crc32c
            return os.path.getsize(p) == self.num_layers * (chunk + 16) + 4
        return os.path.getsize(p) == chunk

    def verify(self) -> None:
        """Every chunk a sample needs exists with the right size (a missing chunk reads as zeros)."""
        for i in range(self._n):
            for layer in range(1 if self.attrs["sharded"] else self.num_layers):
                for b in range(-(-self.seq_len(i) // self.t_chunk)):
                    p = self.chunk_path(i, layer, b)
                    if not self._chunk_ok(p):
                        raise CorruptShardError(f"chunk of sample {i} is missing or has the wrong size", p)
