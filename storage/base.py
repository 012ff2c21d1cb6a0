"""The one writer and reader interface every activation format implements.

Logical tensor: ``acts[sample, layer, token, hidden]``. A reader addresses a layer by its
*position* ``0 <= layer < len(reader.layer_ids)``; ``reader.layer_ids[layer]`` is the model's
layer id (0 = embedding output, k = residual stream after decoder layer k).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from hallulog.storage._ranged import (
    LocalFiles,
    RangeSource,
    ReadPolicy,
    is_remote,
    policy_for,
    read_extents,
)
from hallulog.storage.errors import StorageError

__all__ = ["SampleMeta", "ActivationWriter", "ActivationReader", "ExtentReader"]


@dataclass(frozen=True)
class SampleMeta:
    """Per-sample metadata handed to ``writer.write``."""

    prompt_len: int
    """Rows of ``acts`` that are prompt positions (they come first)."""
    response_len: int
    """Rows of ``acts`` that are response positions (they follow the prompt rows)."""
    label: int = -1
    """0 correct, 1 hallucinated, -1 unknown."""

    def __post_init__(self):
        if self.prompt_len < 0 or self.response_len < 0:
            raise ValueError(f"negative length in {self}")
        if self.label not in (-1, 0, 1):
            raise ValueError(f"label must be -1, 0 or 1, got {self.label}")


class ActivationWriter(abc.ABC):
    """Append-only writer of one store (one per worker process). See docs/contracts.md.

    Durability is group commit: ``write`` stores a sample's bytes but syncs nothing;
    ``commit()`` makes every sample written since the last commit durable, with one fsync per
    file it touched, and only then are they committed (``committed_keys``). A crash before
    ``commit()`` returns loses exactly the uncommitted samples (recovery removes them).
    ``close()`` commits what is pending, then finalizes.
    """

    layer_ids: list[int]
    hidden_size: int
    dtype: np.dtype

    def _check(self, key: str, acts: np.ndarray, meta: SampleMeta) -> np.ndarray:
        if not isinstance(key, str) or not key or "/" in key or "\n" in key:
            raise StorageError(f"invalid activation key {key!r}")
        if (
            acts.ndim != 3
            or acts.shape[0] != len(self.layer_ids)
            or acts.shape[2] != self.hidden_size
        ):
            raise StorageError(
                f"acts for {key} has shape {acts.shape}, expected "
                f"({len(self.layer_ids)}, T, {self.hidden_size})"
            )
        if acts.dtype != self.dtype:
            raise StorageError(
                f"acts for {key} has dtype {acts.dtype}, writer dtype is {self.dtype}"
            )
        if acts.shape[1] != meta.prompt_len + meta.response_len:
            raise StorageError(
                f"acts for {key} has {acts.shape[1]} rows but prompt_len + response_len = "
                f"{meta.prompt_len + meta.response_len}"
            )
        return np.ascontiguousarray(acts)

    @abc.abstractmethod
    def write(self, key: str, acts: np.ndarray, meta: SampleMeta) -> dict:
        """Store one sample (not yet durable); return the location fields for
        activation_index.jsonl. The key is refused if already written."""

    def commit(self, on_durable: Callable[[], None] | None = None) -> None:
        """Make every sample written so far durable and committed (one fsync per file).

        ``on_durable`` is called once the samples' bytes are durable, before the commit point
        is written (a caller may start syncing its own files then)."""

    @abc.abstractmethod
    def committed_keys(self) -> set[str]:
        """Keys of every committed (durable) sample; written but uncommitted ones are not."""

    @abc.abstractmethod
    def rollback(self, keep: set[str]) -> None:
        """Drop every uncommitted sample and every committed one whose key is not in ``keep``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Finalize the store (indexes, manifest); the store is readable afterwards."""

    def _commit(self, key: str, record: dict) -> None:
        """Called by ``commit()`` for each sample once its bytes are durable, before the commit
        point is written; formats override. Tests interpose here to crash."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ActivationReader(abc.ABC):
    """Read-only view of a store. Picklable: file handles are opened lazily per process."""

    path: str
    layer_ids: list[int]
    hidden_size: int
    dtype: np.dtype

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def meta(self, i: int) -> dict:
        """``{sample_key, seq_len, prompt_len, response_len, label}`` of sample ``i``."""

    @abc.abstractmethod
    def read(self, i: int, layer: int) -> np.ndarray:
        """``(seq_len, hidden)`` activations of sample ``i`` at layer position ``layer``."""

    @property
    def num_layers(self) -> int:
        return len(self.layer_ids)

    def seq_len(self, i: int) -> int:
        return int(self.meta(i)["seq_len"])

    def keys(self) -> list[str]:
        return [self.meta(i)["sample_key"] for i in range(len(self))]

    def index_of(self, sample_key: str) -> int:
        idx = getattr(self, "_key_index", None)
        if idx is None:
            idx = {k: i for i, k in enumerate(self.keys())}
            self._key_index = idx
        try:
            return idx[sample_key]
        except KeyError:
            raise KeyError(f"no sample {sample_key!r} in {self.path}") from None

    def meta_by_key(self, sample_key: str) -> dict:
        return self.meta(self.index_of(sample_key))

    def read_sample(self, i: int) -> np.ndarray:
        """All layers of sample ``i`` as ``(L, seq_len, H)``."""
        return np.stack(self.read_pairs([i] * self.num_layers, range(self.num_layers)))

    def read_pairs(self, samples: Sequence[int], layers: Iterable[int]) -> list[np.ndarray]:
        """``[read(s, l) for s, l in zip(samples, layers)]``; formats override to batch."""
        return [self.read(int(s), int(l)) for s, l in zip(samples, layers)]

    def read_pairs_into(
        self, samples: Sequence[int], layers: Iterable[int], outs: Sequence[np.ndarray]
    ) -> None:
        """Like ``read_pairs`` but into caller-owned ``(seq_len, H)`` buffers (no extra copy)."""
        for out, a in zip(outs, self.read_pairs(samples, layers)):
            out[...] = a

    def verify(self) -> None:
        """Check every byte against the store's checksums, where the format has them."""

    def close(self) -> None:
        """Release file handles (they reopen on the next read)."""

    def _check_index(self, i: int, layer: int) -> tuple[int, int]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples in {self.path}")
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer position {layer} out of range for {self.num_layers} layers")
        return i % n, layer

    def __getstate__(self):
        state = self.__dict__.copy()
        for k in self._unpicklable:
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    _unpicklable: tuple[str, ...] = ("_key_index",)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ExtentReader(ActivationReader):
    """A reader whose every (sample, layer) slice is one contiguous byte extent of one file.

    Subclasses implement ``_extent(i, layer) -> (file_no, offset)`` and ``_file_path``; this
    class reads: a batch's extents go to :func:`hallulog.storage._ranged.read_extents`, which merges
    neighbours into ranges and reads them on a thread pool from a range source
    (:class:`hallulog.storage._ranged.LocalFiles` by default: lazily opened fds, reopened after fork,
    dropped on pickling). On network storage (:func:`hallulog.storage._ranged.is_remote`) many ranges
    are in flight at once, so their latencies overlap; ``set_range_source`` plugs in another
    source (an object store).
    """

    _unpicklable = ("_key_index", "_source", "_pool", "_policy")

    def _extent(self, i: int, layer: int) -> tuple[int, int]:
        raise NotImplementedError

    def _file_path(self, file_no: int) -> str:
        raise NotImplementedError

    #: open/close the file around every read instead of caching fds (formats with a file per sample)
    _fd_per_read = False

    def _range_source(self) -> RangeSource:
        source = self.__dict__.get("_source")
        if source is None:
            source = self._source = LocalFiles(
                self._file_path, per_read=self._fd_per_read, remote=is_remote(self.path)
            )
        return source

    def set_range_source(self, source: RangeSource) -> None:
        """Read through ``source`` from now on (``read_into(file_no, offset, buffers)``,
        ``close()``, ``remote``), e.g. an object store's ranged GETs."""
        self.close()
        self._source = source
        self._policy = None

    @property
    def read_policy(self) -> ReadPolicy:
        policy = self.__dict__.get("_policy")
        if policy is None:
            policy = self._policy = policy_for(self._range_source().remote)
        return policy

    def _fd(self, file_no: int) -> int:
        """A descriptor of a local data file (kept open)."""
        return self._range_source().fd(file_no)

    def _read_into(self, file_no: int, offset: int, out: np.ndarray) -> None:
        """Fill ``out`` (C-contiguous) from file ``file_no`` at ``offset``."""
        read_extents(
            self._range_source(), [(file_no, offset, 0)], [out], self.read_policy, self._get_pool
        )

    def read(self, i: int, layer: int) -> np.ndarray:
        i, layer = self._check_index(i, layer)
        out = np.empty((self.seq_len(i), self.hidden_size), self.dtype)
        self._read_into(*self._extent(i, layer), out)
        return out

    def read_pairs(self, samples, layers) -> list[np.ndarray]:
        samples = [int(s) for s in samples]
        layers = [int(l) for l in layers]
        outs = [np.empty((self.seq_len(s), self.hidden_size), self.dtype) for s in samples]
        self.read_pairs_into(samples, layers, outs)
        return outs

    def read_pairs_into(self, samples, layers, outs) -> None:
        samples = [int(s) for s in samples]
        layers = [int(l) for l in layers]
        if not len(samples) == len(layers) == len(outs):
            raise ValueError("samples, layers and outs differ in length")
        jobs = []
        for k, (s, l) in enumerate(zip(samples, layers)):
            s, l = self._check_index(s, l)
            out = outs[k]
            if (
                out.shape != (self.seq_len(s), self.hidden_size)
                or out.dtype != self.dtype
                or not out.flags.c_contiguous
            ):
                raise ValueError(
                    f"out[{k}] must be a C-contiguous {self.dtype} array of shape "
                    f"{(self.seq_len(s), self.hidden_size)}"
                )
            file_no, off = self._extent(s, l)
            jobs.append((file_no, off, k))
        read_extents(self._range_source(), jobs, outs, self.read_policy, self._get_pool)

    def _get_pool(self) -> ThreadPoolExecutor:
        pool = self.__dict__.get("_pool")
        if pool is None or self.__dict__.get("_pool_pid") != os.getpid():
            pool = self._pool = ThreadPoolExecutor(
                self.read_policy.concurrency, thread_name_prefix="storage-pread"
            )
            self._pool_pid = os.getpid()
        return pool

    def close(self) -> None:
        source = self.__dict__.get("_source")
        if source is not None:
            source.close()
        pool = self.__dict__.pop("_pool", None)
        if pool is not None and self.__dict__.get("_pool_pid") == os.getpid():
            pool.shutdown(wait=False)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
