"""What each task with a layout of its own reads, said when it is handed a file of another kind
(``FileKindError``): the layouts, and the ``--task qa`` flags that map a file in any other.

```python
from hallulog.tasks.layout_hints import layout_hint
layout_hint("nq_open")   # "--task nq_open reads NQ-open.dev.jsonl ...; a file in another ..."
```
"""

from __future__ import annotations

__all__ = ["READS", "layout_hint"]

_HF = "as Parquet, JSON Lines or a save_to_disk directory"

#: task → (what it reads, the flags besides --question-field/--answers-field for --task qa)
READS: dict[str, tuple[str, str]] = {
    "triviaqa": (
        'the released JSON ({"Data": [...]}, e.g. unfiltered-web-dev.json), its items as JSON '
        f"Lines, or mandarjoshi/trivia_qa (question_id, question, answer.value, answer.aliases) {_HF}",
        " --id-field FIELD",
    ),
    "nq_open": (
        'NQ-open.dev.jsonl ({"question", "answer": [...]}) or google-research-datasets/nq_open '
        f"{_HF}",
        "",
    ),
    "squad": (
        "SQuAD v1.1/v2.0 dev-v*.json, or rajpurkar/squad(_v2) (id, question, context, answers.text) "
        f"{_HF}",
        " --id-field FIELD --context-field FIELD",
    ),
    "hotpotqa": (
        "hotpot_dev_distractor_v1.json, or hotpotqa/hotpot_qa (id, question, answer, context) "
        f"{_HF}",
        " --id-field FIELD --context-field FIELD",
    ),
    "popqa": (
        f"popQA.tsv, or akariasai/PopQA (id, question, possible_answers) {_HF}",
        " --id-field FIELD",
    ),
    "truthfulqa": (
        "TruthfulQA.csv, or truthfulqa/truthful_qa generation (question, best_answer, "
        f"correct_answers, incorrect_answers) {_HF}",
        " --answer-kind judge",
    ),
    "sciq": (
        "SciQ test.json, or allenai/sciq (question, correct_answer, distractor1..3, support) "
        f"{_HF}",
        " --choices-field FIELD --answer-kind choice",
    ),
    "mmlu": (
        "data/test/<subject>_test.csv (no header) or its directory, or cais/mmlu (question, "
        f"subject, choices, answer) {_HF}",
        " --choices-field FIELD --answer-kind choice",
    ),
    "gsm8k": (
        f'test.jsonl, or openai/gsm8k main (question, answer ending "#### <number>") {_HF}',
        " --answer-kind numeric",
    ),
    "svamp": (
        f"SVAMP.json, or ChilleD/SVAMP (ID, Body, Question, Answer) {_HF}",
        " --id-field FIELD --answer-kind numeric",
    ),
    "bioasq": (
        'the BioASQ training JSON ({"questions": [...]}), or an export with its field names '
        f"(id, body, type, exact_answer, snippets) {_HF}",
        " --id-field FIELD --context-field FIELD",
    ),
}


def layout_hint(task: str) -> str | None:
    """One sentence: what ``task`` reads and how ``--task qa`` maps another layout (None for a
    task without a layout of its own)."""
    if task not in READS:
        return None
    reads, extra = READS[task]
    return (
        f"--task {task} reads {reads}; a file in another layout: --task qa --task-path FILE "
        f"--question-field FIELD --answers-field FIELD{extra} (docs/tasks.md)"
    )
