"""Turn a backend's capture file into the rows a run stores (reading the file:
``workers/capture_file.py``, whose names are re-exported here).

Token alignment (docs/alignment.md): row j of a stored activation is the hidden state at one
input position, after the model has read that token. A capture file holds the positions
``0..num_tokens-1`` of prompt + response; with capture during generation the last response
token was never fed back, so there are ``P + R - 1`` positions; with prefill capture ``P + R``.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from hallulog.contracts.capture_rows import CAPTURE_ROWS, capture_span
from hallulog.workers.capture_file import (
    CaptureError,
    CaptureFile,
    discard_capture,
    load_capture,
    open_capture,
    wait_for_capture,
)

__all__ = [
    "CaptureError",
    "CapturedRows",
    "load_capture",
    "open_capture",
    "CaptureFile",
    "select_rows",
    "transpose_cast",
    "discard_capture",
    "wait_for_capture",
]


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


def select_rows(
    hidden: np.ndarray | CaptureFile,
    *,
    prompt_len: int,
    response_len: int,
    sequence_mode: str,
    layer_index: list[int] | None,
    dtype: str,
) -> CapturedRows:
    """Slice ``(num_tokens, num_layer_ids, hidden)`` by sequence mode → ``(L, rows, H)``: the
    rows of the one row-slicing rule, ``contracts/capture_rows.py`` ``capture_span`` (a
    sequence mode is the capture-rows value of the same name).

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
    if sequence_mode not in CAPTURE_ROWS:
        raise CaptureError(f"unknown sequence mode {sequence_mode!r}")
    start, stop = capture_span(sequence_mode, prompt_len=prompt_len, num_tokens=num_tokens)
    acts = transpose_cast(hidden[start:stop], layer_index, dtype)
    prompt_rows = max(0, min(stop, prompt_len) - start)
    return CapturedRows(
        acts=acts,
        row0_position=start,
        prompt_rows=prompt_rows,
        response_rows=(stop - start) - prompt_rows,
    )


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

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
