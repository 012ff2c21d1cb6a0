"""The protocol guards of one run, read in one pass over ``consolidated/``: the leakage flag of
every labelled prompt (leakage.py) and the labels of other graders (graders.py).

``prompt_index.jsonl`` gives each prompt's reference, prompt text, messages and meta;
``generations.parquet`` (five columns of the primary rows; ``generations.jsonl`` without it)
its primary answer's worker label. Memory: a flag, a source and a label
per grader for each labelled prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hallulog.contracts import layout
from hallulog.evaluation.data import Run, iter_jsonl
from hallulog.evaluation.graders import other_labels
from hallulog.evaluation.leakage import find_leak

__all__ = ["Guards", "collect_guards"]


@dataclass
class Guards:
    leaked: np.ndarray  # bool per labelled prompt
    checked: np.ndarray  # bool: the prompt's reference could be looked for
    source: list[str | None]
    primary_grader: str | None
    graders: dict[str, np.ndarray] = field(default_factory=dict)  # float labels, NaN: none

    def summary(self) -> dict:
        src: dict[str, int] = {}
        for s, lk in zip(self.source, self.leaked):
            if lk:
                src[s or "prompt"] = src.get(s or "prompt", 0) + 1
        return {
            "rule": "an accepted answer, normalised as the alias grader, occurs in what the "
            "model was given (docs/evaluation.md, Guards)",
            "checked": int(self.checked.sum()),
            "leaked": int(self.leaked.sum()),
            "by_source": src,
        }


_PRIMARY_COLUMNS = ["prompt_id", "sample_id", "text", "label", "label_grader"]


def _primaries(run: Run):
    """The primary generations' ``{prompt_id, text, label, label_grader}``: from
    ``generations.parquet`` (those columns of the sample-0 rows only) when consolidation wrote
    it, else from ``generations.jsonl``."""
    parquet = run.consolidated / layout.GENERATIONS_PARQUET
    if parquet.is_file():
        import pyarrow.dataset as ds

        data = ds.dataset(parquet, format="parquet")
        if set(_PRIMARY_COLUMNS) <= set(data.schema.names):
            for batch in data.to_batches(
                columns=_PRIMARY_COLUMNS, filter=ds.field("sample_id") == 0
            ):
                yield from batch.to_pylist()
            return
    path = run.consolidated / layout.GENERATIONS
    if path.is_file():
        for _, gen in iter_jsonl(path):
            if gen.get("sample_id") == 0:
                yield gen


def collect_guards(run: Run, prompt_ids: list[str]) -> Guards:
    """The guards of the labelled prompts ``prompt_ids`` (in that order)."""
    at = {p: i for i, p in enumerate(prompt_ids)}
    n = len(prompt_ids)
    leaked, checked = np.zeros(n, bool), np.zeros(n, bool)
    source: list[str | None] = [None] * n
    rows: dict[int, dict] = {}
    graders: dict[str, int] = {}
    for _, row in run.iter_prompt_index():
        i = at.get(row.get("prompt_id"))
        if i is None:
            continue
        leak = find_leak(row)
        leaked[i], checked[i], source[i] = leak.leaked, leak.checked, leak.source
        if row.get("label_grader"):
            graders[row["label_grader"]] = graders.get(row["label_grader"], 0) + 1
        ref = row.get("reference")
        if isinstance(ref, dict):  # only what other_labels reads (a judge document can be long)
            ref = {k: ref.get(k) for k in ("kind", "value", "aliases", "unanswerable")}
        rows[i] = {"label_grader": row.get("label_grader"), "reference": ref}
    others: dict[str, np.ndarray] = {}
    for gen in _primaries(run):
        i = at.get(gen.get("prompt_id"))
        if i is None or i not in rows:
            continue
        for g, lab in other_labels(rows[i], gen).items():
            others.setdefault(g, np.full(n, np.nan))[i] = lab
    primary = max(graders, key=graders.get) if graders else None
    return Guards(leaked, checked, source, primary, others)
