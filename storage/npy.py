"""``npy``: one ``.npy`` per activation key plus ``activation_index.jsonl`` (seed 003 §6.4).

Normative description: docs/formats/npy.md. The run's workers write the index lines; this
module writes the arrays (``NpyWriter``) and reads a worker or consolidated directory
(``NpyReader``). A ``.npy`` file holds ``(L, T, H)`` in C order, so each layer is one
contiguous extent after the header and is read with one ``pread``.
"""

from __future__ import annotations

import io
import logging
import os

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.errors import MalformedLineError
from hallulog.contracts.jsonl import iter_lines
from hallulog.storage._io import fsync_dir, malformed_is_manifest_error, write_all
from hallulog.storage.base import ActivationWriter, ExtentReader, SampleMeta
from hallulog.storage.dtypes import as_container, container_dtype, store_dtype
from hallulog.storage.errors import CorruptShardError, ManifestError, StorageError

log = logging.getLogger(__name__)

__all__ = ["NpyWriter", "NpyReader", "INDEX_FILE", "index_line", "sample_bytes"]

INDEX_FILE = layout.ACTIVATION_INDEX
#: index fields the reader needs (docs/formats/npy.md, table "required index fields")
REQUIRED_FIELDS = ("activation_key", "file_path", "shape", "dtype")
#: index fields the reader uses when present (table "optional index fields")
OPTIONAL_FIELDS = (
    "prompt_id",
    "sample_id",
    "layers",
    "sequence_mode",
    "prompt_token_count",
    "response_token_count",
    "row0_position",
    "num_rows",
    "size_bytes",
    "worker_id",
    "label",
)
#: keys of the dict NpyWriter.write returns (table "writer location fields")
LOCATION_FIELDS = ("file_path", "shape", "dtype", "size_bytes")


