"""The worker grades every generation by its group's reference kind (hallulog.contracts.answer_kinds):
``answer_grader`` and the label fields of the rows it writes."""

from __future__ import annotations

from hallulog.contracts.answer_kinds import Grade
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.workers.rows import answer_grader
from hallulog.workers.rows import grade_fields as _grade_fields

MESSAGES = [{"role": "user", "content": "Q?"}]


def group(reference) -> PromptGroup:
    return PromptGroup.create("t", "dev", 0, MESSAGES, reference=reference)


def test_answer_grader_follows_the_reference_kind():
    trivia = answer_grader(group({"value": "Paris", "aliases": ["Paris"]}))
    assert trivia("It is Paris.") == Grade(0, "alias_match", "correct", (6, 11))
    choice = answer_grader(group({"kind": "choice", "choices": ["a", "b"], "answer_index": 0}))
    assert choice("(A)") == Grade(0, "choice_match", "correct", (1, 2))
    assert choice("nothing") == Grade(1, "choice_match", "unparsed", None)
    numeric = answer_grader(group({"kind": "numeric", "number": 2.5, "tolerance": 0}))
    assert numeric("2.50") == Grade(0, "numeric_match", "correct", (0, 4))


def test_judged_and_missing_references_are_not_graded():
    for ref in ({"kind": "judge", "value": "x"}, {"value": "x", "document": "d"}, "Someone", None):
        assert answer_grader(group(ref))("x") is None
    assert _grade_fields(None) == {"label": None, "label_grader": None, "label_status": None}
    assert _grade_fields(Grade(1, "numeric_match", "unparsed")) == {
        "label": 1,
        "label_grader": "numeric_match",
        "label_status": "unparsed",
    }
