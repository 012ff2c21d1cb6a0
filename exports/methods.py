"""Method exports (seed 003 §6.5) from ``consolidated/``, documented in docs/exports.md.

Every row carries prompt_id, the sample ids and the label, so a method joins nothing by
position. All three consolidated files are streamed: consolidation writes them in one order of
prompts (each group's rows together), so a cursor over the prompt index and one over the
activation index follow the generations; memory is one prompt group plus the ids of the prompts
passed (to skip rows of a prompt that has no generations).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.jsonl import encode_line, iter_rows
from hallulog.contracts.reasoning import answer_start, answer_view, is_no_answer

__all__ = ["write_exports", "ExportWriter", "stamp_exports", "iter_prompt_groups", "EXPORT_FILES"]

EXPORT_FILES = layout.EXPORT_FILES


def _groups(path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    rows = (row for row in iter_rows(path))
    for pid, group in itertools.groupby(rows, key=lambda r: r["prompt_id"]):
        yield pid, sorted(group, key=lambda r: r["sample_id"])


class _Cursor:
    """Rows of one prompt at a time from a file in the generations' prompt order."""

    def __init__(self, rows: Iterator[dict[str, Any]], passed: set[str]) -> None:
        self._rows = rows
        self._passed = passed
        self._next = next(rows, None)

    def take(self, pid: str) -> list[dict[str, Any]]:
        """The rows of ``pid`` at the cursor; rows of prompts already passed are skipped."""
        out = []
        while self._next is not None:
            row_pid = self._next.get("prompt_id")
            if row_pid == pid:
                out.append(self._next)
            elif row_pid not in self._passed:
                break  # a later prompt's rows: left for it
            self._next = next(self._rows, None)
        return out


def _token_logprobs(gen: dict[str, Any]) -> list[float]:
    return [t["logprob"] for t in gen.get("logprobs") or []]


def _logprob_summary(gen: dict[str, Any]) -> dict[str, Any]:
    lps = _token_logprobs(gen)
    whole = bool(lps) and None not in lps  # null: a logprob that was not finite
    return {
        "sample_id": gen["sample_id"],
        "text": gen["text"],
        "label": gen.get("label"),
        "token_logprobs": lps,
        "sum_logprob": float(sum(lps)) if whole or not lps else None,
        "mean_logprob": float(sum(lps) / len(lps)) if whole else None,
        "num_tokens": len(lps),
    }


def _energy_sample(gen: dict[str, Any]) -> dict[str, Any]:
    logits = [t.get("logit") for t in gen.get("logprobs") or []]
    have_logits = bool(logits) and all(v is not None for v in logits)
    return {
        "sample_id": gen["sample_id"],
        "text": gen["text"],
        "label": gen.get("label"),
        "token_logits": logits if have_logits else None,
        "token_logprobs": _token_logprobs(gen),
        "logit_source": "raw_logits" if have_logits else "logprobs_only",
    }


class ExportWriter:
    """Writes the export files one prompt group at a time; :meth:`close` publishes them.

    Consolidation feeds it while it streams (the rows are parsed then anyway) and leaves a
    stamp of the consolidated files it came from, so that :func:`write_exports` right after
    has nothing to redo.
    """

    def __init__(self, root: Path) -> None:
        self.dir = layout.exports_dir(root)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._files = {name: open(self.dir / f"{name}.partial", "wb") for name in EXPORT_FILES}
        self.written = dict.fromkeys(EXPORT_FILES, 0)

    def _emit(self, name: str, row: dict[str, Any]) -> None:
        self._files[name].write(encode_line(row))
        self.written[name] += 1

    def add(
        self, prompt: dict[str, Any] | None, gens: list[dict[str, Any]], act: dict[str, Any] | None
    ) -> None:
        """One prompt group: its consolidated prompt row, its generations sorted by sample id,
        and the activation row of its primary (None when capture failed)."""
        if prompt is None or not gens or gens[0]["sample_id"] != 0:
            return
        pid = prompt["prompt_id"]
        whole_primary = gens[0]
        gens = [answer_view(g) for g in gens]  # scored on the answer, reasoning left out
        primary, samples = gens[0], gens[1:]
        base = {
            "prompt_id": pid,
            "label": prompt.get("label"),
            "label_grader": prompt.get("label_grader"),
            "question": (prompt.get("meta") or {}).get("question") or prompt.get("prompt"),
            "prompt": prompt.get("prompt"),
            "sample_ids": [g["sample_id"] for g in gens],
        }
        if is_no_answer(whole_primary):  # the primary's reasoning never closed: not graded
            base["no_answer"] = True
        emit = self._emit
        emit(
            layout.SELFCHECK_SAMPLES,
            {
                **base,
                "primary": {"sample_id": 0, "text": primary["text"]},
                "samples": [{"sample_id": g["sample_id"], "text": g["text"]} for g in samples],
            },
        )
        emit(
            layout.SEMANTIC_ENTROPY_INPUTS,
            {
                **base,
                "primary": _logprob_summary(primary),
                "samples": [_logprob_summary(g) for g in samples],
            },
        )
        energy = [_energy_sample(g) for g in gens]
        emit(
            layout.SEMANTIC_ENERGY_INPUTS,
            {
                **base,
                "logit_source": (
                    "raw_logits"
                    if all(e["logit_source"] == "raw_logits" for e in energy)
                    else "logprobs_only"
                ),
                "samples": energy,
            },
        )
        emit(layout.GEOMETRY_INPUTS, {**base, **_geometry(prompt, whole_primary, act)})
        emit(
            layout.LOGPROB_INPUTS,
            {
                **base,
                "sample_id": 0,
                "text": primary["text"],
                "tokens": [t["token"] for t in primary.get("logprobs") or []],
                "token_ids": primary.get("token_ids"),
                "token_logprobs": _token_logprobs(primary),
                "top_logprobs": [t["top_logprobs"] for t in primary.get("logprobs") or []],
            },
        )

    def close(self, *, commit: bool = True) -> dict[str, int]:
        try:
            if commit:
                for f in self._files.values():
                    f.flush()
                    os.fsync(f.fileno())
        finally:
            for f in self._files.values():
                f.close()
        for name in EXPORT_FILES:
            partial = self.dir / f"{name}.partial"
            if commit:
                os.replace(partial, self.dir / name)
            else:
                partial.unlink(missing_ok=True)
        return dict(self.written)


