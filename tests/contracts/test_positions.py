"""contracts/positions.py and contracts/exact_answer.py: names, windows, layer lists, both capture
routes, edge cases (docs/alignment.md)."""

from __future__ import annotations

import pytest
from hallulog.contracts.exact_answer import char_to_token_span, exact_answer_span, first_line_span
from hallulog.contracts.positions import (
    POSITION_NAMES,
    count_rows,
    num_captured,
    parse_layers,
    parse_positions,
    resolve_positions,
)

P, R = 7, 5
GEN, PRE = "generation", "prefill"


def _positions(name, *, p=P, r=R, mode=GEN, exact=(1, 3)):
    res = resolve_positions(
        (name,), prompt_len=p, response_len=r, capture_mode=mode, exact_answer=exact
    )
    return [res.positions[j] for j in res.rows[name]]


# ---- parse_positions ----------------------------------------------------------------------------


def test_parse_positions_normalizes_and_keeps_order():
    assert parse_positions("tbg,slt,exact_answer,last:4") == (
        "tbg",
        "slt",
        "exact_answer",
        "last:4",
    )
    assert parse_positions(" TBG , last:04,tbg,, first:1") == ("tbg", "last:4", "first:1")
    assert set(POSITION_NAMES) == set(parse_positions(",".join(POSITION_NAMES)))


@pytest.mark.parametrize(
    "text,word",
    [
        ("tbg,foo", "'foo'"),
        ("last:0", "K must be"),
        ("first:x", "K must be"),
        ("last:-2", "K must be"),
        ("", "no position"),
        ("mid:3", "'mid:3'"),
    ],
)
def test_parse_positions_names_the_flag_and_value(text, word):
    with pytest.raises(ValueError, match="--positions") as err:
        parse_positions(text)
    assert word in str(err.value)


# ---- parse_layers -------------------------------------------------------------------------------


def test_parse_layers():
    assert parse_layers("0,8,16-20,-1", 30) == [0, 8, 16, 17, 18, 19, 20, 30]
    assert parse_layers("-1,-2", 30) == [29, 30]
    assert parse_layers("-4--1", 30) == [27, 28, 29, 30]
    assert parse_layers("28--1,30", 30) == [28, 29, 30]
    assert parse_layers("5,5,0-1", 30) == [0, 1, 5]
    assert parse_layers("0,-31", 30) == [0]


@pytest.mark.parametrize(
    "text,message",
    [
        ("40", "--layers: layer 40 is out of range for a model with 30 layers (ids 0..30)"),
        ("-32", "--layers: layer -32 is out of range for a model with 30 layers (ids 0..30)"),
        ("20-10", "reversed"),
        ("a", "cannot read"),
        ("1-2-3", "cannot read"),
        ("", "no layer"),
    ],
)
def test_parse_layers_errors(text, message):
    with pytest.raises(ValueError, match="--layers") as err:
        parse_layers(text, 30)
    assert message in str(err.value)


# ---- every name, both capture routes --------------------------------------------------------


def test_captured_positions():
    assert num_captured(prompt_len=P, response_len=R, capture_mode=GEN) == P + R - 1
    assert num_captured(prompt_len=P, response_len=R, capture_mode=PRE) == P + R
    with pytest.raises(ValueError):
        num_captured(prompt_len=P, response_len=R, capture_mode="other")


@pytest.mark.parametrize("mode,n", [(GEN, P + R - 1), (PRE, P + R)])
def test_every_name(mode, n):
    assert _positions("prompt", mode=mode) == list(range(P))
    assert _positions("tbg", mode=mode) == [P - 1]
    assert _positions("response", mode=mode) == list(range(P - 1, n))
    assert _positions("all", mode=mode) == list(range(n))
    assert _positions("last", mode=mode) == [n - 1]
    assert _positions("slt", mode=mode) == [P + R - 2]
    assert _positions("exact_answer", mode=mode) == [P + 1, P + 2]
    assert _positions("first:2", mode=mode) == [P, P + 1]
    assert _positions("first:99", mode=mode) == list(range(P, n))
    assert _positions("last:3", mode=mode) == [n - 3, n - 2, n - 1]
    assert _positions("last:99", mode=mode) == list(range(n))


def test_slt_is_last_with_generation_capture_and_not_with_prefill():
    assert _positions("slt") == _positions("last") == [P + R - 2]
    assert _positions("last", mode=PRE) == [P + R - 1]


def test_the_union_is_sorted_and_each_name_points_into_it():
    res = resolve_positions(
        ("last", "tbg", "exact_answer", "slt"),
        prompt_len=P,
        response_len=R,
        capture_mode=GEN,
        exact_answer=(1, 3),
    )
    assert res.positions == (P - 1, P + 1, P + 2, P + R - 2)
    assert dict(res.rows) == {"last": (3,), "tbg": (0,), "exact_answer": (1, 2), "slt": (3,)}
    assert list(res.rows) == ["last", "tbg", "exact_answer", "slt"]
    assert not res.contiguous and res.missing == () and res.num_tokens == P + R - 1
    assert (
        count_rows(
            ("last", "tbg", "exact_answer", "slt"),
            prompt_len=P,
            response_len=R,
            capture_mode=GEN,
            exact_answer_len=2,
        )
        == 4
    )  # first two answer tokens: P, P+1


