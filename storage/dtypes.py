"""The dtypes a store holds: ``float16``, ``float32`` and ``bfloat16`` (docs/formats/*.md).

numpy has no bfloat16 of its own. A bfloat16 store reads back as ``ml_dtypes.bfloat16`` arrays:
numpy arrays of the stored 2-byte words, lossless, castable with ``astype`` (``to_float32`` is
the fast exact widening). Metadata spells the dtype ``"bfloat16"``, never numpy's ``str`` of it
(``"<V2"``, which names no float type). Containers that only know numpy's own dtypes, a ``.npy``
header and zarr-python's data types, hold the same bytes as little-endian ``uint16`` (``<u2``),
with ``"bfloat16"`` recorded beside them (``container_dtype``); the PyTorch side sees
``torch.bfloat16`` tensors over the same memory (``to_tensor`` / ``to_numpy``: no copy).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "BFLOAT16",
    "STORE_DTYPES",
    "store_dtype",
    "dtype_str",
    "is_bfloat16",
    "container_dtype",
    "as_container",
    "from_container",
    "to_float32",
    "torch_dtype",
    "to_tensor",
    "to_numpy",
]

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
#: the dtypes a run stores (``--dtype``); any numpy float type is read back
STORE_DTYPES = ("float16", "float32", "bfloat16")
_U16 = np.dtype("<u2")


def is_bfloat16(dtype) -> bool:
    return np.dtype(dtype) == BFLOAT16 if not isinstance(dtype, str) else dtype == "bfloat16"


def store_dtype(dtype) -> np.dtype:
    """The numpy dtype of a store dtype given by name (``"float16"``, ``"bfloat16"``), by the
    string metadata holds (``"<f2"``, ``"bfloat16"``) or as a dtype; ``ValueError`` for anything
    but a floating-point type."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return BFLOAT16
    try:
        d = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}") from None
    if d == BFLOAT16 or d.kind == "f":
        return d
    raise ValueError(f"dtype {dtype!r} is not a floating point type")


def dtype_str(dtype) -> str:
    """How manifests and attrs spell a store dtype: ``"bfloat16"``, else numpy's ``"<f2"`` etc."""
    d = np.dtype(dtype) if not is_bfloat16(dtype) else BFLOAT16
    return "bfloat16" if d == BFLOAT16 else d.str


def container_dtype(dtype) -> np.dtype:
    """The dtype a ``.npy`` header or a zarr array holds for a store dtype: ``<u2`` for bfloat16."""
    d = store_dtype(dtype)
    return _U16 if d == BFLOAT16 else d


def as_container(a: np.ndarray) -> np.ndarray:
    """``a`` viewed as its container dtype (no copy)."""
    return a.view(_U16) if a.dtype == BFLOAT16 else a


def from_container(a: np.ndarray, dtype) -> np.ndarray:
    """An array read from a container viewed as the store dtype (no copy)."""
    d = store_dtype(dtype)
    return a.view(BFLOAT16) if d == BFLOAT16 and a.dtype != BFLOAT16 else a


def to_float32(a: np.ndarray) -> np.ndarray:
    """``a`` as float32, exactly (bfloat16 is the top half of a float32: one shift per element,
    vectorised, where ``astype`` goes through ml_dtypes' per-element cast)."""
    if a.dtype == BFLOAT16:
        return (np.ascontiguousarray(a).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32, copy=False)


def torch_dtype(dtype):
    """The torch dtype of a store dtype."""
    import torch

    d = store_dtype(dtype)
    return torch.bfloat16 if d == BFLOAT16 else torch.from_numpy(np.empty(0, d)).dtype


def to_tensor(a: np.ndarray):
    """``torch.from_numpy`` that knows bfloat16 (a view of the same memory)."""
    import torch

    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t) -> np.ndarray:
    """``tensor.numpy()`` that knows bfloat16: an ``ml_dtypes.bfloat16`` view of the same memory."""
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy().view(BFLOAT16)
    return t.numpy()