_STAMP = ".source.json"


def _source_stamp(root: Path) -> dict[str, list[int]]:
    out = layout.consolidated_dir(root)
    stamp = {}
    for name in layout.CONSOLIDATED_JSONL_FILES:
        st = os.stat(out / name)
        stamp[name] = [st.st_size, st.st_mtime_ns, st.st_ino]
    return stamp


def stamp_exports(root: Path, written: dict[str, int]) -> None:
    """Record that the exports were made from the consolidated files as they are now."""
    path = layout.exports_dir(root) / _STAMP
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps({"source": _source_stamp(root), "written": written}))
    os.replace(tmp, path)


def _fresh(root: Path) -> dict[str, int] | None:
    try:
        doc = json.loads((layout.exports_dir(root) / _STAMP).read_text())
        if doc["source"] != _source_stamp(root):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all((layout.exports_dir(root) / name).exists() for name in EXPORT_FILES):
        return None
    return {name: int(doc["written"][name]) for name in EXPORT_FILES}


def iter_prompt_groups(
    root: Path,
) -> Iterator[tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]]:
    """(prompt row or None, its generations sorted by sample id, its activation index rows) of
    every prompt of ``consolidated/``, streamed (memory: one prompt group)."""
    out = layout.consolidated_dir(root)
    passed: set[str] = set()
    prompts = _Cursor(iter_rows(out / layout.PROMPT_INDEX), passed)
    acts = _Cursor(iter_rows(out / layout.ACTIVATION_INDEX), passed)
    for pid, gens in _groups(out / layout.GENERATIONS):
        prompt_rows = prompts.take(pid)
        act_rows = acts.take(pid)
        passed.add(pid)
        yield (prompt_rows[-1] if prompt_rows else None), gens, act_rows


def write_exports(root: Path) -> dict[str, int]:
    """Write every export into ``consolidated/exports/``; returns rows written per file.

    Nothing is rewritten when consolidation already wrote them from the consolidated files as
    they are now (same size, mtime and inode; see :class:`ExportWriter`).
    """
    fresh = _fresh(root)
    if fresh is not None:
        return fresh
    writer = ExportWriter(root)
    try:
        for prompt, gens, act_rows in iter_prompt_groups(root):
            act = next((a for a in reversed(act_rows) if a.get("sample_id") == 0), None)
            writer.add(prompt, gens, act)
    except BaseException:
        writer.close(commit=False)
        raise
    written = writer.close()
    stamp_exports(root, written)
    return written


def _geometry(
    prompt: dict[str, Any], primary: dict[str, Any], act: dict[str, Any] | None
) -> dict[str, Any]:
    """Primary + reference + where the prompt end and answer tokens sit in the stored rows."""
    key = f"{prompt['prompt_id']}_0"
    p = len(prompt.get("prompt_token_ids") or [])
    r = len(primary.get("token_ids") or [])
    a = answer_start(primary)  # the answer's first token (0 without reasoning)
    row = {
        "sample_id": 0,
        "primary": primary["text"],
        "reference_answer": prompt.get("reference_answer"),
        "activation_key": key if act else None,
        "prompt_end_position": p - 1 if p else None,
        "answer_token_positions": list(range(p + a, p + r)),
    }
    if act:
        start, n = act.get("row0_position", 0), act.get("num_rows", act["shape"][1])
        # row j sits at token_positions[j] (--positions runs), else at row0_position + j
        at = act.get("token_positions")
        at = list(range(start, start + n)) if at is None else at
        row_of = {pos: j for j, pos in enumerate(at)}
        named = act.get("positions")
        tbg = named.get("tbg") if named else None
        row.update(
            layers=act["layers"],
            sequence_mode=act["sequence_mode"],
            row0_position=start,
            num_rows=n,
            token_positions=at,
            positions=named,
            exact_answer_span=act.get("exact_answer_span"),
            prompt_end_row=tbg[0] if tbg else row_of.get(p - 1),
            answer_token_rows=[row_of[pos] for pos in range(p + a, p + r) if pos in row_of],
        )
    return row
