"""Labels after the run: the LLM judge grades each prompt's primary answer into
``{artifact_root}/labels.jsonl`` (append-only, fsynced per line, resumable), and the label
helpers the other post-run steps share.

```python
counts = await label_run(root, task="precisewikiqa", judge_url=url, judge_model=None)
```

Every file is read as a stream: a worker's ``prompt_index.jsonl`` and ``generations.jsonl`` are
joined in lockstep (both are written in commit order), and labels are looked up by byte offset.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.answer_kinds import answer_kind
from hallulog.contracts.answer_match import CORRECT, HALLUCINATED
from hallulog.contracts.errors import ArtifactError, HallulogError
from hallulog.contracts.jsonl import JsonlAppender, iter_lines, iter_rows
from hallulog.contracts.reasoning import NO_ANSWER, is_no_answer
from hallulog.tasks.grading import grader_for, needs_judge
from hallulog.tasks.judge_client import JudgeError
from hallulog.tasks.verdict import JUDGE_GRADER, JUDGE_TASKS, Grader, Verdict

__all__ = [
    "LABELS_FILE",
    "LabelIndex",
    "load_labels",
    "label_row",
    "apply_label",
    "label_run",
    "label_with_judge",
    "needs_judge",
    "unlabeled_prompts",
    "label_counts",
    "iter_prompts_with_primary",
]

log = logging.getLogger(__name__)

LABELS_FILE = layout.LABELS
UNPARSED = "unparsed"
"""The status (worker rows) and verdict (labels.jsonl) of an answer a choice or numeric grader
could not parse."""
_BUILTIN_TASKS = ("triviaqa", *JUDGE_TASKS)


class LabelIndex:
    """``prompt_id → labels.jsonl row``, holding only byte offsets (the last row wins)."""

    def __init__(self, artifact_root: str | Path) -> None:
        self.path = Path(artifact_root) / LABELS_FILE
        self._offsets: dict[str, int] = {}
        for line in iter_lines(self.path, malformed="skip"):
            pid = line.row.get("prompt_id")
            if isinstance(pid, str):
                self._offsets[pid] = line.start
        self._file = None

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self._offsets

    def __len__(self) -> int:
        return len(self._offsets)

    def __iter__(self) -> Iterator[str]:
        return iter(self._offsets)

    def __getitem__(self, prompt_id: str) -> dict[str, Any]:
        row = self.get(prompt_id)
        if row is None:
            raise KeyError(prompt_id)
        return row

    def get(self, prompt_id: str) -> dict[str, Any] | None:
        """The label row of ``prompt_id`` (read from disk), None when it has none."""
        offset = self._offsets.get(prompt_id)
        if offset is None:
            return None
        if self._file is None:
            self._file = open(self.path, "rb")
        self._file.seek(offset)
        return json.loads(self._file.readline())

    def values(self) -> Iterator[dict[str, Any]]:
        for pid in self._offsets:
            yield self.get(pid)  # type: ignore[misc]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def load_labels(artifact_root: str | Path) -> LabelIndex:
    """The labels of a run (an index over ``labels.jsonl``; torn tail ignored)."""
    return LabelIndex(artifact_root)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def label_row(prompt_id: str, verdict: Verdict, judge_model: str | None) -> dict[str, Any]:
    """The ``labels.jsonl`` line of one graded prompt."""
    return {
        "prompt_id": prompt_id,
        "label": verdict.label,
        "label_grader": verdict.grader,
        "verdict": verdict.verdict,
        "abstained": verdict.abstained,
        "judge_model": judge_model if verdict.grader == JUDGE_GRADER else None,
        "judge_raw": verdict.raw,
        "judge_details": verdict.details,
        "graded_at": _now(),
    }


def apply_label(prompt_row: dict[str, Any], label: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of a prompt_index row with the label fields of its ``labels.jsonl`` row
    (``label``, ``label_grader``, ``judge_verdict`` = the judge's raw text, plus ``verdict``,
    ``abstained``, ``judge_model``) — what consolidation writes to consolidated/prompt_index."""
    out = dict(prompt_row)
    if label is None:
        out.setdefault("judge_verdict", None)
        return out
    out.update(
        {
            "label": label.get("label"),
            "label_grader": label.get("label_grader"),
            "judge_verdict": label.get("judge_raw"),
            "verdict": label.get("verdict"),
            "abstained": label.get("abstained"),
            "judge_model": label.get("judge_model"),
        }
    )
    return out


