"""Output buffers of a DataLoader worker, in shared memory and reused once the main process let go.

A fresh shared-memory batch costs a shm file, a mapping and a page fault plus a kernel zeroing
per page (on a small VM more than reading the batch), and every tensor of a batch sent through
the worker queue costs a shm file of its own and a file-descriptor handover. So each worker
keeps a few flat shared buffers, the first element of each a flag (the batch's ``acts`` is a
view after it), and sends a batch as ``acts`` plus its small columns as numpy arrays:

- the worker hands out a buffer that no batch of its own still uses (its storage use count is
  back to the pool's own reference) and whose flag is 0;
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
from hallulog.storage._padding import StaleRanges

__all__ = ["WorkerBuffers", "SharedBatch", "use_count", "numpy_dtype_to_torch"]

_HEAD = 64 // 2  # elements before the data: the flag, and 64-byte alignment for 2-byte dtypes
_HELD: list[tuple[torch.UntypedStorage, torch.dtype]] = []  # main process: received, not freed


def use_count(t) -> int:
    storage = t.untyped_storage() if isinstance(t, torch.Tensor) else t
    return torch._C._storage_Use_Count(storage._cdata)


def numpy_dtype_to_torch(dtype) -> torch.dtype:
    from hallulog.storage.dtypes import BFLOAT16

    if np.dtype(dtype) == BFLOAT16:  # torch.from_numpy knows no ml_dtypes
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype


class WorkerBuffers:
    """The buffers of one worker process (create it inside the worker)."""

    CAPACITY = 8

    def __init__(self) -> None:
        self.pid = os.getpid()
        # (flat buffer, its idle use count, the stale ranges of its data part)
        self.buffers: list[tuple[torch.Tensor, int, StaleRanges]] = []

    def take(self, need: int, cap: int, dtype: torch.dtype) -> tuple[torch.Tensor, StaleRanges]:
        """A flat shared tensor of ``need`` elements (a view after the buffer's flag) and the
        ranges of it that may hold bytes of an earlier batch."""
        for flat, idle, stale in self.buffers:
            # The use count first, the flag after: the queue's feeder thread sets the flag while
            # it pickles a batch and lets go of the batch after, so a count back to idle means
            # the flag already says whether the main process holds the buffer. Read the other
            # way round, the feeder could send the batch between the two reads.
            if (
                flat.dtype == dtype
                and flat.numel() >= _HEAD + need
                and use_count(flat) <= idle
                and flat[0] == 0
            ):
                return flat[_HEAD : _HEAD + need], stale
        nbytes = (_HEAD + max(need, cap)) * torch.empty(0, dtype=dtype).element_size()
        flat = torch.empty(0, dtype=dtype).set_(torch.UntypedStorage._new_shared(nbytes))
        flat[0] = 0
        stale = StaleRanges(max(need, cap))
        if len(self.buffers) < self.CAPACITY:
            self.buffers.append((flat, use_count(flat), stale))
        return flat[_HEAD : _HEAD + need], stale


class SharedBatch(dict):
    """A collated batch built in a worker; unpickled in the main process as a plain dict whose
    ``acts`` shares the worker's buffer (registered there) and whose other tensors came as numpy
    arrays (no shared memory of their own)."""

    def __reduce__(self):
        acts = self["acts"]
        pooled = acts.storage_offset() == _HEAD
        if pooled:
            _flag(acts.untyped_storage(), acts.dtype)[0] = 1  # sent: the main process frees it
        small = {k: v.numpy() for k, v in self.items() if k != "acts"}
        return _received, (acts, small, pooled)


def _flag(storage: torch.UntypedStorage, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(0, dtype=dtype).set_(storage, 0, (1,))


def _received(acts: torch.Tensor, small: dict, pooled: bool) -> dict:
    """Main process, per batch received: free the buffers nobody holds, register this one."""
    if pooled:
        keep = []
        for storage, dtype in _HELD:
            if use_count(storage) <= 1:  # only the registration's own reference
                _flag(storage, dtype)[0] = 0
            else:
                keep.append((storage, dtype))
        keep.append((acts.untyped_storage(), acts.dtype))
        _HELD[:] = keep
    return {"acts": acts, **{k: torch.from_numpy(v) for k, v in small.items()}}
