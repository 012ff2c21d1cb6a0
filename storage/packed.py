"""``packed``: append-only shard files ``[sample][layer][token][hidden]`` behind one CSR index.

Normative description: docs/formats/packed.md. Every (sample, layer) slice is one contiguous
extent, so a read is one ``pread`` straight into the output buffer.

Writer: ``write`` appends a sample's bytes to ``shard_NNNNNN.bin`` and syncs nothing; ``commit``
fdatasyncs the shard once, then appends the JSON lines of every sample written since the last
commit to ``commit.log`` in one write and fdatasyncs it (the commit point of the group). Reopening
replays the log, truncates everything after the last committed sample and carries on. ``close()`` writes
the index arrays (``.npy``) and ``manifest.json``, each to ``.tmp`` then renamed, manifest last.
"""

from __future__ import annotations

import json
import logging
import os
import time
from array import array

import numpy as np

from hallulog.storage._commitlog import (CommitLogWriter, RecordColumns, cut_uncommitted,
                                         read_commit_log, record_line, tail_to_drop)
from hallulog.storage._io import (atomic_save_npy, atomic_write_json, fsync_dir,
                                  malformed_is_manifest_error, start_writeback, write_all)
from hallulog.storage.base import ActivationWriter, ExtentReader, SampleMeta
from hallulog.storage.dtypes import dtype_str, store_dtype
from hallulog.storage.errors import CorruptShardError, ManifestError, StorageError
from hallulog.storage.packed_layout import (FORMAT, SCHEMA_VERSION, MANIFEST, COMMIT_LOG,
                                            DEFAULT_SHARD_BYTES, MANIFEST_FIELDS, SHARD_FIELDS,
                                            INDEX_ARRAYS, LOCATION_FIELDS, HEADER_FIELDS,
                                            RECORD_FIELDS, shard_name, hash_content, hashed_head,
                                            ADDED_IN_SCHEMA_2, CHECKSUMS, DEFAULT_CHECKSUM,
                                            checksum_name)

log = logging.getLogger(__name__)

#: ``write`` starts the writeback of the open shard's bytes once this many are waiting (as
#: RocksDB's ``bytes_per_sync``): the disk works while the group is still being written, and
#: small samples still reach the disk in large requests.
WRITEBACK_BYTES = 1 << 20
_PAGE = 4096

__all__ = ["PackedWriter", "PackedReader", "FORMAT", "SCHEMA_VERSION", "SHARD_FIELDS", "LOCATION_FIELDS"]

