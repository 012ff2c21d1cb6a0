"""Output buffers of a DataLoader worker, in shared memory and reused once the main process let go.

A fresh shared-memory batch costs a shm file, a mapping and a page fault plus a kernel zeroing
per page (on a small VM more than reading the batch). So each worker keeps a few flat buffers
and a shared ``flags`` array, one int per buffer:

- the worker hands out a view of a buffer that no batch of its own still uses (its storage use
  count is back to the pool's own reference) and whose flag is 0;
- when the batch is pickled for the main process (the queue's feeder thread), the flag is set
  to 1 first: from then on only the main process may free it;
- the main process registers every batch it receives (``_received``, run by unpickling) and,
  each time one arrives, clears the flag of every earlier buffer nobody holds any more: its
  storage has no tensor left but the registration's own reference (views count too).

A batch that is never sent (another ``collate_fn`` copied it in the worker) frees its buffer by
the worker-side use count alone. When every buffer is taken, a fresh one is allocated.
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["WorkerBuffers", "LeasedBatch"]

_HELD: list[tuple[torch.Tensor, int, torch.UntypedStorage]] = []  # main process: (flags, i, storage)


def use_count(t) -> int:
    storage = t.untyped_storage() if isinstance(t, torch.Tensor) else t
    return torch._C._storage_Use_Count(storage._cdata)


class WorkerBuffers:
    """The buffers of one worker process (create it inside the worker)."""

    CAPACITY = 8

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.flags = torch.zeros(self.CAPACITY, dtype=torch.int32).share_memory_()
        self.buffers: list[tuple[torch.Tensor, int] | None] = [None] * self.CAPACITY

    def take(self, need: int, cap: int, dtype: torch.dtype) -> tuple[torch.Tensor, int | None]:
        """A flat shared tensor of at least ``need`` elements and its slot (None: not pooled)."""
        empty = None
        for i, entry in enumerate(self.buffers):
            if entry is None:
                empty = i if empty is None else empty
                continue
            flat, idle = entry
            if flat.dtype == dtype and flat.numel() >= need and self.flags[i] == 0 \
                    and use_count(flat) <= idle:
                return flat[:need], i
        flat = _new_shared(max(need, cap), dtype)
        if empty is None:
            return flat[:need], None
        self.buffers[empty] = (flat, use_count(flat))
        return flat[:need], empty


class LeasedBatch(dict):
    """A collated batch whose ``acts`` lives in buffer ``slot`` of a worker's pool; unpickled in
    the main process as a plain dict (and registered there)."""

    def __init__(self, collated: dict, flags: torch.Tensor, slot: int) -> None:
        super().__init__(collated)
        self.flags, self.slot = flags, slot

    def __reduce__(self):
        self.flags[self.slot] = 1  # sent: the main process frees it from now on
        return _received, (dict(self), self.flags, self.slot)


def _received(batch: dict, flags: torch.Tensor, slot: int) -> dict:
    """Main process, per batch received: free the buffers nobody holds, register this one."""
    keep = []
    for entry in _HELD:
        if use_count(entry[2]) <= 1:  # only the registration's own storage reference
            entry[0][entry[1]] = 0
        else:
            keep.append(entry)
    keep.append((flags, slot, batch["acts"].untyped_storage()))
    _HELD[:] = keep
    return batch


def _new_shared(numel: int, dtype: torch.dtype) -> torch.Tensor:
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,))


def numpy_dtype_to_torch(dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype
