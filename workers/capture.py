"""Turn a backend's capture file into the rows a run stores.

Token alignment (docs/alignment.md): row j of a stored activation is the hidden state at one
input position, after the model has read that token. A capture file holds the positions
``0..num_tokens-1`` of prompt + response; with capture during generation the last response
token was never fed back, so there are ``P + R - 1`` positions; with prefill capture ``P + R``.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os
import threading
import time
import warnings
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import orjson

__all__ = [
    "CaptureError",
    "CapturedRows",
    "load_capture",
    "select_rows",
    "transpose_cast",
    "discard_capture",
    "wait_for_capture",
]


class CaptureError(RuntimeError):
    """A capture file is missing or disagrees with the generation it belongs to."""


@dataclass
class CapturedRows:
    """Activations of one generation, ready for the store."""

    acts: np.ndarray
    """(num_layers, num_rows, hidden) in the run dtype."""
    row0_position: int
    """Absolute token position (in prompt + response) of row 0."""
    prompt_rows: int
    """How many rows are prompt positions."""
    response_rows: int
    """How many rows are response positions."""


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
    """Read a capture file, check its token ids, return ``(num_tokens, num_layer_ids, hidden)``.

    The spool file is deleted after reading (the server never deletes it).
    """
    try:
        wait_for_capture(path, timeout)
        tensors = _load(path)
    finally:
        if delete:
            discard_capture(path)
    hidden, token_ids = tensors.get("hidden_states"), tensors.get("token_ids")
    if hidden is None or token_ids is None:
        raise CaptureError(f"{path}: capture file lacks hidden_states or token_ids")
    if hidden.ndim != 3 or hidden.shape[0] != token_ids.shape[0]:
        raise CaptureError(
            f"{path}: hidden_states shape {hidden.shape} does not match "
            f"{token_ids.shape[0]} token ids"
        )
    if token_ids.tolist() != list(expected_token_ids):
        raise CaptureError(
            f"{path}: captured token ids differ from the generation's "
            f"({token_ids.shape[0]} vs {len(expected_token_ids)} tokens)"
        )
    return hidden


#: safetensors dtype names this module maps without a copy. BF16 (what vLLM writes for a bf16
#: model) is ml_dtypes' numpy bfloat16: copied as is into a bfloat16 store, else cast once, by
#: torch, into the stored dtype.
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
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _load(path: str) -> dict[str, np.ndarray]:
    """The file's tensors as read-only arrays over a mapping of the file (no copy).

    The mapping is populated at once (``MAP_POPULATE``: no page fault per page) and outlives the
    file's unlink until the arrays are dropped. The layout is safetensors' own: an 8-byte
    little-endian header length, a JSON header, the data.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise CaptureError(f"{path}: capture file not found") from None
    try:
        size = os.fstat(fd).st_size
        if size < 8:
            raise CaptureError(f"{path}: unreadable capture file: {size} bytes")
        mapped = mmap.mmap(
            fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ
        )
    finally:
        os.close(fd)
    try:
        return _parse(mapped, size)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise CaptureError(f"{path}: unreadable capture file: {exc}") from exc


