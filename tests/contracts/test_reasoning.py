"""The reasoning split rule (contracts/reasoning.py), the answer view every scorer reads, and the
positions of reasoning generations (contracts/positions.py)."""

from hallulog.contracts.positions import parse_positions, resolve_positions
from hallulog.contracts.reasoning import (
    NO_ANSWER,
    ReasoningMarkers,
    ReasoningSplit,
    answer_start,
    answer_view,
    is_no_answer,
    markers_from_vocab,
    split_reasoning,
)

M = ReasoningMarkers(start_id=100, end_id=101)
OPEN_PROMPT = [1, 2, 100, 7]  # the template wrote <think>\n
CLOSED_PROMPT = [1, 2, 100, 7, 101, 7]  # --thinking off: an empty block


def test_split_of_a_closed_reasoning():
    assert split_reasoning(OPEN_PROMPT, [5, 6, 101, 8, 9], M) == ReasoningSplit((0, 2), 3)


def test_a_reasoning_that_never_closes_has_no_answer():
    assert split_reasoning(OPEN_PROMPT, [5, 6, 7], M) == ReasoningSplit((0, 3), None)
    assert split_reasoning(OPEN_PROMPT, [], M) == ReasoningSplit((0, 0), None)


def test_the_model_may_open_the_reasoning_itself():
    assert split_reasoning([1, 2], [100, 5, 101, 9], M) == ReasoningSplit((1, 2), 3)


def test_generations_that_do_not_reason_are_not_split():
    assert split_reasoning(CLOSED_PROMPT, [5, 101, 9], M) is None  # thinking off
    assert split_reasoning([1, 2], [5, 101, 9], M) is None  # no <think> anywhere
    assert split_reasoning(OPEN_PROMPT, [5, 101, 9], None) is None  # no markers


def test_the_end_marker_as_first_token_gives_an_empty_reasoning():
    assert split_reasoning(OPEN_PROMPT, [101, 9], M) == ReasoningSplit((0, 0), 1)


def test_markers_come_from_the_added_tokens():
    assert markers_from_vocab({"<think>": 100, "</think>": 101, "<|im_end|>": 2}) == M
    assert markers_from_vocab({"<|im_end|>": 2}) is None
    assert markers_from_vocab({"<think>": 100}) is None


def _row(**extra):
    return {
        "text": "Paris",
        "token_ids": [5, 6, 101, 8, 9],
        "logprobs": [{"token": str(t), "logprob": -float(t)} for t in (5, 6, 101, 8, 9)],
        "label_status": "correct",
        **extra,
    }


def test_answer_view_slices_logprobs_and_ids_to_the_answer():
    row = _row(reasoning="hmm", reasoning_span=[0, 2], answer_token_start=3)
    view = answer_view(row)
    assert view["token_ids"] == [8, 9] and [t["token"] for t in view["logprobs"]] == ["8", "9"]
    assert view["text"] == "Paris" and row["token_ids"] == [5, 6, 101, 8, 9]  # row untouched
    assert answer_start(row) == 3 and not is_no_answer(row)


def test_answer_view_of_a_row_without_reasoning_is_the_row():
    row = _row()
    assert answer_view(row) is row and answer_start(row) == 0


def test_a_no_answer_row_has_an_empty_answer():
    row = _row(
        text="",
        reasoning="hmm",
        reasoning_span=[0, 5],
        answer_token_start=None,
        label_status=NO_ANSWER,
    )
    assert is_no_answer(row) and answer_start(row) == 5
    assert answer_view(row)["token_ids"] == [] and answer_view(row)["logprobs"] == []


NAMES = parse_positions(
    "tbg,slt,first:2,exact_answer,answer_first,answer_last,reasoning_last,reasoning"
)


def _rows(**kw):
    r = resolve_positions(NAMES, prompt_len=5, capture_mode="generation", **kw)
    return {name: tuple(r.positions[j] for j in idx) for name, idx in r.rows.items()}


def test_positions_of_a_reasoning_generation():
    # P=5; tokens: r r r </think> a a a a (R=8); reasoning [0,3), answer from 4
    got = _rows(response_len=8, exact_answer=(5, 7), reasoning=(0, 3), answer_start=4)
    assert got == {
        "tbg": (4,),  # before generation: the reasoning's first token is predicted there
        "slt": (11,),  # second-last answer token
        "first:2": (9, 10),
        "exact_answer": (10, 11),  # span already in response tokens
        "answer_first": (9,),
        "answer_last": (11,),  # the last captured answer position (generation capture)
        "reasoning_last": (8,),  # the </think> state: it produced the first answer token
        "reasoning": (5, 6, 7),
    }


def test_positions_of_a_reasoning_that_never_closed():
    got = _rows(response_len=6, exact_answer=None, reasoning=(0, 6), answer_start=None)
    assert got["tbg"] == (4,) and got["reasoning"] == (5, 6, 7, 8, 9)
    for name in ("slt", "first:2", "exact_answer", "answer_first", "answer_last"):
        assert got[name] == (), name
    assert got["reasoning_last"] == ()


def test_positions_without_reasoning_are_as_before():
    got = _rows(response_len=3, exact_answer=(0, 1))
    assert got["answer_first"] == (5,) and got["answer_last"] == (6,) and got["slt"] == (6,)
    assert got["first:2"] == (5, 6) and got["exact_answer"] == (5,)
    assert got["reasoning"] == () and got["reasoning_last"] == ()
    prefill = resolve_positions(
        ("answer_last",), prompt_len=5, response_len=3, capture_mode="prefill", exact_answer=None
    )
    assert prefill.positions == (7,)  # prefill holds the last answer token's state
