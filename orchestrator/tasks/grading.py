"""Which grader labels a task's answers: one place that maps a task to its grader.

```python
from orchestrator.tasks.grading import grader_for
grader = grader_for("precisewikiqa", judge_url="http://127.0.0.1:8000", judge_model=None)
verdict = await grader.grade(prompt_row, answer_text)     # prompt_row: a prompt_index.jsonl row
```

* :class:`~orchestrator.tasks.triviaqa.AliasGrader` (triviaqa): alias match plus a phrase list
  that flags abstentions (the label still follows the alias rule).
* :class:`~orchestrator.tasks.hallulens_grading.JudgeGrader` (precisewikiqa, longwiki,
  mixedentities): an LLM judge over the OpenAI HTTP API, prompts in ``data/judge_prompts/``.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import HallulogError
from orchestrator.tasks.hallulens_grading import JudgeGrader
from orchestrator.tasks.triviaqa import AliasGrader
from orchestrator.tasks.verdict import JUDGE_TASKS, Grader

__all__ = ["grader_for", "needs_judge"]


def needs_judge(task: str) -> bool:
    """Tasks whose labels come from the LLM judge after the run (not from the worker)."""
    return task in JUDGE_TASKS


def grader_for(task: str, *, judge_url: str | None, judge_model: str | None = None,
               **judge_options: Any) -> Grader:
    """The grader of ``task``: triviaqa → :class:`AliasGrader`, the HalluLens tasks →
    :class:`JudgeGrader` (which needs ``judge_url``)."""
    if task == "triviaqa":
        return AliasGrader()
    if task in JUDGE_TASKS:
        if not judge_url:
            raise HallulogError(f"task {task!r} is graded by an LLM judge: pass --judge-url "
                                "(the base URL of an OpenAI-compatible server, e.g. "
                                "http://127.0.0.1:8000) and optionally --judge-model")
        return JudgeGrader(task, judge_url=judge_url, judge_model=judge_model, **judge_options)
    raise ValueError(f"no grader for task {task!r}; choose one of triviaqa, "
                     f"{', '.join(JUDGE_TASKS)}")
