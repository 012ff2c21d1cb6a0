"""The worker's split of a reasoning generation (workers/reasoning.py): the answer text from
what the server handed back, checked against the generated token ids."""

from __future__ import annotations

import pytest
from hallulog.contracts.reasoning import ReasoningMarkers
from hallulog.workers.client import Completion
from hallulog.workers.reasoning import ReasoningMismatch, reasoning_fields, split_completion

M = ReasoningMarkers(start_id=100, end_id=101)
OPEN = [1, 100, 7]


def _comp(text: str, ids: list[int], reasoning: str | None = None, prompt=OPEN) -> Completion:
    return Completion(
        text=text,
        finish_reason="stop",
        prompt_token_ids=list(prompt),
        token_ids=ids,
        logprobs=[],
        usage={},
        hidden_states_path=None,
        elapsed_ms=1,
        reasoning=reasoning,
    )


def test_a_server_split_is_kept():
    comp = _comp("Paris", [5, 101, 9], reasoning="hmm")
    split_completion(comp, M)
    assert (comp.text, comp.reasoning) == ("Paris", "hmm")
    assert reasoning_fields(comp) == {
        "reasoning": "hmm",
        "reasoning_span": [0, 1],
        "answer_token_start": 2,
    }


def test_a_whole_text_is_cut_at_the_end_marker():  # vLLM without a reasoning parser
    comp = _comp("hmm</think>\n\nParis", [5, 101, 9])
    split_completion(comp, M)
    assert (comp.text, comp.reasoning) == ("\n\nParis", "hmm")


def test_no_answer_is_marked_and_never_an_answer():
    comp = _comp("", [5, 6], reasoning="hmm hmm")
    split_completion(comp, M)
    assert comp.text == "" and reasoning_fields(comp)["label_status"] == "no_answer"
    assert reasoning_fields(comp)["answer_token_start"] is None
    whole = _comp("hmm hmm", [5, 6])  # a server that does not split
    split_completion(whole, M)
    assert (whole.text, whole.reasoning) == ("", "hmm hmm")


def test_a_generation_that_does_not_reason_is_untouched():
    comp = _comp("Paris", [9], prompt=[1, 100, 7, 101])
    assert split_completion(comp, M) is None and reasoning_fields(comp) == {}
    assert comp.text == "Paris"


@pytest.mark.parametrize(
    "comp, why",
    [
        (_comp("Paris", [5, 6], reasoning="hmm"), "answer"),  # an answer without </think>
        (_comp("Paris", [5, 101, 9]), "does not close"),  # </think> in ids, not in the text
        (_comp("Paris", [9], reasoning="hmm", prompt=[1]), "no open reasoning"),
    ],
)
def test_what_disagrees_with_the_token_ids_is_an_error(comp, why):
    with pytest.raises(ReasoningMismatch, match=why):
        split_completion(comp, M)