def iter_prompts_with_primary(worker_dir: Path) -> Iterator[tuple[dict[str, Any], str | None]]:
    """(prompt row, primary answer text or None) of every committed prompt of a worker.

    ``prompt_index.jsonl`` and ``generations.jsonl`` are written in the same commit order, so
    one pass over each, in lockstep by ``commit_id``, pairs them; only the primaries of commits
    read ahead are held.
    """
    generations = iter_rows(worker_dir / layout.GENERATIONS, malformed="skip")
    ahead: dict[Any, str] = {}
    for row in iter_rows(worker_dir / layout.PROMPT_INDEX, malformed="skip"):
        commit = row.get("commit_id")
        while commit not in ahead:
            gen = next(generations, None)
            if gen is None:
                break
            if gen.get("sample_id") == 0:
                ahead[gen.get("commit_id")] = gen.get("text") or ""
        yield row, ahead.pop(commit, None)


def _unlabeled(root: Path, labeled: LabelIndex) -> Iterator[tuple[dict[str, Any], str | None]]:
    seen: set[str] = set()
    for wdir in layout.worker_dirs(root):
        for row, primary in iter_prompts_with_primary(wdir):
            pid = row.get("prompt_id")
            if not isinstance(pid, str) or pid in seen or pid in labeled:
                continue
            seen.add(pid)
            yield row, primary


async def label_run(
    artifact_root: str | Path,
    *,
    task: str | None,
    judge_url: str | None = None,
    judge_model: str | None = None,
    concurrency: int = 4,
    grader: Grader | None = None,
    max_consecutive_errors: int = 8,
) -> dict[str, Any]:
    """Grade the primary answer (sample_id 0) of every prompt of a run into ``labels.jsonl``.

    Prompts already in ``labels.jsonl`` are skipped (resumable; a torn last line is cut off
    first). One line per prompt, appended and fsynced as soon as it is graded. ``task`` None
    grades every prompt by its own ``dataset``; a task given grades only that task's prompts.
    Transient judge failures (retries exhausted) are not written, so a later call retries them;
    a judge that rejects the request (4xx) gets a ``judge_rejected`` line.

    After ``max_consecutive_errors`` transient failures in a row (the judge is down) the
    remaining prompts are left for a later call and ``aborted`` is True.

    Returns counts over all of ``labels.jsonl`` afterwards: ``correct`` (label 0),
    ``hallucinated`` (1), ``ungraded`` (None), ``abstained`` (flag; overlaps the three),
    ``unparsed`` (a choice/numeric answer with nothing to compare: among the hallucinated), plus
    ``total``, ``graded_now``, ``errors`` (+ ``first_error``), ``missing_primary``, ``no_answer``
    (primaries whose reasoning never closed: not sent to the judge),
    ``skipped_other_task``, ``aborted``. ``grader`` overrides the grader choice (tests, custom
    judges); it is not closed here.
    """
    root = Path(artifact_root)
    if not root.is_dir():
        raise ArtifactError(f"{root}: no such artifact directory")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    labels_path = root / LABELS_FILE
    counts: dict[str, Any] = {
        "graded_now": 0,
        "errors": 0,
        "missing_primary": 0,
        "skipped_other_task": 0,
        "no_answer": 0,
        "aborted": False,
    }
    graders: dict[tuple[str, str | None], Grader] = {}

    def grader_of(row: dict[str, Any]) -> Grader:
        if grader is not None:
            return grader
        name = task or row.get("dataset")
        if not isinstance(name, str):
            raise ArtifactError(
                f"prompt {row.get('prompt_id')}: no dataset to pick a grader by; pass task="
            )
        # the built-in tasks have one grader each; any other task's by its references' kind
        kind = None if name in _BUILTIN_TASKS else answer_kind(row.get("reference"))
        if (name, kind) not in graders:
            graders[name, kind] = grader_for(
                name, judge_url=judge_url, judge_model=judge_model, answer_kind=kind
            )
        return graders[name, kind]

    def todo() -> Iterator[tuple[str, dict[str, Any], str]]:
        labeled = load_labels(root)
        try:
            for row, primary in _unlabeled(root, labeled):
                if task is not None and row.get("dataset") not in (None, task):
                    counts["skipped_other_task"] += 1
                elif primary is None:
                    counts["missing_primary"] += 1
                elif is_no_answer(row):  # the reasoning never closed: nothing to grade
                    counts["no_answer"] += 1
                else:
                    yield row["prompt_id"], row, primary
        finally:
            labeled.close()

    first_error: list[str] = []
    streak = [0]
    write_lock = asyncio.Lock()
    try:
        # fail fast (e.g. no --judge-url) before any file is written or request sent
        for _pid, row, _answer in todo():
            grader_of(row)
        counts.update(missing_primary=0, skipped_other_task=0, no_answer=0)
        with JsonlAppender(labels_path) as out:

            async def one(pid: str, row: dict[str, Any], answer: str) -> None:
                g = grader_of(row)
                if streak[0] >= max_consecutive_errors:
                    counts["aborted"] = True
                    return
                try:
                    verdict = await g.grade(row, answer)
                    streak[0] = 0
                except JudgeError as exc:
                    if not exc.permanent:
                        streak[0] += 1
                        counts["errors"] += 1
                        if not first_error:
                            first_error.append(str(exc))
                        log.warning("prompt %s not graded: %s", pid, exc)
                        return
                    verdict = Verdict(None, JUDGE_GRADER, "judge_rejected", False, str(exc))
                async with write_lock:
                    out.append([label_row(pid, verdict, g.judge_model)])
                    await asyncio.to_thread(out.sync)
                    counts["graded_now"] += 1

            await _bounded_gather(_aiter(todo()), one, concurrency)
    finally:
        await _close_all(graders.values())

    summary: dict[str, Any] = {
        "correct": 0,
        "hallucinated": 0,
        "ungraded": 0,
        "abstained": 0,
        "unparsed": 0,
        "total": 0,
    }
    for row in _last_label_rows(labels_path):
        label = row.get("label")
        summary[
            "correct"
            if label == CORRECT
            else "hallucinated"
            if label == HALLUCINATED
            else "ungraded"
        ] += 1
        summary["abstained"] += bool(row.get("abstained"))
        summary["unparsed"] += row.get("verdict") == UNPARSED
        summary["total"] += 1
    summary.update(counts)
    if first_error:
        summary["first_error"] = first_error[0]
    return summary