def sample_bytes(
    *, layers: int, rows: float, hidden_size: int, itemsize: int, key_len: int
) -> float:
    """Bytes one stored sample costs (a projection): its array and the ``.npy`` header."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header,
        {
            "descr": np.lib.format.dtype_to_descr(np.dtype(f"f{itemsize}")),
            "fortran_order": False,
            "shape": (layers, max(1, round(rows)), hidden_size),
        },
    )
    return layers * rows * hidden_size * itemsize + len(header.getvalue())


class NpyWriter(ActivationWriter):
    """Writes ``{root}/activations/{key}.npy`` via ``.tmp``; ``commit`` fdatasyncs each pending
    ``.tmp`` once, renames them into place and fsyncs the directory once."""

    def __init__(self, path, layer_ids, hidden_size, dtype="float16"):
        self.path = os.fspath(path)
        self.layer_ids = [int(x) for x in layer_ids]
        self.hidden_size = int(hidden_size)
        self.dtype = store_dtype(dtype)
        os.makedirs(self.path, exist_ok=True)
        self._pending: dict[str, tuple[str, str]] = {}  # key -> (tmp, final), written, not synced
        for name in os.listdir(self.path):
            if name.endswith(".tmp"):
                log.warning("%s: removing uncommitted %s", self.path, name)
                os.unlink(os.path.join(self.path, name))

    def write(self, key: str, acts: np.ndarray, meta: SampleMeta) -> dict:
        acts = self._check(key, acts, meta)
        final = os.path.join(self.path, key + ".npy")
        tmp = final + ".tmp"
        if key in self._pending:
            raise StorageError(f"key {key} is already written in this group", self.path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            header = io.BytesIO()  # bfloat16: a '<u2' header (docs/formats/npy.md "dtype")
            np.lib.format.write_array_header_1_0(
                header, np.lib.format.header_data_from_array_1_0(as_container(acts))
            )
            write_all(fd, header.getvalue())
            write_all(fd, acts)
        finally:
            os.close(fd)  # reopened by commit(): a long conversion never holds many fds
        self._pending[key] = (tmp, final)
        return {
            "file_path": f"activations/{key}.npy",
            "shape": list(acts.shape),
            "dtype": self.dtype.name,
            "size_bytes": int(acts.nbytes),
        }

    def commit(self, on_durable=None) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        for tmp, _final in pending.values():
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        if on_durable is not None:
            on_durable()
        for key, (tmp, final) in pending.items():
            self._commit(key, {"tmp": tmp, "final": final})
        fsync_dir(self.path)

    def _commit(self, key: str, record: dict) -> None:
        os.replace(record["tmp"], record["final"])

    def committed_keys(self) -> set[str]:
        return {n[:-4] for n in os.listdir(self.path) if n.endswith(".npy")}

    def rollback(self, keep: set[str]) -> None:
        self._pending = {}
        for name in os.listdir(self.path):
            if name.endswith(".tmp") or (name.endswith(".npy") and name[:-4] not in keep):
                os.unlink(os.path.join(self.path, name))
        fsync_dir(self.path)

    def close(self) -> None:
        self.commit()


def index_line(key: str, meta: dict, layer_ids, hidden_size: int, dtype: np.dtype) -> dict:
    """The index line a converter writes for one sample (the run writes richer ones)."""
    t = int(meta["seq_len"])
    dtype = store_dtype(dtype)
    line = {}
    pid, _, sid = key.rpartition("_")
    if pid and sid.isdigit():
        line.update(prompt_id=pid, sample_id=int(sid))
    line.update(
        activation_key=key,
        layers=list(layer_ids),
        prompt_token_count=int(meta["prompt_len"]),
        response_token_count=int(meta["response_len"]),
        row0_position=0,
        num_rows=t,
        shape=[len(layer_ids), t, int(hidden_size)],
        dtype=dtype.name,
        size_bytes=len(layer_ids) * t * int(hidden_size) * dtype.itemsize,
        file_path=f"activations/{key}.npy",
        label=int(meta["label"]),
    )
    return line


def _lengths(e: dict, t: int) -> tuple[int, int]:
    """Prompt and response rows of a sample: see docs/formats/npy.md "Rows"."""
    if "prompt_token_count" not in e:
        return 0, t
    p = int(e["prompt_token_count"]) - int(e.get("row0_position", 0))
    p = max(0, min(p, t))
    return p, t - p


def _holds(header_dtype: np.dtype, dtype: np.dtype) -> bool:
    """A file's header dtype holds the index's dtype: the same, or for bfloat16 its ``<u2``
    container (or the ``V2`` that ``np.save`` writes for an ``ml_dtypes.bfloat16`` array)."""
    if header_dtype == dtype or header_dtype == container_dtype(dtype):
        return True
    return (
        container_dtype(dtype) != dtype
        and header_dtype.kind == "V"
        and header_dtype.itemsize == 2
        and header_dtype.names is None
    )


class NpyReader(ExtentReader):
    """Reads a directory holding ``activation_index.jsonl`` and ``activations/*.npy``."""

    _fd_per_read = True
    _unpicklable = ExtentReader._unpicklable + ("_hdr",)

    @malformed_is_manifest_error
    def __init__(self, path):
        self.path = os.fspath(path)
        ipath = os.path.join(self.path, INDEX_FILE)
        if not os.path.exists(ipath):
            raise ManifestError(f"no {INDEX_FILE}", ipath)
        entries: dict[str, dict] = {}
        shape0 = None
        try:
            for line in iter_lines(ipath):
                n, e = line.lineno, line.row
                missing = [k for k in REQUIRED_FIELDS if k not in e]
                if missing:
                    raise ManifestError(f"index line lacks {missing}", ipath, line=n)
                shape = e["shape"]
                if not (isinstance(shape, list) and len(shape) == 3):
                    raise ManifestError(f"shape {shape!r} is not [L, T, H]", ipath, line=n)
                layers = e.get("layers")
                layers = list(layers) if isinstance(layers, list) else list(range(shape[0]))
                sig = (shape[0], shape[2], e["dtype"], tuple(layers))
                if shape0 is None:
                    shape0 = sig
                elif sig != shape0:
                    raise ManifestError(
                        f"(L, H, dtype, layers) = {sig[:3]} differs from the first line's {shape0[:3]}",
                        ipath,
                        line=n,
                    )
                if e["activation_key"] in entries:
                    log.warning(
                        "%s:%d: %s appears again; the last line wins", ipath, n, e["activation_key"]
                    )
                    entries.pop(e["activation_key"])
                entries[e["activation_key"]] = e
        except MalformedLineError as err:
            raise ManifestError(f"unparsable JSON ({err.what})", ipath, line=err.line) from None
        self._entries = list(entries.values())
        if shape0 is None:
            self.layer_ids, self.hidden_size, self.dtype = [], 0, np.dtype("float16")
        else:
            self.layer_ids, self.hidden_size = list(shape0[3]), int(shape0[1])
            try:
                self.dtype = store_dtype(shape0[2])
            except ValueError as exc:
                raise ManifestError(str(exc), ipath) from None
        self._seq = np.array([e["shape"][1] for e in self._entries], np.int64)
        self._files = [os.path.join(self.path, e["file_path"]) for e in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def seq_len(self, i: int) -> int:
        return int(self._seq[i])

    def meta(self, i: int) -> dict:
        e = self._entries[i]
        t = int(self._seq[i])
        p, r = _lengths(e, t)
        label = e.get("label", e.get("hallu_label", -1))
        return {
            "sample_key": e["activation_key"],
            "seq_len": t,
            "prompt_len": p,
            "response_len": r,
            "label": -1 if label is None else int(label),
        }

    def keys(self) -> list[str]:
        return [e["activation_key"] for e in self._entries]

    def _file_path(self, file_no: int) -> str:
        return self._files[file_no]

    def _header_offset(self, i: int) -> int:
        hdr = self.__dict__.setdefault("_hdr", {})
        off = hdr.get(i)
        if off is not None:
            return off
        path = self._files[i]
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                off = f.tell()
        except FileNotFoundError:
            raise CorruptShardError("data file is missing", path) from None
        except ValueError as e:
            raise CorruptShardError(f"not a .npy file ({e})", path) from None
        want = tuple(self._entries[i]["shape"])
        if tuple(shape) != want or not _holds(dtype, self.dtype) or fortran:
            raise CorruptShardError(
                f"holds {shape} {dtype}{' fortran-order' if fortran else ''}, index says {list(want)} {self.dtype}",
                path,
            )
        hdr[i] = off
        return off

    def _extent(self, i: int, layer: int) -> tuple[int, int]:
        off = self._header_offset(i)
        return i, off + layer * int(self._seq[i]) * self.hidden_size * self.dtype.itemsize

    def verify(self) -> None:
        for i in range(len(self)):
            off = self._header_offset(i)
            want = (
                off + self.num_layers * int(self._seq[i]) * self.hidden_size * self.dtype.itemsize
            )
            size = os.path.getsize(self._files[i])
            if size != want:
                raise CorruptShardError(
                    f"is {size} bytes, expected {want} (truncated?)", self._files[i]
                )
