"""A weight read straight from its checkpoint file's pages (``mmap``), so that only the pages a
server touches are resident.

After the fused decoder packed its matrices, the one large weight still read in its plain
layout is the token embedding (SmolLM2-135M: 108 MB, tied to the output head, whose packed copy
serves the logits). A lookup reads only the rows of the tokens fed, so the embedding kept as a
private copy-on-write mapping of the safetensors file costs the resident set the pages of the
tokens in use (a few MB) where a copy in memory costs all of it. The file is a safetensors file
(an 8-byte little-endian header length, a JSON header, the data), found through
``model.safetensors.index.json`` when the checkpoint is sharded.
"""

from __future__ import annotations

import json
import logging
import mmap
import pathlib
import struct

import torch

__all__ = ["map_weight"]

logger = logging.getLogger(__name__)

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_PROBE_ROWS = 8  # rows compared with the loaded weight before the mapping replaces it


def map_weight(model_dir: pathlib.Path, name: str, loaded: torch.Tensor) -> torch.Tensor | None:
    """Tensor ``name`` of the safetensors checkpoint in ``model_dir`` as a file-backed tensor,
    when it holds exactly ``loaded`` (same dtype and shape, rows spread over it bit-equal);
    None otherwise (another format, a cast on load, a missing file)."""
    try:
        path = _file_of(pathlib.Path(model_dir), name)
        if path is None:
            return None
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            info = json.loads(fh.read(length)).get(name)
            if not info or _DTYPES.get(info["dtype"]) != loaded.dtype:
                return None
            if list(info["shape"]) != list(loaded.shape):
                return None
            begin, end = info["data_offsets"]
            start = 8 + length + begin
            page = start - start % mmap.ALLOCATIONGRANULARITY
            # copy-on-write: writable for torch.frombuffer, never written, pages shared
            mapping = mmap.mmap(
                fh.fileno(), start + (end - begin) - page, access=mmap.ACCESS_COPY, offset=page
            )
    except (OSError, ValueError, KeyError, struct.error) as exc:
        logger.info("%s stays in memory (no mapping of %s: %s)", name, model_dir, exc)
        return None
    tensor = torch.frombuffer(
        mapping, dtype=loaded.dtype, count=loaded.numel(), offset=start - page
    ).view(loaded.shape)
    probe = torch.linspace(0, loaded.shape[0] - 1, _PROBE_ROWS).long()
    if not torch.equal(tensor[probe], loaded.detach()[probe]):
        logger.info("%s in %s differs from the loaded weight: kept in memory", name, model_dir)
        return None
    return tensor


def _file_of(model_dir: pathlib.Path, name: str) -> pathlib.Path | None:
    single = model_dir / "model.safetensors"
    if single.is_file():
        return single
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shard = json.loads(index.read_text()).get("weight_map", {}).get(name)
        return model_dir / shard if shard else None
    return None
