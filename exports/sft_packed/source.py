"""Token sequences for the packed SFT export, read from ``consolidated/`` with bounded memory.

One pass over ``prompt_index.jsonl`` and ``generations.jsonl`` keeps, per selected generation,
only byte offsets and lengths; ``read_sequence`` seeks back to the two lines when a bin is
materialized. Selection rules: docs/formats/sft-packed.md, section "Selecting sequences".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.errors import MalformedLineError
from hallulog.contracts.jsonl import iter_lines, read_row_at
from hallulog.storage.errors import ManifestError

SELECTIONS = ("correct_primary", "primary", "correct", "all")


@dataclass
class _Prompt:
    offset: int
    prompt_len: int
    label: int | None


def _scan(path: str):
    """``(line number, byte offset, parsed row)`` of every committed line (hallulog.contracts.jsonl: a
    torn last line was never committed)."""
    try:
        for line in iter_lines(path):
            yield line.lineno, line.start, line.row
    except MalformedLineError as exc:
        raise ManifestError(exc.what, path, line=exc.line) from None


def generation_label(prompt: _Prompt, gen: dict) -> int | None:
    """The primary's label is the prompt row's (the graded one), else the generation's own."""
    if int(gen.get("sample_id", -1)) == 0 and prompt.label is not None:
        return prompt.label
    return gen.get("label")


class ConsolidatedSequences:
    """Selected ``prompt_token_ids + token_ids`` sequences of a consolidated directory.

    ``select``: one of ``SELECTIONS`` or ``f(prompt_row, generation_row) -> bool``.
    ``lengths`` (int64), ``ids`` ((prompt_id, sample_id) per sequence), ``read_sequence(k)``.
    """

    def __init__(self, consolidated_dir, select: str | Callable = "correct_primary"):
        d = os.fspath(consolidated_dir)
        self.prompt_path = os.path.join(d, layout.PROMPT_INDEX)
        self.gen_path = os.path.join(d, layout.GENERATIONS)
        for p in (self.prompt_path, self.gen_path):
            if not os.path.exists(p):
                raise ManifestError("missing (is this a consolidated/ directory?)", p)
        if not callable(select) and select not in SELECTIONS:
            raise ValueError(f"select must be one of {SELECTIONS} or a callable, got {select!r}")
        prompts: dict[str, _Prompt] = {}
        for n, off, row in _scan(self.prompt_path):
            if "prompt_id" not in row or not isinstance(row.get("prompt_token_ids"), list):
                raise ManifestError(
                    "prompt row lacks prompt_id or prompt_token_ids", self.prompt_path, line=n
                )
            prompts[row["prompt_id"]] = _Prompt(off, len(row["prompt_token_ids"]), row.get("label"))
        offsets, plens, rlens, ids = [], [], [], []
        for n, off, row in _scan(self.gen_path):
            if (
                "prompt_id" not in row
                or "sample_id" not in row
                or not isinstance(row.get("token_ids"), list)
            ):
                raise ManifestError(
                    "generation row lacks prompt_id, sample_id or token_ids", self.gen_path, line=n
                )
            pr = prompts.get(row["prompt_id"])
            if pr is None:
                raise ManifestError(
                    f"prompt {row['prompt_id']} is not in {self.prompt_path}", self.gen_path, line=n
                )
            if not self._selected(select, pr, row):
                continue
            offsets.append((pr.offset, off))
            plens.append(pr.prompt_len)
            rlens.append(len(row["token_ids"]))
            ids.append((row["prompt_id"], int(row["sample_id"])))
        self.offsets = offsets
        self.prompt_lens = np.asarray(plens, np.int64)
        self.response_lens = np.asarray(rlens, np.int64)
        self.lengths = self.prompt_lens + self.response_lens
        self.ids = ids
        self._files = None

    def _selected(self, select, pr: _Prompt, row: dict) -> bool:
        if callable(select):
            with open(self.prompt_path, "rb") as f:
                return bool(select(read_row_at(f, pr.offset), row))
        primary = int(row["sample_id"]) == 0
        correct = generation_label(pr, row) == 0
        return {
            "correct_primary": primary and correct,
            "primary": primary,
            "correct": correct,
            "all": True,
        }[select]

    def __len__(self) -> int:
        return len(self.offsets)

    def read_sequence(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids int64, loss_mask uint8)``: prompt tokens masked 0, response tokens 1."""
        if self._files is None:
            self._files = (open(self.prompt_path, "rb"), open(self.gen_path, "rb"))
        fp, fg = self._files
        po, go = self.offsets[k]
        p = read_row_at(fp, po)["prompt_token_ids"]
        r = read_row_at(fg, go)["token_ids"]
        ids = np.asarray(p + r, dtype=np.int64)
        mask = np.zeros(len(ids), np.uint8)
        mask[len(p) :] = 1
        return ids, mask

    def close(self) -> None:
        if self._files is not None:
            for f in self._files:
                f.close()
            self._files = None
