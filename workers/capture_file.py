"""Read a backend's capture file (the spool protocol, docs/vllm.md): wait for its writer, check
its safetensors header and token ids, read the rows asked for; delete it.

A capture file holds ``hidden_states [num_rows, num_layer_ids, hidden]`` and ``token_ids
[num_rows]``: the positions ``row0 .. row0 + num_rows - 1`` of prompt + response, ``row0`` from
its safetensors ``__metadata__`` (0 when absent: a server that writes every position;
``contracts/capture_rows.py``). Rows are addressed by absolute position. Which rows a run keeps,
and their cast, is ``workers/capture.py``'s.
"""

from __future__ import annotations

import fcntl
import math
import os
import time
import weakref

import ml_dtypes
import numpy as np
import orjson
from hallulog.contracts.capture_rows import row0_metadata
from hallulog.contracts.errors import HallulogError

__all__ = [
    "CaptureError",
    "CaptureFile",
    "open_capture",
    "load_capture",
    "discard_capture",
    "wait_for_capture",
]


class CaptureError(HallulogError, RuntimeError):
    """A capture file is missing or disagrees with the generation it belongs to."""


def wait_for_capture(path: str, timeout: float = 60.0) -> None:
    """Wait until the backend has finished writing ``path``.

    vLLM may answer before its connector wrote the file (the write happens in the next engine
    step); the writer holds an exclusive ``flock`` on ``path + ".lock"`` while writing and
    renames the data into place, so: take the lock shared, then expect the file.
    """
    deadline = time.monotonic() + timeout
    lock_path = path + ".lock"
    while True:
        try:  # a bare descriptor: a file object costs three more syscalls per capture
            lock = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
        else:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH)  # returns once the writer has let go
            finally:
                os.close(lock)  # releases the shared lock
        if os.path.exists(path):
            return
        if time.monotonic() > deadline:
            raise CaptureError(f"{path}: capture file not written within {timeout:.0f} s")
        time.sleep(0.02)


def discard_capture(path: str | None) -> None:
    """Delete a capture file and its lock file (the servers never delete them)."""
    if not path:
        return
    for leftover in (path, path + ".lock"):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass


def load_capture(
    path: str, expected_token_ids: list[int], *, delete: bool = True, timeout: float = 60.0
) -> np.ndarray:
    """Read a capture file, check its token ids, return the rows it holds ``(num_rows,
    num_layer_ids, hidden)``: positions ``row0 ..`` (every position of a file without ``row0``).

    The spool file is deleted after reading (the server never deletes it). To read only the
    rows a run keeps, use :func:`open_capture` and slice it.
    """
    with open_capture(path, expected_token_ids, delete=delete, timeout=timeout) as capture:
        return capture[capture.row0 : capture.row0 + capture.num_rows]


def open_capture(
    path: str, expected_token_ids: list[int], *, delete: bool = True, timeout: float = 60.0
) -> CaptureFile:
    """Open a capture file, check its header and token ids; its rows are read when sliced.

    ``expected_token_ids`` are the ids of every position the capture covers (prompt + response,
    less the last with generation capture); the file's must equal ``expected[row0:row0 +
    num_rows]``. The capture's ``shape[0]`` is then ``len(expected_token_ids)`` and a row the file
    does not hold raises :class:`CaptureError` when sliced.

    With ``delete`` the spool file is unlinked at once (the open descriptor still reads it):
    the server never deletes it, and a worker that dies from now on leaves nothing behind.
    """
    try:
        wait_for_capture(path, timeout)
        capture = CaptureFile(path)
    finally:
        if delete:
            discard_capture(path)
    try:
        capture.check_token_ids(expected_token_ids)
    except BaseException:
        capture.close()
        raise
    return capture


#: safetensors dtype names this module reads. BF16 (what vLLM writes for a bf16 model) is
#: ml_dtypes' numpy bfloat16: copied as is into a bfloat16 store, else cast once, by torch,
#: into the stored dtype.
_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": ml_dtypes.bfloat16,
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}