def _parse(mapped: mmap.mmap, size: int) -> dict[str, np.ndarray]:
    head_len = int.from_bytes(mapped[:8], "little")
    if head_len > size - 8:
        raise ValueError(f"header of {head_len} bytes in a file of {size}")
    header = orjson.loads(mapped[8 : 8 + head_len])
    base, tensors = 8 + head_len, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"tensor {name}: dtype {info['dtype']}")
        dtype, shape = np.dtype(_DTYPES[info["dtype"]]), [int(n) for n in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        count = math.prod(shape)
        if end - begin != count * dtype.itemsize or begin < 0 or base + end > size:
            raise ValueError(
                f"tensor {name}: bytes [{begin}, {end}) do not hold {shape} "
                f"{info['dtype']} in a file of {size} (truncated?)"
            )
        tensors[name] = np.frombuffer(mapped, dtype, count, base + begin).reshape(shape)
    return tensors


def select_rows(
    hidden: np.ndarray,
    *,
    prompt_len: int,
    response_len: int,
    sequence_mode: str,
    layer_index: list[int] | None,
    dtype: str,
) -> CapturedRows:
    """Slice ``(num_tokens, num_layer_ids, hidden)`` by sequence mode → ``(L, rows, H)``.

    ``layer_index`` picks columns of the file's layer axis (None: all). ``num_tokens`` is
    ``prompt_len + response_len - 1`` (generation capture) or ``prompt_len + response_len``.
    """
    num_tokens = hidden.shape[0]
    if (
        num_tokens not in (prompt_len + response_len - 1, prompt_len + response_len)
        or prompt_len < 1
    ):
        raise CaptureError(
            f"capture holds {num_tokens} positions for prompt {prompt_len} + "
            f"response {response_len} tokens"
        )
    if sequence_mode == "all":
        start, stop = 0, num_tokens
    elif sequence_mode == "prompt":
        start, stop = 0, prompt_len
    elif sequence_mode == "response":
        start, stop = prompt_len - 1, num_tokens
    elif sequence_mode == "last":
        start, stop = num_tokens - 1, num_tokens
    else:
        raise CaptureError(f"unknown sequence mode {sequence_mode!r}")
    acts = transpose_cast(hidden[start:stop], layer_index, dtype)
    prompt_rows = max(0, min(stop, prompt_len) - start)
    return CapturedRows(
        acts=acts,
        row0_position=start,
        prompt_rows=prompt_rows,
        response_rows=(stop - start) - prompt_rows,
    )


#: Casts of at least this many elements go through torch (below it numpy is fast enough, and a
#: worker that only stores small slices never imports torch: ~1 s and ~150 MB per process).
TORCH_CAST_MIN = 1 << 18
#: torch runs an elementwise copy of fewer elements than its grain size (32768) on the calling
#: thread: blocks below it keep the cast single-threaded, whatever torch's thread pool is (on a
#: busy machine a two-thread parallel region took 10-30x longer than one thread; the worker
#: runs several casts at once on its own threads anyway).
_TORCH_BLOCK = 32767


def transpose_cast(rows: np.ndarray, layer_index: list[int] | None, dtype: str) -> np.ndarray:
    """``(T, L, H)`` → C-contiguous ``(L', T, H)`` in ``dtype``, written once into its output.

    ``dtype``: ``float16``, ``float32`` or ``bfloat16`` (an ``ml_dtypes.bfloat16`` array).
    ``layer_index`` picks L' of the L layer columns (None: all). The output is allocated once
    and each layer is copied (and cast) straight into its place: no intermediate array.

    Rows already in ``dtype`` (a bfloat16 capture into a bfloat16 store) are not cast: their
    bytes are copied (as uint16 words for bfloat16, which numpy would copy element by element).
    numpy casts float32→float16 one element at a time (~8 ns each); torch's vectorised cast is
    20-40× faster and rounds the same way (IEEE round to nearest even: bit-identical for every
    non-NaN value; a NaN stays a NaN, torch may change its payload), so large float32→float16 casts
    use it, and so do large casts from or to bfloat16 (ml_dtypes' numpy casts, which also round
    to nearest even, go element by element too).
    """
    src_layers = range(rows.shape[1]) if layer_index is None else layer_index
    out = np.empty((len(src_layers), rows.shape[0], rows.shape[2]), _out_dtype(dtype))
    if rows.dtype == out.dtype:
        src, dst = (
            (rows.view(np.uint16), out.view(np.uint16)) if out.dtype == _BFLOAT16 else (rows, out)
        )
        for j, layer in enumerate(src_layers):
            np.copyto(dst[j], src[:, layer, :])
    elif out.size >= TORCH_CAST_MIN and (
        rows.dtype == _BFLOAT16
        or out.dtype == _BFLOAT16
        or (rows.dtype == np.float32 and out.dtype == np.float16)
    ):
        _torch_copy(rows, src_layers, out)
    else:
        for j, layer in enumerate(src_layers):
            np.copyto(out[j], rows[:, layer, :], casting="unsafe")
    return out


def _out_dtype(dtype) -> np.dtype:
    """The store dtype by name (``bfloat16`` is ml_dtypes'), or as a numpy dtype."""
    return _BFLOAT16 if isinstance(dtype, str) and dtype == "bfloat16" else np.dtype(dtype)


def _bf16_tensor(array: np.ndarray):
    """A torch view of an array, bfloat16 included (torch.from_numpy knows no ml_dtypes: the
    same bits, viewed)."""
    import torch

    if array.dtype == _BFLOAT16:
        return _readonly_tensor(array.view(np.uint16)).view(torch.bfloat16)
    return _readonly_tensor(array)


def _torch_copy(rows: np.ndarray, src_layers, out: np.ndarray) -> None:
    import torch

    src = _bf16_tensor(rows)
    dst = _bf16_tensor(out)
    # torch casts between bfloat16 and float16 in scalar code (bf16→f16 was ~3x slower than
    # either half of the way through float32; f16→bf16 is 2x slower here, torch 2.13): each
    # (token block, layer) goes through a float32 scratch first
    widen = {src.dtype, dst.dtype} == {torch.bfloat16, torch.float16}
    step = max(1, _TORCH_BLOCK // max(1, rows.shape[2]))
    in_order = widen and _foreach_copies_in_order()
    scratch = (
        _scratch(step * rows.shape[2] * (1 if in_order else len(src_layers))) if widen else None
    )
    dst_blocks, src_blocks = [], []
    for d, s in zip(dst.split(step, 1), src.split(step, 0)):  # token blocks, then layers
        src_by_layer = s.unbind(1)
        layers = [src_by_layer[layer] for layer in src_layers]
        if in_order:  # one scratch of one layer's block, filled and emptied pair after pair
            hot = scratch[: d[0].numel()].view(d[0].shape)
            for d_layer, layer in zip(d.unbind(0), layers):
                dst_blocks += (hot, d_layer)
                src_blocks += (layer, hot)
        elif widen:
            wide = scratch[: d.numel()].view(d.shape).unbind(0)
            torch._foreach_copy_(wide, layers)
            torch._foreach_copy_(d.unbind(0), wide)
        else:
            dst_blocks += d.unbind(0)
            src_blocks += layers
    if dst_blocks:
        torch._foreach_copy_(dst_blocks, src_blocks)  # one call, each block copied inline


_in_order: bool | None = None


def _foreach_copies_in_order() -> bool:
    """Whether ``torch._foreach_copy_`` copies its pairs one after the other, in list order.

    It does on CPU (a loop of ``copy_``), which lets a bf16 cast reuse one scratch of 0.1 MB,
    still in cache, for every layer: 2x faster than widening all layers of a block into a
    scratch of several MB first. Probed once per process; the wide scratch is the fallback.
    """
    global _in_order
    if _in_order is None:
        import torch

        hot, first, second = torch.zeros(4), torch.zeros(4), torch.zeros(4)
        torch._foreach_copy_(
            [hot, first, hot, second], [torch.ones(4), hot, torch.full((4,), 2.0), hot]
        )
        _in_order = bool((first == 1).all() and (second == 2).all())
    return _in_order


_scratch_of_thread = threading.local()


def _scratch(numel: int):
    """This thread's float32 scratch of at least ``numel`` elements (one token block of one
    layer, 128 KB; of every layer where copies may not run in order), kept for the next cast."""
    import torch

    have = getattr(_scratch_of_thread, "tensor", None)
    if have is None or have.numel() < numel:
        have = _scratch_of_thread.tensor = torch.empty(numel, dtype=torch.float32)
    return have


_first_readonly = threading.Lock()
_readonly_seen = False


def _readonly_tensor(array: np.ndarray):
    """``torch.from_numpy`` of an array that is only read (a mapped capture file): torch warns
    once per process that it cannot mark the tensor read-only; that first warning is muted."""
    import torch

    global _readonly_seen
    if array.flags.writeable or _readonly_seen:
        return torch.from_numpy(array)
    with _first_readonly, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.from_numpy(array)
        _readonly_seen = True
    return tensor