class PackedWriter(CommitLogWriter, ActivationWriter):
    def __init__(self, path, layer_ids, hidden_size, dtype="float16", shard_bytes=DEFAULT_SHARD_BYTES):
        self.path = os.fspath(path)
        self.layer_ids = [int(x) for x in layer_ids]
        self.hidden_size = int(hidden_size)
        self.dtype = store_dtype(dtype)
        self.shard_bytes = int(shard_bytes)
        self._records = RecordColumns(RECORD_FIELDS)
        self._line_starts = array("q")  # byte offset of each record line in commit.log
        self._keys: set[str] = set()
        self._pending: list[tuple[str, dict]] = []  # written, not yet committed
        self._pending_keys: set[str] = set()
        self._staged: list[bytes] = []  # commit.log lines of the commit in progress
        self._dirty = False  # the open shard has bytes not yet fdatasync'ed
        self._shard = 0
        self._shard_size = 0
        self._writeback_from = 0  # the open shard's bytes from here on: no writeback started
        self._shard_fd: int | None = None
        self._closed = False
        self.checksum = DEFAULT_CHECKSUM  # a reopened store keeps its own (_recover)
        os.makedirs(self.path, exist_ok=True)
        header = {
            "schema_version": SCHEMA_VERSION, "format": FORMAT, "dtype": dtype_str(self.dtype),
            "layer_ids": self.layer_ids, "hidden_size": self.hidden_size, "shard_bytes": self.shard_bytes,
            "checksum": self.checksum,
        }
        log_path = os.path.join(self.path, COMMIT_LOG)
        if os.path.exists(log_path) and os.path.getsize(log_path) > 0:
            self._recover(log_path, header)
        else:
            first = os.path.join(self.path, shard_name(0))
            if os.path.exists(first) and os.path.getsize(first) > 0:
                # the log is written (header first) before any shard byte: an empty log beside
                # data was cut, and starting a new one would drop every committed sample
                raise ManifestError(f"the commit log is empty but {shard_name(0)} holds "
                                    f"{os.path.getsize(first)} bytes: the log was cut or "
                                    "emptied; restore it (the samples cannot be found without it)",
                                    log_path)
            line = record_line(header)
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            write_all(fd, line)
            os.fsync(fd)
            os.close(fd)
            fsync_dir(self.path)
        self._log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
        # the store is open for writing: a manifest would describe a stale view
        for stale in (MANIFEST,):
            p = os.path.join(self.path, stale)
            if os.path.exists(p):
                os.unlink(p)

    # ---- recovery -------------------------------------------------------------------------
    def _recover(self, log_path: str, header: dict) -> None:
        seen_header = False
        for n, pos, obj in read_commit_log(log_path):
            if not seen_header:
                seen_header = True
                # the store keeps its own schema version, checksum and shard budget
                fixed = [k for k in HEADER_FIELDS if k not in ("schema_version", "shard_bytes", "checksum")]
                got, want = {k: obj.get(k) for k in fixed}, {k: header[k] for k in fixed}
                if got != want:
                    raise StorageError(f"store was created with {got}, reopened with {want}", log_path)
                if obj.get("schema_version", 1) > SCHEMA_VERSION:
                    raise StorageError(f"schema_version {obj['schema_version']} is newer than this "
                                       f"writer ({SCHEMA_VERSION})", log_path)
                try:
                    self.checksum = checksum_name(obj)
                except ValueError as exc:
                    raise ManifestError(str(exc), log_path, line=n) from None
                self.shard_bytes = int(obj.get("shard_bytes", self.shard_bytes))
            else:
                missing = [k for k in RECORD_FIELDS if k not in obj]
                if missing:
                    raise ManifestError(f"commit record lacks {missing}", log_path, line=n)
                self._line_starts.append(pos)
                self._records.append(obj)
        if not seen_header:
            raise ManifestError("commit log has no complete header line", log_path)
        cut_uncommitted(log_path)
        self._keys = set(self._records.keys)
        if len(self._keys) != len(self._records):
            raise ManifestError("a key is committed twice", log_path)
        self._truncate_shards()

    def _sample_bytes(self, seq_len: int) -> int:
        return len(self.layer_ids) * seq_len * self.hidden_size * self.dtype.itemsize

    def _truncate_shards(self) -> None:
        """Make the shard files match the records exactly (drop uncommitted bytes and shards)."""
        ends: dict[int, int] = {}
        for r in self._records:
            end = r["offset"] + self._sample_bytes(r["seq_len"])
            if r["offset"] != ends.get(r["shard"], 0):
                raise ManifestError(f"record {r['key']} is not contiguous in its shard", os.path.join(self.path, COMMIT_LOG))
            ends[r["shard"]] = end
        last = self._records[-1]["shard"] if self._records else 0
        for name in sorted(os.listdir(self.path)):
            if not (name.startswith("shard_") and name.endswith(".bin")):
                continue
            k = int(name[6:-4])
            p = os.path.join(self.path, name)
            size = os.path.getsize(p)
            if k > last:
                log.warning("%s: removing uncommitted shard", p)
                os.unlink(p)
                continue
            want = ends.get(k, 0)
            if size < want:
                raise CorruptShardError(f"holds {size} bytes but {want} are committed", p)
            if size > want:
                log.warning("%s: truncating %d uncommitted bytes", p, size - want)
                os.truncate(p, want)
        for k in ends:
            if not os.path.exists(os.path.join(self.path, shard_name(k))):
                raise CorruptShardError("committed shard is missing", os.path.join(self.path, shard_name(k)))
        fsync_dir(self.path)
        self._shard = last
        self._shard_size = self._writeback_from = ends.get(last, 0)

    # ---- writing --------------------------------------------------------------------------
    def _open_shard(self) -> int:
        if self._shard_fd is None:
            p = os.path.join(self.path, shard_name(self._shard))
            new = not os.path.exists(p)
            self._shard_fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
            if new:
                fsync_dir(self.path)
        return self._shard_fd

    def _close_shard(self, sync: bool = False) -> None:
        if self._shard_fd is not None:
            if sync and self._dirty:
                os.fdatasync(self._shard_fd)
            self._dirty = False
            os.close(self._shard_fd)
            self._shard_fd = None

    def write(self, key: str, acts: np.ndarray, meta: SampleMeta) -> dict:
        if self._closed:
            raise StorageError("writer is closed", self.path)
        acts = self._check(key, acts, meta)
        if key in self._keys or key in self._pending_keys:
            raise StorageError(f"key {key} is already stored; rollback() it before writing it again", self.path)
        nbytes = acts.nbytes
        if self._shard_size > 0 and self._shard_size + nbytes > self.shard_bytes:
            self._close_shard(sync=True)  # pending samples in it stay durable
            self._shard += 1
            self._shard_size = self._writeback_from = 0
        fd = self._open_shard()
        offset = self._shard_size
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            write_all(fd, acts)
        except Exception:
            try:  # bytes past the shard's end would break the finalized sizes
                os.ftruncate(fd, offset)
            except OSError:
                pass  # rollback() / reopening the store truncates them (_truncate_shards)
            raise
        self._dirty = True
        record = {
            "key": key, "shard": self._shard, "offset": offset, "seq_len": int(acts.shape[1]),
            "prompt_len": meta.prompt_len, "response_len": meta.response_len, "label": meta.label,
            "crc32": CHECKSUMS[self.checksum](acts.reshape(-1).view(np.uint8)),
        }
        self._pending.append((key, record))
        self._pending_keys.add(key)
        self._shard_size = offset + nbytes
        if self._shard_size - self._writeback_from >= WRITEBACK_BYTES:
            upto = self._shard_size & ~(_PAGE - 1)  # a partial page would be written twice
            start_writeback(fd, self._writeback_from, upto - self._writeback_from)
            self._writeback_from = upto
        return {
            "file_path": f"activations/{shard_name(self._shard)}",
            "byte_offset": offset,
            "shape": list(acts.shape),
            "dtype": self.dtype.name,
            "size_bytes": nbytes,
        }

    def commit(self, on_durable=None) -> None:
        if not self._pending:
            return
        if self._shard_fd is not None and self._dirty:
            os.fdatasync(self._shard_fd)
            self._dirty = False
            self._writeback_from = self._shard_size
        if on_durable is not None:
            on_durable()
        self._append_pending()
        self._pending_keys = set()

    def committed_keys(self) -> set[str]:
        return set(self._keys)

    def rollback(self, keep: set[str]) -> None:
        drop_at = tail_to_drop(self._records.keys, keep, "packed", self.path)
        if drop_at is None and not self._pending:
            return
        self._close_shard()
        if self._pending:
            log.info("%s: dropped %d uncommitted samples", self.path, len(self._pending))
            self._pending, self._pending_keys = [], set()
        if drop_at is not None:
            log_path = os.path.join(self.path, COMMIT_LOG)
            os.truncate(log_path, self._line_starts[drop_at])
            os.fsync(self._log_fd)
            log.info("%s: rolled back %d samples", self.path, len(self._records) - drop_at)
            self._records.truncate(drop_at)
            del self._line_starts[drop_at:]
        self._keys = set(self._records.keys)
        self._truncate_shards()

    # ---- finalize -------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self.commit()
        self._closed = True
        self._close_shard()
        os.close(self._log_fd)
        self._finalize()

    def _finalize(self) -> None:
        recs = self._records
        n = len(recs)
        col = recs.columns
        seq = np.asarray(col["seq_len"], np.int64)
        keys = [k.encode() for k in recs.keys]
        width = max([len(k) for k in keys] + [1])
        arrays = {
            "token_offsets": np.concatenate([[0], np.cumsum(seq)]).astype("<i8"),
            "shard_index": np.asarray(col["shard"]).astype("<i4"),
            "byte_offsets": np.asarray(col["offset"]).astype("<i8"),
            "prompt_len": np.asarray(col["prompt_len"]).astype("<i4"),
            "response_len": np.asarray(col["response_len"]).astype("<i4"),
            "label": np.asarray(col["label"]).astype("|i1"),
            "crc32": np.asarray(col["crc32"]).astype("<u4"),
            "sample_key": np.array(keys, f"|S{width}"),
        }
        num_shards = self._shard + 1 if os.path.exists(os.path.join(self.path, shard_name(self._shard))) else 0
        shards = []
        for k in range(num_shards):
            sel = arrays["shard_index"] == k
            shards.append({
                "file": shard_name(k),
                "num_samples": int(sel.sum()),
                "size_bytes": int(os.path.getsize(os.path.join(self.path, shard_name(k)))),
            })
        for name, a in arrays.items():
            atomic_save_npy(os.path.join(self.path, name + ".npy"), a)
        manifest = {
            "schema_version": SCHEMA_VERSION, "checksum": self.checksum, "format": FORMAT, "dtype": dtype_str(self.dtype),
            "layer_ids": self.layer_ids, "hidden_size": self.hidden_size, "num_samples": n,
            "num_tokens": int(seq.sum()), "shard_bytes": self.shard_bytes, "shards": shards,
            "index_arrays": {k: f"{k}.npy" for k in INDEX_ARRAYS},
            "created_unix": int(time.time()),
        }
        manifest["content_hash"] = hash_content(hashed_head(manifest), arrays)
        fsync_dir(self.path)
        atomic_write_json(os.path.join(self.path, MANIFEST), manifest)


