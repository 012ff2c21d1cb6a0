"""The PyTorch side: a Dataset for the probe-training read pattern and its collate function.

The DataLoader path reads whole batches: ``DataLoader`` calls ``__getitems__(indices)`` with the
sampler's index batch, which issues ONE ``read_pairs_into`` for every (sample, layer) extent of
the batch straight into the padded ``(B, k, T_max, H)`` output (no per-item tensors, no second
copy in ``collate_pairs``). Outputs come from a few buffers reused once nobody holds a view of
them any more: a fresh 50 MB buffer would cost a page fault and a kernel zeroing per page, which
is more than the read itself. In the main process (``num_workers=0``) that is a small pool; in a
DataLoader worker, buffers in shared memory that the main process hands back when it has let go
of a batch (``_worker_buffers``), so a batch crosses to the main process without a copy and
without a fresh allocation. A reused buffer zeroes only the padding an earlier batch left bytes
in (``_padding.StaleRanges``), not all of it. File handles are opened lazily in each process
(after fork); ``pin_memory=True`` allocates the output pinned (main process, CUDA builds only).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
from hallulog.storage._layer_draw import draw_layers
from hallulog.storage._padding import StaleRanges
from hallulog.storage._worker_buffers import (
    SharedBatch,
    WorkerBuffers,
    numpy_dtype_to_torch,
    use_count,
)
from hallulog.storage.base import ActivationReader
from hallulog.storage.dtypes import as_container, to_numpy, to_tensor
from hallulog.storage.registry import open_store
from torch.utils.data import Dataset

__all__ = ["ActivationPairsDataset", "collate_pairs"]

_SCALARS = ("label", "seq_len", "prompt_len", "response_len", "index")


class ActivationPairsDataset(Dataset):
    """index -> one sample at ``layers_per_sample`` distinct random layers, all tokens.

    The layers come from :func:`hallulog.storage._layer_draw.draw_layers`, a counter-based draw keyed by
    (seed, epoch, index): the same for a given (seed, epoch, index) whatever the worker count,
    start method or batch. ``set_epoch`` changes them.
    The reader opens its files lazily in each DataLoader worker and is dropped from pickles.

    Item: ``acts`` (k, T, H) tensor, ``layers`` (k,) layer ids, ``layer_pos`` (k,) positions,
    ``label``, ``seq_len``, ``prompt_len``, ``response_len``, ``index``. With a DataLoader and
    ``collate_pairs`` a batch is read at once (``__getitems__``).
    """

    def __init__(
        self,
        store,
        layers_per_sample: int = 2,
        seed: int = 0,
        layer_positions=None,
        pin_memory: bool = False,
    ):
        self.store_path = store.path if isinstance(store, ActivationReader) else os.fspath(store)
        self._reader = store if isinstance(store, ActivationReader) else None
        self.layers_per_sample = int(layers_per_sample)
        self.seed = int(seed)
        self.epoch = 0
        self.pin_memory = bool(pin_memory)
        r = self.reader
        self.layer_positions = (
            np.arange(r.num_layers) if layer_positions is None else np.asarray(layer_positions)
        )
        if self.layers_per_sample > len(self.layer_positions):
            raise ValueError(
                f"{self.layers_per_sample} layers per sample but the store has {len(self.layer_positions)}"
            )
        self.layer_ids = np.asarray(r.layer_ids)
        self._len = len(r)
        self._meta_cols = None
        # (flat buffer, its idle use count, its stale ranges)
        self._pool: list[tuple[torch.Tensor, int, StaleRanges]] = []
        self._shared: WorkerBuffers | None = None  # a DataLoader worker's shared buffers

    @property
    def reader(self) -> ActivationReader:
        if self._reader is None:
            self._reader = open_store(self.store_path)
        return self._reader

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self._len

    def layers_for(self, index: int) -> np.ndarray:
        return self._layers_of(np.array([int(index)]))[0]

    def _layers_of(self, index: np.ndarray) -> np.ndarray:
        """``(len(index), k)`` layer positions: :func:`hallulog.storage._layer_draw.draw_layers`."""
        pick = draw_layers(
            self.seed, self.epoch, index, len(self.layer_positions), self.layers_per_sample
        )
        return self.layer_positions[pick]

    def _meta_columns(self) -> dict[str, np.ndarray]:
        """Per-sample metadata as int64 columns, built once per process (cheap to index)."""
        if self._meta_cols is None:
            r = self.reader
            ix = getattr(r, "ix", None)
            if isinstance(ix, dict) and "seq_len" in ix:  # packed: the index arrays as they are
                cols = {
                    "seq_len": ix["seq_len"],
                    "prompt_len": ix["prompt_len"],
                    "response_len": ix["response_len"],
                    "label": ix["label"],
                }
            else:
                metas = [r.meta(i) for i in range(len(r))]
                cols = {
                    k: np.array([m[k] for m in metas])
                    for k in ("seq_len", "prompt_len", "response_len", "label")
                }
            self._meta_cols = {k: np.asarray(v, np.int64) for k, v in cols.items()}
        return self._meta_cols

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_meta_cols"] = None
        state["_pool"] = []
        state["_shared"] = None
        return state

    def __getitem__(self, index: int) -> dict:
        r = self.reader
        pos = self.layers_for(index)
        m = r.meta(index)
        acts = np.empty((len(pos), m["seq_len"], r.hidden_size), r.dtype)
        r.read_pairs_into([index] * len(pos), pos, list(acts))
        return {
            "acts": to_tensor(acts),
            "layers": torch.from_numpy(self.layer_ids[pos].astype(np.int64)),
            "layer_pos": torch.from_numpy(pos.astype(np.int64)),
            "label": torch.tensor(m["label"], dtype=torch.int64),
            "seq_len": torch.tensor(m["seq_len"], dtype=torch.int64),
            "prompt_len": torch.tensor(m["prompt_len"], dtype=torch.int64),
            "response_len": torch.tensor(m["response_len"], dtype=torch.int64),
            "index": torch.tensor(int(index), dtype=torch.int64),
        }

    def __getitems__(self, indices: Sequence[int]) -> PairsBatch:
        """A whole batch, read with one batched call into the padded output (see module doc)."""
        r = self.reader
        n = len(self)
        index = np.array([int(i) for i in indices], np.int64)
        if index.size and not (index.min() >= -n and index.max() < n):
            raise IndexError(f"sample index out of range for {n} samples in {self.store_path}")
        index %= max(n, 1)
        cols = self._meta_columns()
        seq = cols["seq_len"][index]
        pos = self._layers_of(index)
        b, k = pos.shape
        t_max = int(seq.max()) if b else 0
        acts, stale = self._output((b, k, t_max, r.hidden_size), r.dtype)
        a = to_numpy(acts)
        # bfloat16: zeroed as its uint16 words (numpy fills ml_dtypes arrays element by element)
        stale.zero_padding(as_container(a).reshape(-1), seq, k, t_max, r.hidden_size)
        outs = []
        for j in range(b):
            t = int(seq[j])
            outs.extend(a[j, q, :t] for q in range(k))
        r.read_pairs_into(np.repeat(index, k), pos.reshape(-1), outs)
        mask = torch.from_numpy(np.arange(t_max)[None, :] < seq[:, None])
        pos = pos.astype(np.int64)
        collated = {
            "acts": acts,
            "mask": mask,
            "layers": torch.from_numpy(self.layer_ids[pos].astype(np.int64)),
            "layer_pos": torch.from_numpy(pos),
        }
        for key in _SCALARS:
            collated[key] = torch.from_numpy(index.copy() if key == "index" else cols[key][index])
        if torch.utils.data.get_worker_info() is not None:
            collated = SharedBatch(collated)
        return PairsBatch(collated)

    _POOL_SIZE = 3  # a batch being built, the one the caller holds, one in flight

    def _output(self, shape, dtype) -> tuple[torch.Tensor, StaleRanges]:
        """The padded output and the ranges of it that may hold bytes of an earlier batch: in
        a worker a reused buffer of shared memory (``_worker_buffers``), else a reused buffer
        of the pool."""
        need = int(np.prod(shape))
        cap = need
        if shape and len(self) and shape[0]:
            t_store = int(self._meta_columns()["seq_len"].max())
            cap = max(need, shape[0] * shape[1] * t_store * shape[3])
        if torch.utils.data.get_worker_info() is not None:
            if self._shared is None or self._shared.pid != os.getpid():
                self._shared = WorkerBuffers()
            flat, stale = self._shared.take(need, cap, numpy_dtype_to_torch(dtype))
            return flat.view(shape), stale
        for flat, idle, stale in self._pool:
            if flat.numel() >= need and use_count(flat) <= idle:
                return flat[:need].view(shape), stale  # a view: the caller's reference counts
        flat = _empty((cap,), dtype, self.pin_memory)
        stale = StaleRanges(cap)
        if len(self._pool) >= self._POOL_SIZE:
            self._pool.pop(0)
        self._pool.append((flat, use_count(flat), stale))
        return flat[:need].view(shape), stale


class PairsBatch(Sequence):
    """What ``__getitems__`` returns: the collated batch, which ``collate_pairs`` passes through.

    Also a sequence of per-item dicts (views into the batch, built on access), so another
    ``collate_fn`` still gets the items it expects.
    """

    def __init__(self, collated: dict):
        self.collated = collated

    def __len__(self) -> int:
        return len(self.collated["index"])

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        c = self.collated
        t = int(c["seq_len"][j])
        item = {
            "acts": c["acts"][j, :, :t],
            "layers": c["layers"][j],
            "layer_pos": c["layer_pos"][j],
        }
        item.update({key: c[key][j] for key in _SCALARS})
        return item


def _empty(shape, dtype: np.dtype, pin: bool) -> torch.Tensor:
    """An uninitialised CPU tensor of the main process: pinned when asked and possible."""
    tdtype = numpy_dtype_to_torch(dtype)
    if pin and torch.cuda.is_available():
        return torch.empty(shape, dtype=tdtype, pin_memory=True)
    return torch.empty(shape, dtype=tdtype)


def collate_pairs(batch) -> dict:
    """Pad ``acts`` to the longest sample: ``acts`` (B, k, T_max, H) with zeros past each
    ``seq_len``, ``mask`` (B, T_max) bool (True = real token); scalars stacked to (B,).
    A batch read by ``ActivationPairsDataset.__getitems__`` is already collated: returned as is."""
    if isinstance(batch, PairsBatch):
        return batch.collated
    t_max = max(int(b["seq_len"]) for b in batch)
    k, _, h = batch[0]["acts"].shape
    # padding in numpy (slice assignment is memcpy);
    # the same in torch CPU half precision is an order of magnitude slower
    dtype = to_numpy(batch[0]["acts"]).dtype
    acts = np.empty((len(batch), k, t_max, h), dtype=dtype)
    words = as_container(acts)  # bfloat16: copied and zeroed as uint16 words
    mask = np.zeros((len(batch), t_max), dtype=bool)
    for j, b in enumerate(batch):
        t = int(b["seq_len"])
        words[j, :, :t] = as_container(to_numpy(b["acts"]))
        words[j, :, t:] = 0  # write each byte once: data or padding
        mask[j, :t] = True
    acts, mask = to_tensor(acts), torch.from_numpy(mask)
    out = {"acts": acts, "mask": mask}
    for key in ("layers", "layer_pos"):
        out[key] = torch.stack([b[key] for b in batch])
    for key in _SCALARS:
        out[key] = torch.stack([b[key] for b in batch])
    return out
