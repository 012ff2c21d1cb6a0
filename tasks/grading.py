"""Which grader labels a task's answers: one place that maps a task (and its answer kind) to its
grader.

```python
from hallulog.tasks.grading import grader_for
grader = grader_for("precisewikiqa", judge_url="http://127.0.0.1:8000", judge_model=None)
grader = grader_for("nq_open", judge_url=url, answer_kind="judge")   # generic QA judge
verdict = await grader.grade(prompt_row, answer_text)     # prompt_row: a prompt_index.jsonl row
```

* :class:`~hallulog.tasks.triviaqa.AliasGrader` (triviaqa, and every task whose references
  are of the ``aliases``, ``choice`` or ``numeric`` kind): the rules of
  :mod:`hallulog.contracts.answer_kinds` (the worker's own labels) plus a phrase list that flags
  abstentions (the label still follows the kind's rule).
* :class:`~hallulog.tasks.hallulens_grading.JudgeGrader` (precisewikiqa, longwiki,
  mixedentities, and — with the precisewikiqa rules — every other task whose references are of
  the ``judge`` kind): an LLM judge over the OpenAI HTTP API, prompts in ``data/judge_prompts/``.
"""

from __future__ import annotations

from typing import Any

from hallulog.contracts.answer_kinds import ALIASES, CHOICE, JUDGE, NUMERIC
from hallulog.contracts.errors import HallulogError
from hallulog.tasks.hallulens_grading import JudgeGrader
from hallulog.tasks.triviaqa import AliasGrader
from hallulog.tasks.verdict import JUDGE_TASKS, Grader

__all__ = ["grader_for", "judge_grader", "needs_judge", "needs_judge_for"]


def needs_judge(task: str) -> bool:
    """Tasks whose labels come from the LLM judge after the run (not from the worker)."""
    return task in JUDGE_TASKS


def needs_judge_for(answer_kind: str | None, task: str) -> bool:
    """Whether a task's answers are labelled by the LLM judge after the run: answer kind
    ``judge`` → True, another kind → False, no kind → :func:`needs_judge` (the task's rule)."""
    if answer_kind is None:
        return needs_judge(task)
    return answer_kind == JUDGE


def judge_grader(
    judge_url: str | None,
    judge_model: str | None = None,
    task_style: str = "precisewikiqa",
    *,
    task: str | None = None,
    **judge_options: Any,
) -> JudgeGrader:
    """An LLM-judge grader with the rules of ``task_style`` (default: PreciseWikiQA's
    abstention → correctness against the reference answer and its accepted aliases) for
    ``task`` (recorded in the verdicts' details; default ``task_style``). Raises
    :class:`HallulogError` naming ``--judge-url`` when there is no judge URL."""
    name = task or task_style
    if not judge_url:
        raise HallulogError(
            f"task {name!r} is graded by an LLM judge: pass --judge-url "
            "(the base URL of an OpenAI-compatible server, e.g. "
            "http://127.0.0.1:8000) and optionally --judge-model"
        )
    return JudgeGrader(
        name, judge_url=judge_url, judge_model=judge_model, style=task_style, **judge_options
    )


def grader_for(
    task: str,
    *,
    judge_url: str | None,
    judge_model: str | None = None,
    answer_kind: str | None = None,
    **judge_options: Any,
) -> Grader:
    """The grader of ``task``: triviaqa → :class:`AliasGrader`, the HalluLens tasks →
    :class:`JudgeGrader` (which needs ``judge_url``). Any other task by its references'
    ``answer_kind``: ``judge`` → the generic judge (:func:`judge_grader`), ``aliases`` /
    ``choice`` / ``numeric`` → :class:`AliasGrader`."""
    if task == "triviaqa":
        return AliasGrader()
    if task in JUDGE_TASKS:
        return judge_grader(judge_url, judge_model, task, task=task, **judge_options)
    if answer_kind == JUDGE:
        return judge_grader(judge_url, judge_model, task=task, **judge_options)
    if answer_kind in (ALIASES, CHOICE, NUMERIC):
        return AliasGrader()
    raise ValueError(
        f"no grader for task {task!r}; choose one of triviaqa, "
        f"{', '.join(JUDGE_TASKS)}, or give its answer kind"
    )
