"""Bytes of ``--attention-features`` per generation (docs/formats/attention.md): one float16
row of ``layers x heads x 5`` summaries per generated token, plus the part's metadata entry."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["attention_bytes", "model_heads", "ATTENTION_FEATURES", "ENTRY_BYTES"]

ATTENTION_FEATURES = 5  # storage/attention_format.py FEATURES
ENTRY_BYTES = 64  # the generation's entry in the part's metadata, and its row count


def model_heads(model_dir: str | Path) -> int | None:
    """Query heads per layer from the model's ``config.json`` (None when it cannot be read)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)
    heads = config.get("num_attention_heads")
    return int(heads) if heads else None


def attention_bytes(tokens: float, layers: int, heads: int) -> float:
    """Bytes of one generation of ``tokens`` generated tokens."""
    return tokens * layers * heads * ATTENTION_FEATURES * 2 + ENTRY_BYTES