class PackedReader(ExtentReader):
    """Reader of a finalized packed store. Index arrays load lazily per process (seed 004 §2.1)."""

    _unpicklable = ExtentReader._unpicklable + ("_ix",)

    @malformed_is_manifest_error
    def __init__(self, path, verify_hash: bool = True):
        self.path = os.fspath(path)
        mpath = os.path.join(self.path, MANIFEST)
        if not os.path.exists(mpath):
            if os.path.exists(os.path.join(self.path, COMMIT_LOG)):
                raise ManifestError(
                    "packed store was not finalized (its writer did not close); reopen it with "
                    "hallulog.storage.open_writer('packed', ...) and close() to recover", mpath)
            raise ManifestError("no manifest.json", mpath)
        try:
            with open(mpath) as f:
                m = json.load(f)
        except ValueError as e:
            raise ManifestError(f"unparsable JSON ({e})", mpath) from None
        old = () if m.get("schema_version", 0) >= 2 else ADDED_IN_SCHEMA_2
        missing = [k for k in MANIFEST_FIELDS if k not in m and k not in old]
        if missing or m.get("format") != FORMAT:
            raise ManifestError(f"not a {FORMAT} manifest (missing {missing})", mpath)
        if m["schema_version"] > SCHEMA_VERSION:
            raise ManifestError(f"schema_version {m['schema_version']} is newer than this reader ({SCHEMA_VERSION})", mpath)
        try:
            self.checksum = checksum_name(m)
        except ValueError as exc:
            raise ManifestError(str(exc), mpath) from None
        try:
            self.dtype = store_dtype(m["dtype"])
        except ValueError as exc:  # unknown, or not a floating point type
            raise ManifestError(str(exc), mpath) from None
        self.manifest = m
        self.layer_ids = list(m["layer_ids"])
        self.hidden_size = int(m["hidden_size"])
        self._n = int(m["num_samples"])
        self._mpath = mpath
        self._shard_files = [os.path.join(self.path, s["file"]) for s in m["shards"]]
        ix = self._load_index()
        self._check_sizes(ix)
        if verify_hash:
            got = hash_content(hashed_head(m), ix)
            if got != m["content_hash"]:
                raise ManifestError(f"content hash mismatch: manifest says {m['content_hash']}, index gives {got}", mpath)

    @malformed_is_manifest_error
    def _load_index(self) -> dict[str, np.ndarray]:
        ix = {}
        for name in INDEX_ARRAYS:
            p = os.path.join(self.path, self.manifest["index_arrays"][name])
            try:
                ix[name] = np.load(p, allow_pickle=False)
            except FileNotFoundError:
                raise ManifestError("index array is missing", p) from None
            except ValueError as e:
                raise ManifestError(f"unreadable index array ({e})", p) from None
            want = self._n + 1 if name == "token_offsets" else self._n
            if ix[name].shape != (want,):
                raise ManifestError(f"has shape {ix[name].shape}, manifest says {want} samples", p)
        ix["seq_len"] = np.diff(ix["token_offsets"])
        self._ix = ix
        return ix

    def _check_sizes(self, ix) -> None:
        per_token = self.num_layers * self.hidden_size * self.dtype.itemsize
        for k, s in enumerate(self.manifest["shards"]):
            sel = ix["shard_index"] == k
            expect = int((ix["seq_len"][sel] * per_token).sum())
            if expect != s["size_bytes"]:
                raise ManifestError(
                    f"shard {s['file']} should hold {expect} bytes for dtype {self.manifest['dtype']} "
                    f"and hidden_size {self.hidden_size}, but manifest says {s['size_bytes']}", self._mpath)
            p = self._shard_files[k]
            try:
                size = os.path.getsize(p)
            except FileNotFoundError:
                raise CorruptShardError("shard file is missing", p) from None
            if size != s["size_bytes"]:
                raise CorruptShardError(f"shard is {size} bytes, manifest says {s['size_bytes']} (truncated?)", p)

    @property
    def ix(self) -> dict[str, np.ndarray]:
        ix = self.__dict__.get("_ix")
        return ix if ix is not None else self._load_index()

    def __len__(self) -> int:
        return self._n

    def seq_len(self, i: int) -> int:
        return int(self.ix["seq_len"][i])

    def meta(self, i: int) -> dict:
        ix = self.ix
        return {
            "sample_key": ix["sample_key"][i].decode(),
            "seq_len": int(ix["seq_len"][i]),
            "prompt_len": int(ix["prompt_len"][i]),
            "response_len": int(ix["response_len"][i]),
            "label": int(ix["label"][i]),
        }

    def keys(self) -> list[str]:
        return [k.decode() for k in self.ix["sample_key"]]

    def _file_path(self, file_no: int) -> str:
        return self._shard_files[file_no]

    def _extent(self, i: int, layer: int) -> tuple[int, int]:
        ix = self.ix
        t = int(ix["seq_len"][i])
        return int(ix["shard_index"][i]), int(ix["byte_offsets"][i]) + layer * t * self.hidden_size * self.dtype.itemsize

    @malformed_is_manifest_error
    def verify(self) -> None:
        ix = self.ix
        for i in range(self._n):
            k = int(ix["shard_index"][i])
            buf = np.empty(self.num_layers * int(ix["seq_len"][i]) * self.hidden_size, self.dtype)
            self._read_into(k, int(ix["byte_offsets"][i]), buf)
            if CHECKSUMS[self.checksum](buf.view(np.uint8)) != int(ix["crc32"][i]):
                raise CorruptShardError(
                    f"checksum mismatch in sample {ix['sample_key'][i].decode()} at byte {int(ix['byte_offsets'][i])}",
                    self._shard_files[k])
