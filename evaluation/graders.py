"""Agreement between two graders of the same primary answers.

A run can hold more than one label per primary answer: the label the report uses (the prompt's,
``labels.jsonl``'s when there is one: the LLM judge), the worker's label of the primary
generation (alias, choice or numeric match) when its grader differs, and the alias match of the
primary against the reference's accepted answers when the reference has aliases but no alias
grader labelled it (a ``judge`` reference with aliases). ``other_labels`` lists them per prompt;
the report gives, for each grader beside the primary one, Cohen's kappa and the raw agreement
on the prompts both label, and every method's AUROC, PRR and FPR@95 under that grader's labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from hallulog.contracts.answer_match import alias_matcher
from hallulog.evaluation.leakage import accepted_answers

__all__ = ["ALIAS_MATCH", "other_labels", "agreement"]

ALIAS_MATCH = "alias_match"


def other_labels(
    prompt_row: Mapping[str, Any], primary: Mapping[str, Any] | None
) -> dict[str, int]:
    """``{grader: label}`` of the primary answer beside the prompt's own label."""
    main = prompt_row.get("label_grader")
    out: dict[str, int] = {}
    if primary is not None:
        g, lab = primary.get("label_grader"), primary.get("label")
        if g and g != main and lab in (0, 1):
            out[g] = int(lab)
    ref = prompt_row.get("reference")
    if (
        ALIAS_MATCH not in out
        and main != ALIAS_MATCH
        and primary is not None
        and isinstance(ref, Mapping)
        and ref.get("kind") in (None, "aliases", "judge")
    ):
        answers = accepted_answers(ref)
        if answers:
            out[ALIAS_MATCH] = alias_matcher(answers)(primary.get("text"))
    return out


def agreement(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Cohen's kappa, raw agreement and the 2x2 counts of two label vectors (NaN: unlabelled),
    on the prompts both label."""
    from sklearn.metrics import cohen_kappa_score, confusion_matrix

    ok = np.isfinite(a) & np.isfinite(b)
    x, y = a[ok].astype(int), b[ok].astype(int)
    if not len(x):
        return {"n": 0}
    kappa = float(cohen_kappa_score(x, y)) if len(np.unique(np.r_[x, y])) > 1 else float("nan")
    cm = confusion_matrix(x, y, labels=[0, 1])
    return {
        "n": int(ok.sum()),
        "kappa": kappa,
        "agreement": float((x == y).mean()),
        "confusion": {
            "both_correct": int(cm[0, 0]),
            "both_hallucinated": int(cm[1, 1]),
            "only_primary_hallucinated": int(cm[1, 0]),
            "only_other_hallucinated": int(cm[0, 1]),
        },
    }