class CaptureFile:
    """A capture file's ``hidden_states`` ``(num_tokens, num_layer_ids, hidden)``, read on
    demand: ``capture[a:b]`` (a slice along the token axis, in absolute positions) or
    ``capture[index_array]`` is read from the file into a new array with ``pread``, and nothing
    else of the file is. The file holds positions ``row0 .. row0 + num_rows - 1``; ``shape[0]``
    is ``row0 + num_rows`` until :meth:`check_token_ids` sets it to the whole capture's length.

    Only the rows a run keeps are read (the response rows of a ``response`` run, a few named
    positions). Mapping the whole file instead (``mmap`` with ``MAP_POPULATE``, then
    ``munmap``) cost a worker more CPU in page-table work than copying the bytes it keeps
    (docs/performance.md, "Ingest, the path"). Use as a context manager or :meth:`close` it;
    the descriptor is also closed when the object is dropped.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CaptureError(f"{path}: capture file not found") from None
        self._closer = weakref.finalize(self, os.close, self._fd)
        try:
            self._tensors = self._header()
            if "hidden_states" not in self._tensors or "token_ids" not in self._tensors:
                raise CaptureError(f"{path}: capture file lacks hidden_states or token_ids")
            _, self.dtype, shape = self._tensors["hidden_states"]
            num_ids = math.prod(self._tensors["token_ids"][2])
            if len(shape) != 3 or shape[0] != num_ids:
                raise CaptureError(
                    f"{path}: hidden_states shape {shape} does not match {num_ids} token ids"
                )
        except BaseException:
            self.close()
            raise
        self.num_rows = shape[0]
        self.shape = (self.row0 + shape[0], *shape[1:])
        self._row_bytes = self.shape[1] * self.shape[2] * self.dtype.itemsize

    def _header(self) -> dict[str, tuple[int, np.dtype, tuple[int, ...]]]:
        """Each tensor's (file offset, dtype, shape), checked against the file's size. The
        layout is safetensors' own: an 8-byte little-endian header length, a JSON header, the
        data."""
        try:
            size = os.fstat(self._fd).st_size
            if size < 8:
                raise ValueError(f"{size} bytes")
            head_len = int.from_bytes(os.pread(self._fd, 8, 0), "little")
            if head_len > size - 8:
                raise ValueError(f"header of {head_len} bytes in a file of {size}")
            header = orjson.loads(os.pread(self._fd, head_len, 8))
            self.row0 = row0_metadata(header.get("__metadata__"))
            base, tensors = 8 + head_len, {}
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if info["dtype"] not in _DTYPES:
                    raise ValueError(f"tensor {name}: dtype {info['dtype']}")
                dtype = np.dtype(_DTYPES[info["dtype"]])
                shape = tuple(int(n) for n in info["shape"])
                begin, end = (int(x) for x in info["data_offsets"])
                if (
                    end - begin != math.prod(shape) * dtype.itemsize
                    or begin < 0
                    or base + end > size
                ):
                    raise ValueError(
                        f"tensor {name}: bytes [{begin}, {end}) do not hold {list(shape)} "
                        f"{info['dtype']} in a file of {size} (truncated?)"
                    )
                tensors[name] = (base + begin, dtype, shape)
            return tensors
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise CaptureError(f"{self.path}: unreadable capture file: {exc}") from exc

    def token_ids(self) -> np.ndarray:
        """The file's ``token_ids``, of positions ``row0 ..`` (read whole: a few bytes each)."""
        offset, dtype, shape = self._tensors["token_ids"]
        return self._read(offset, dtype, shape)

    def check_token_ids(self, expected: list[int]) -> None:
        """Check the file's token ids against ``expected[row0:row0 + num_rows]`` (``expected``:
        every position of the capture), then take ``len(expected)`` as the capture's length."""
        ids = self.token_ids().tolist()
        end = self.row0 + self.num_rows
        if end > len(expected) or ids != list(expected[self.row0 : end]):
            raise CaptureError(
                f"{self.path}: captured token ids differ from the generation's (the file's "
                f"{self.num_rows} from position {self.row0} against {len(expected)} tokens)"
            )
        self.shape = (len(expected), *self.shape[1:])

    def __getitem__(self, key: slice | np.ndarray) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step != 1:
                raise IndexError("capture rows are read in contiguous slices")
            stop = max(start, stop)
            if stop > start and (start < self.row0 or stop > self.row0 + self.num_rows):
                raise CaptureError(
                    f"{self.path}: positions {start}..{stop - 1} asked for, the file holds "
                    f"{self.row0}..{self.row0 + self.num_rows - 1}"
                )
            offset, dtype, _ = self._tensors["hidden_states"]
            return self._read(
                offset + (start - self.row0) * self._row_bytes,
                dtype,
                (stop - start, *self.shape[1:]),
            )
        index = np.asarray(key, np.intp)  # a gather: each run of consecutive rows read once
        out = np.empty((len(index), *self.shape[1:]), self.dtype)
        i = 0
        while i < len(index):
            j = i + 1
            while j < len(index) and index[j] == index[j - 1] + 1:
                j += 1
            out[i:j] = self[int(index[i]) : int(index[j - 1]) + 1]
            i = j
        return out

    def _read(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(shape, dtype)
        view = memoryview(out.reshape(-1).view(np.uint8))
        done = 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n == 0:
                raise CaptureError(f"{self.path}: unreadable capture file: it ended early")
            done += n
        return out

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._closer()

    def __enter__(self) -> CaptureFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
