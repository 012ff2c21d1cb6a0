"""The stored row each activation probe reads (evaluation/features.py ``probe_rows``) for a
reasoning model's primary: counted from the answer's first token, not from the prompt's end."""

from hallulog.evaluation.features import probe_rows


def _geo(answer_start: int) -> dict:
    # P = 4 prompt tokens, R = 8 generated (reasoning 0..2, </think> at 3, answer 4..7);
    # response capture with generation: positions 3 .. P+R-2 = 10
    p, r = 4, 8
    return {
        "activation_key": "k_0",
        "prompt_end_position": p - 1,
        "answer_token_positions": list(range(p + answer_start, p + r)),
        "row0_position": p - 1,
        "num_rows": r,
    }


def test_rows_of_a_reasoning_primary_count_from_the_answer():
    rows = probe_rows(_geo(4), ["Paris", ".", "\n", "x"])
    assert rows["tbg"] == 0  # P-1: the prompt's end (docs/alignment.md)
    assert rows["slt"] == 10 - 3  # P+R-2: the second-last answer token
    assert rows["exact"] == 8 - 3  # the answer's first token P+4, the exact answer's index 0


def test_rows_without_reasoning_are_as_before():
    rows = probe_rows(_geo(0), ["Paris", ".", "\n", "x", "y", "z", "w", "v"])
    assert (rows["tbg"], rows["slt"], rows["exact"], rows["last"]) == (0, 7, 1, 7)
