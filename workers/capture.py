"""Turn a backend's capture file into the rows a run stores.

Token alignment (docs/alignment.md): row j of a stored activation is the hidden state at one
input position, after the model has read that token. A capture file holds the positions
``0..num_tokens-1`` of prompt + response; with capture during generation the last response
token was never fed back, so there are ``P + R - 1`` positions; with prefill capture ``P + R``.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass

import numpy as np
from safetensors.numpy import load_file

__all__ = ["CaptureError", "CapturedRows", "load_capture", "select_rows", "discard_capture",
           "wait_for_capture"]


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
        if os.path.exists(lock_path):
            try:
                with open(lock_path, "rb") as lock:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_SH)
                    fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            except FileNotFoundError:
                pass
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


def load_capture(path: str, expected_token_ids: list[int], *, delete: bool = True,
                 timeout: float = 60.0) -> np.ndarray:
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
        raise CaptureError(f"{path}: hidden_states shape {hidden.shape} does not match "
                           f"{token_ids.shape[0]} token ids")
    if token_ids.tolist() != list(expected_token_ids):
        raise CaptureError(f"{path}: captured token ids differ from the generation's "
                           f"({token_ids.shape[0]} vs {len(expected_token_ids)} tokens)")
    return hidden


def _load(path: str) -> dict[str, np.ndarray]:
    try:
        return load_file(path)
    except FileNotFoundError:
        raise CaptureError(f"{path}: capture file not found") from None
    except Exception as exc:  # safetensors raises its own error types for truncated files
        if "bfloat16" in str(exc).lower():
            return _load_bf16(path)
        raise CaptureError(f"{path}: unreadable capture file: {exc}") from exc


def _load_bf16(path: str) -> dict[str, np.ndarray]:
    # numpy has no bfloat16: read through torch and widen to float32.
    from safetensors.torch import load_file as load_torch
    import torch

    tensors = load_torch(path)
    return {k: (v.to(torch.float32) if v.dtype == torch.bfloat16 else v).numpy()
            for k, v in tensors.items()}


def select_rows(hidden: np.ndarray, *, prompt_len: int, response_len: int, sequence_mode: str,
                layer_index: list[int] | None, dtype: str) -> CapturedRows:
    """Slice ``(num_tokens, num_layer_ids, hidden)`` by sequence mode → ``(L, rows, H)``.

    ``layer_index`` picks columns of the file's layer axis (None: all). ``num_tokens`` is
    ``prompt_len + response_len - 1`` (generation capture) or ``prompt_len + response_len``.
    """
    num_tokens = hidden.shape[0]
    if num_tokens not in (prompt_len + response_len - 1, prompt_len + response_len) \
            or prompt_len < 1:
        raise CaptureError(f"capture holds {num_tokens} positions for prompt {prompt_len} + "
                           f"response {response_len} tokens")
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
    rows = hidden[start:stop]
    if layer_index is not None:
        rows = rows[:, layer_index, :]
    acts = np.ascontiguousarray(np.transpose(rows, (1, 0, 2)).astype(dtype, copy=False))
    prompt_rows = max(0, min(stop, prompt_len) - start)
    return CapturedRows(acts=acts, row0_position=start, prompt_rows=prompt_rows,
                        response_rows=(stop - start) - prompt_rows)
