"""The run's ``attention/`` parts from the summaries captured during generation (the embedded
server's, ``hallulog.serving.attention_capture``), then the attention pass for whatever they
miss (``hallulog.postrun.attention``).

Each worker keeps a generation's file at ``layout.worker_attention_file`` (moved there from
its server's spool before the group commits). The gather streams the consolidated generations,
takes each one no part holds from the first worker directory whose file has exactly its token
ids (prompt then answer: a file of an uncommitted try of the prompt with other tokens is not
taken), and commits them in parts of ``PART_GENERATIONS`` (``write_part``); a part's files are
deleted once it is committed. A SIGKILL loses at most the part in flight: the next gather
finds the same files. Whatever has no file (a vLLM run, a server that could not capture, a
file lost) goes to the attention pass, which loads its model only then.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hallulog.contracts import layout
from hallulog.postrun.attention import PART_GENERATIONS, attention_pass, consolidated_generations
from hallulog.storage.attention_format import done_keys, write_part

__all__ = ["gather_attention", "store_attention", "GatherResult"]

logger = logging.getLogger(__name__)


@dataclass
class GatherResult:
    generations: int = 0
    tokens: int = 0
    missing: int = 0
    seconds: float = 0.0


def _load(path: Path, token_ids: list[int]) -> np.ndarray | None:
    """The file's features when it holds exactly ``token_ids`` (else None)."""
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own types
        logger.warning(
            "%s: unreadable attention file (%s); the attention pass redoes it", path, exc
        )
        return None
    features, stored = tensors.get("features"), tensors.get("token_ids")
    if features is None or stored is None or stored.tolist() != token_ids:
        return None
    return features.astype(np.float32)


def gather_attention(root: str | Path) -> GatherResult:
    """Commit the captured summaries of every consolidated generation no part holds."""
    started = time.monotonic()
    root = Path(root)
    result = GatherResult()
    done = done_keys(root)
    workers = layout.worker_dirs(root)
    keys, feats, used = [], [], []

    def commit() -> None:
        write_part(root, keys, feats)
        for path in used:
            path.unlink(missing_ok=True)
        keys.clear(), feats.clear(), used.clear()

    for prompt_ids, rows in consolidated_generations(root):
        for row in rows:
            key = (row["prompt_id"], int(row["sample_id"]), row["commit_id"])
            if key in done or not row.get("token_ids") or not prompt_ids:
                continue
            tokens = list(prompt_ids) + list(row["token_ids"])
            for worker in workers:
                path = layout.worker_attention_file(worker, key[0], key[1])
                found = _load(path, tokens) if path.exists() else None
                if found is not None and len(found) == len(row["token_ids"]):
                    keys.append((*key, len(prompt_ids)))
                    feats.append(found)
                    used.append(path)
                    result.generations += 1
                    result.tokens += len(found)
                    break
            else:
                result.missing += 1
        if len(keys) >= PART_GENERATIONS:
            commit()
    if keys:
        commit()
    result.seconds = time.monotonic() - started
    logger.info(
        "attention captured during generation: %d generations, %d tokens stored in %.1f s "
        "(%d without a file)",
        result.generations,
        result.tokens,
        result.seconds,
        result.missing,
    )
    return result


def store_attention(root: str | Path, model_path: str | Path, *, in_pass: bool):
    """``--attention-features`` after a run: the captured summaries when its backend captures
    them (``in_pass``), then the attention pass for every generation still without them.
    Returns the pass's result."""
    if in_pass:
        gather_attention(root)
    return attention_pass(root, model_path)
