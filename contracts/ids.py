"""Stable identities (docs/architecture.md, "Ids"): prompt_id, sample_id, activation_key, config
fingerprint."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["prompt_id_for", "activation_key", "sample_seed", "fingerprint"]


def prompt_id_for(dataset: str, split: str, dataset_index: Any) -> str:
    """First 16 hex chars of sha256 of the compact JSON ``[dataset, split, str(dataset_index)]``."""
    payload = json.dumps([dataset, split, str(dataset_index)], separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def activation_key(prompt_id: str, sample_id: int) -> str:
    """``{prompt_id}_{sample_id}``: the key of one generation's activations in every store."""
    return f"{prompt_id}_{sample_id}"


def sample_seed(run_seed: int, prompt_id: str, sample_id: int) -> int:
    """A per-sample seed derived from the run seed, the prompt and the sample (fits in int32)."""
    digest = hashlib.sha256(f"{run_seed}:{prompt_id}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def fingerprint(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``config`` (callers strip paths and worker counts first)."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