def test_exact_answer_is_clipped_to_the_captured_positions():
    # the span's last token is the last response token: never fed back during generation
    assert _positions("exact_answer", exact=(3, 5)) == [P + 3]
    assert _positions("exact_answer", exact=(3, 5), mode=PRE) == [P + 3, P + 4]
    assert _positions("exact_answer", exact=(4, 5)) == []
    assert _positions("exact_answer", exact=None) == []


# ---- edge cases: R == 1, P == 1 -------------------------------------------------------------


def test_one_token_answer():
    names = ("tbg", "slt", "exact_answer", "last", "first:2", "response")
    gen = resolve_positions(
        names, prompt_len=P, response_len=1, capture_mode=GEN, exact_answer=(0, 1)
    )
    assert gen.positions == (P - 1,) and gen.num_tokens == P
    assert gen.missing == ("slt", "exact_answer", "first:2")
    assert gen.rows["tbg"] == gen.rows["last"] == gen.rows["response"] == (0,)
    pre = resolve_positions(
        names, prompt_len=P, response_len=1, capture_mode=PRE, exact_answer=(0, 1)
    )
    assert pre.positions == (P - 1, P) and pre.missing == ("slt",)
    assert pre.rows["exact_answer"] == pre.rows["last"] == pre.rows["first:2"] == (1,)


def test_one_token_prompt():
    res = resolve_positions(
        ("prompt", "tbg", "slt", "last", "all"),
        prompt_len=1,
        response_len=3,
        capture_mode=GEN,
        exact_answer=None,
    )
    assert res.positions == (0, 1, 2) and res.rows["tbg"] == res.rows["prompt"] == (0,)
    assert res.rows["slt"] == res.rows["last"] == (2,) and res.rows["all"] == (0, 1, 2)
    assert res.contiguous
    assert count_rows(("tbg",), prompt_len=1, response_len=1, capture_mode=GEN) == 1
    with pytest.raises(ValueError):
        resolve_positions(
            ("tbg",), prompt_len=0, response_len=1, capture_mode=GEN, exact_answer=None
        )


def test_count_rows_is_the_union():
    assert (
        count_rows(("all", "tbg", "last"), prompt_len=P, response_len=R, capture_mode=GEN)
        == P + R - 1
    )
    assert count_rows(("tbg", "slt", "last"), prompt_len=P, response_len=R, capture_mode=GEN) == 2
    assert count_rows(("tbg", "slt", "last"), prompt_len=P, response_len=R, capture_mode=PRE) == 3
    assert (
        count_rows(
            ("exact_answer",), prompt_len=P, response_len=R, capture_mode=PRE, exact_answer_len=0
        )
        == 0
    )


# ---- the exact answer span ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,answer",
    [
        ("Paris.", "Paris"),
        ("\n\n  Answer: The Beatles!!\nmore", "The Beatles"),
        ("Answer:\nParis", "Paris"),
        ("answer : 42 ?", "42"),
        ("Mount Everest…", "Mount Everest"),
        ("...", None),
        ("", None),
        ("  \n \n", None),
    ],
)
def test_first_line_rule(text, answer):
    span = first_line_span(text)
    assert (text[span[0] : span[1]] if span else None) == answer


def test_char_to_token_span_takes_every_overlapping_token():
    toks = ["The", " Eiff", "el", " Tower", "."]
    assert char_to_token_span(toks, (4, 10)) == (1, 3)  # "Eiffel"
    assert char_to_token_span(toks, (5, 6)) == (1, 2)  # inside one token
    assert char_to_token_span(toks, (3, 4)) == (1, 2)  # the space of " Eiff"
    assert char_to_token_span(toks, (99, 100)) is None


def test_exact_answer_span_rules():
    toks = ["It", " is", " Paris", ".", "<|im_end|>"]
    text = "It is Paris."
    assert exact_answer_span(text, toks, (6, 11)) == {
        "chars": [6, 11],
        "tokens": [2, 3],
        "source": "grader",
    }
    # no grader span (an incorrect answer, a judge-graded task): the first line
    assert exact_answer_span(text, toks, None) == {
        "chars": [0, 11],
        "tokens": [0, 3],
        "source": "first_line",
    }
    # token texts that do not spell the response: the rule runs on their concatenation
    odd = ["ĠIt", "Ġis", "ĠParis", "."]
    assert exact_answer_span(text, odd, (6, 11)) == {
        "chars": [0, 12],
        "tokens": [0, 3],
        "source": "first_line",
    }
    assert exact_answer_span("", ["<|im_end|>"], None) is None