async def _aiter(items: Iterable[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def _bounded_gather(items: AsyncIterator[tuple], func, limit: int) -> None:
    """``func(*item)`` for every item, at most ``limit`` at once; the first error is raised
    after the running ones finish."""
    running: set[asyncio.Task] = set()
    error: BaseException | None = None
    async for item in items:
        if error is not None:
            break
        running.add(asyncio.create_task(func(*item)))
        if len(running) >= limit:
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            error = error or next((t.exception() for t in done if t.exception()), None)
    if running:
        done, _ = await asyncio.wait(running)
        error = error or next((t.exception() for t in done if t.exception()), None)
    if error is not None:
        raise error


def _last_label_rows(path: Path) -> Iterator[dict[str, Any]]:
    index = LabelIndex(path.parent)
    try:
        yield from index.values()
    finally:
        index.close()


async def _close_all(graders: Iterable[Grader]) -> None:
    for g in list(graders):
        await g.aclose()


def unlabeled_prompts(root: Path) -> set[str]:
    """Committed prompts without a label in the worker rows nor in ``labels.jsonl``."""
    labeled = load_labels(root)
    try:
        return {
            row["prompt_id"]
            for wdir in layout.worker_dirs(root)
            for row in iter_rows(wdir / layout.PROMPT_INDEX)
            if row.get("label") is None and row["prompt_id"] not in labeled
        }
    finally:
        labeled.close()


def label_with_judge(
    artifact_root: Path, *, task: str, judge_url: str | None, judge_model: str
) -> dict[str, Any]:
    """Label a finished run's prompts with the judge (the run's own server by default)."""
    if judge_url is None:
        raise HallulogError(f"task {task} is graded by an LLM judge: set --judge-url")
    return asyncio.run(
        label_run(artifact_root, task=task, judge_url=judge_url, judge_model=judge_model)
    )


def label_counts(root: Path) -> dict[str, int]:
    """Label balance over the committed prompts (judge labels from labels.jsonl win):
    ``correct``, ``hallucinated``, ``unlabeled``, and ``unparsed`` — primary answers a choice or
    numeric grader could not parse (``label_status`` / labels.jsonl ``verdict`` ``unparsed``),
    counted among the hallucinated too; ``no_answer`` (present when any) — primaries whose
    reasoning never closed, counted among the unlabeled."""
    judged = load_labels(root)
    counts = {"correct": 0, "hallucinated": 0, "unlabeled": 0, "unparsed": 0}
    seen: set[str] = set()
    try:
        for wdir in layout.worker_dirs(root):
            for row in iter_rows(wdir / layout.PROMPT_INDEX):
                pid = row["prompt_id"]
                if pid in seen:
                    continue
                seen.add(pid)
                label, status = row.get("label"), row.get("label_status")
                if pid in judged:
                    judge_row = judged.get(pid) or {}
                    label, status = judge_row.get("label"), judge_row.get("verdict")
                counts[
                    "correct" if label == 0 else "hallucinated" if label == 1 else "unlabeled"
                ] += 1
                counts["unparsed"] += status == UNPARSED
                if status == NO_ANSWER:  # a key only in runs that have such answers
                    counts["no_answer"] = counts.get("no_answer", 0) + 1
    finally:
        judged.close()
    return counts
