"""The attention part of ``hallulog export lm-polygraph``: LM-Polygraph's ``attention_all`` from a
run's attention summaries (``--attention-features``, docs/formats/attention.md).

LM-Polygraph's ``GreedyProbsCalculator`` keeps, per answer of T tokens, ``attention_all``
``[layers * heads, T, T]``: row j (1 ≤ j < T) is the attention of the decode step that chose
token j (its query is token j − 1) over the answer's tokens 0 .. j − 1; row 0 and the entries on
and above the diagonal are 0. The summaries of row j of a generation hold two of those entries
exactly: ``self`` = A[q, q] is ``attention_all[:, j, j − 1]`` (the diagonal below the main one,
which LM-Polygraph's ``RAUQ`` reads) and ``previous`` = A[q, q − 1] is
``attention_all[:, j, j − 2]``. The export writes those two per token, layer and head to
``attention_all.npy``; :class:`AttentionAll` rebuilds the matrices one answer at a time, with
NaN in the entries a run does not store.

Streaming: a first pass over the parts' metadata indexes the primaries' rows (prompt id → part
and row range: a few numbers per prompt, no features); the second reads each primary's rows by
slice, in the export's prompt order, from the part that holds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from hallulog.storage.attention_format import FEATURES, part_paths

__all__ = ["ATTENTION_FILE", "PrimaryAttention", "AttentionAll"]

ATTENTION_FILE = "attention_all.npy"
#: the summaries kept, in their order on the last axis of ``attention_all.npy``: the diagonals
#: ``-1`` and ``-2`` of LM-Polygraph's ``attention_all``
KEPT = ("self", "previous")
_COLUMNS = [FEATURES.index(name) for name in KEPT]


class PrimaryAttention:
    """Each primary answer's summaries, read by prompt id from the committed parts."""

    def __init__(self, root: str | Path) -> None:
        from safetensors import safe_open

        self._paths = part_paths(root)
        self._where: dict[str, tuple[int, int, int]] = {}  # prompt_id -> (part, start, rows)
        self.layers = self.heads = 0
        for p, path in enumerate(self._paths):
            with safe_open(str(path), framework="np") as f:
                meta = dict(f.metadata() or {})
                rows = f.get_tensor("rows").tolist()
            self.layers, self.heads = int(meta["layers"]), int(meta["heads"])
            at = 0
            for (pid, sid, _commit, _prompt_tokens), n in zip(
                json.loads(meta["generations"]), rows
            ):
                if int(sid) == 0:
                    self._where[pid] = (p, at, n)
                at += n
        self._open: tuple[int, Any] | None = None

    @property
    def rows(self) -> int:
        """The primaries' rows together (an upper bound on what the export writes)."""
        return sum(n for _, _, n in self._where.values())

    def __bool__(self) -> bool:
        return bool(self._where)

    def read(self, prompt_id: str) -> np.ndarray | None:
        """``[tokens, layers, heads, len(KEPT)]`` float16 of the primary, or None."""
        from safetensors import safe_open

        hit = self._where.get(prompt_id)
        if hit is None:
            return None
        p, start, n = hit
        if self._open is None or self._open[0] != p:
            self.close()
            handle = safe_open(str(self._paths[p]), framework="np")
            self._open = (p, handle.__enter__())
        block = self._open[1].get_slice("features")[start : start + n]
        return np.ascontiguousarray(block[..., _COLUMNS])

    def close(self) -> None:
        if self._open is not None:
            self._open[1].__exit__(None, None, None)
            self._open = None


class AttentionAll(Sequence):
    """LM-Polygraph's ``stats["attention_all"]``: item i is answer i's ``[layers * heads, T, T]``
    float32, built when it is read (RAUQ reads them one at a time). Entries ``[:, j, j - 1]`` and
    ``[:, j, j - 2]`` (j ≥ 1) are the stored ``self`` and ``previous``; row 0 and the entries on
    and above the diagonal are 0 (as LM-Polygraph's); the rest is NaN (not stored). An answer
    without summaries is NaN below the diagonal."""

    def __init__(self, values: np.ndarray, spans: list[list[int] | None], lengths: list[int]):
        self._values, self._spans, self._lengths = values, spans, lengths
        self.layers, self.heads = values.shape[1], values.shape[2]

    def __len__(self) -> int:
        return len(self._spans)

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        span, t = self._spans[i], self._lengths[i]
        m = np.zeros((self.layers * self.heads, t, t), np.float32)
        below = np.tril_indices(t, -1)
        m[:, below[0], below[1]] = np.nan
        if t:
            m[:, 0, :] = 0.0
        if span is None or not t:
            return m
        block = np.asarray(self._values[span[0] : span[1]], np.float32)  # [T, L, H, 2]
        block = block.reshape(len(block), -1, len(KEPT)).transpose(1, 0, 2)  # [L*H, T, 2]
        j = np.arange(1, min(t, len(block[0])))
        m[:, j, j - 1] = block[:, j, 0]
        j2 = j[j >= 2]
        m[:, j2, j2 - 2] = block[:, j2, 1]
        return m
