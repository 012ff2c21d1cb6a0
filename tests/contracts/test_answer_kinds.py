"""hallulog.contracts.answer_kinds: every rule of docs/labels.md "Answer kinds", the spans, and the alias
rule equal to hallulog.contracts.answer_match.alias_match_label on arbitrary strings."""

from __future__ import annotations

import pytest
from hallulog.contracts.abstention import detect_abstention
from hallulog.contracts.answer_kinds import (
    Grade,
    answer_grader,
    answer_kind,
    grade_answer,
    parse_letter,
    parse_number,
    token_spans,
)
from hallulog.contracts.answer_match import alias_match_label, answer_tokens, normalize_answer
from hypothesis import given, settings
from hypothesis import strategies as st

CHOICES = {
    "kind": "choice",
    "choices": ["Paris", "London", "Paris, Texas", "Rome"],
    "answer_index": 2,
    "value": "C",
}
NUMBER = {"kind": "numeric", "number": 1234, "tolerance": 0.0, "value": "1234"}
ALIASES = {"kind": "aliases", "value": "Paris", "aliases": ["Paris", "Paris France"]}


def span_text(text: str, g: Grade) -> str | None:
    return None if g.span is None else text[g.span[0] : g.span[1]]


# ------------------------------------------------------------------------------------- kinds


def test_answer_kind_and_old_references():
    assert answer_kind(ALIASES) == "aliases"
    assert answer_kind({"value": "x", "aliases": ["x"]}) == "aliases"  # triviaqa, no kind
    assert answer_kind({"value": "x", "aliases": []}) is None
    assert answer_kind({"value": "x", "document": "..."}) is None  # precisewikiqa
    assert answer_kind("Someone") is None and answer_kind(None) is None
    assert answer_kind({"kind": "judge", "value": "x"}) == "judge"
    assert answer_kind({"kind": "essay"}) is None


def test_no_grader_for_judge_or_missing_references():
    assert answer_grader({"kind": "judge", "value": "Paris", "aliases": ["Paris"]}) is None
    assert answer_grader(None) is None and answer_grader("Someone") is None
    assert answer_grader({"name": "Zorvanex", "exists": False}) is None
    assert grade_answer({"kind": "judge", "value": "x"}, "x") is None


@pytest.mark.parametrize(
    "ref,grader",
    [
        ({"kind": "aliases", "aliases": []}, "alias_match"),
        ({"kind": "choice", "choices": [], "answer_index": 0}, "choice_match"),
        ({"kind": "choice", "choices": ["a", "b"], "answer_index": 2}, "choice_match"),
        ({"kind": "choice", "choices": ["a", "b"], "answer_index": True}, "choice_match"),
        ({"kind": "numeric", "number": None}, "numeric_match"),
        ({"kind": "numeric", "number": float("nan")}, "numeric_match"),
        ({"kind": "numeric", "number": 3, "tolerance": -1}, "numeric_match"),
    ],
)
def test_kind_without_its_fields_is_no_reference(ref, grader):
    assert grade_answer(ref, "anything A 3") == Grade(None, grader, "no_reference", None)


# ----------------------------------------------------------------------------------- aliases


@pytest.mark.parametrize(
    "text,label,matched",
    [
        ("It is Paris, France.", 0, "Paris, France"),  # earliest, then longest alias
        ("The capital: paris", 0, "paris"),
        ("the paris", 0, "paris"),
        ("PARIS!", 0, "PARIS"),
        ("Parisian", 1, None),
        ("Lyon", 1, None),
        ("", 1, None),
        ("İstanbul, then Paris_France", 0, "Paris_France"),
        ("Not Lyon but PARIS  —  france", 0, "PARIS"),  # "—" is not ASCII punctuation
    ],
)
def test_alias_rule_and_span(text, label, matched):
    g = grade_answer(ALIASES, text)
    assert (g.label, g.grader, g.status) == (
        label,
        "alias_match",
        "correct" if label == 0 else "incorrect",
    )
    assert span_text(text, g) == matched
    assert g.label == alias_match_label(text, ALIASES["aliases"])


def test_old_triviaqa_reference_and_none_answer():
    ref = {"value": "Paris", "aliases": ["Paris", None]}
    assert grade_answer(ref, "paris") == Grade(0, "alias_match", "correct", (0, 5))
    assert grade_answer(ref, None) == Grade(1, "alias_match", "incorrect", None)


def test_aliases_that_normalize_to_nothing_never_match():
    ref = {"kind": "aliases", "aliases": ["The", "..."]}
    assert grade_answer(ref, "the ...") == Grade(1, "alias_match", "incorrect", None)
    assert alias_match_label("the ...", ref["aliases"]) == 1


def test_token_spans_follow_lowercasing_that_grows():
    text = "İ Σ AB_cd the x"
    spans = token_spans(text)
    assert [t for t, _, _ in spans] == answer_tokens(text)
    assert [text[s:e] for _, s, e in spans] == ["İ", "Σ", "AB", "cd", "x"]


@pytest.mark.parametrize(
    "text,label,status",
    [
        ("I don't know.", 0, "abstained"),
        ("I\u2019m not sure.", 0, "abstained"),
        ("", 0, "abstained"),
        ("Paris", 1, "incorrect"),
    ],
)
def test_unanswerable(text, label, status):
    ref = {"kind": "aliases", "value": None, "aliases": [], "unanswerable": True}
    assert grade_answer(ref, text) == Grade(label, "alias_match", status, None)
    assert detect_abstention(text) is (label == 0)


# Text from pieces that stress the normalization: articles, punctuation, "_", curly quotes,
# characters whose lower case is longer (İ) or contextual (Σ), combining marks, non-ASCII
# punctuation (\w-boundaries inside a whitespace token), odd whitespace.
_PIECES = st.sampled_from(
    [
        "a",
        "an",
        "the",
        "A",
        "An",
        "THE",
        "paris",
        "Paris",
        "France",
        "x",
        "1066",
        "106",
        "_",
        ".",
        ",",
        "-",
        "'",
        "\u2019",
        "`",
        "´",
        "(",
        ")",
        " ",
        "  ",
        "\n",
        "\t",
        "\x1c",
        "\u3000",
        "İ",
        "Σ",
        "ΑΣ",
        "ß",
        "é",
        "e\u0301",
        "—",
        "«",
        "»",
        "€",
        "ǅ",
        "ﬁ",
        "dc",
        "d.c.",
        "Moby-Dick",
    ]
)
_TEXT = st.lists(_PIECES, max_size=14).map("".join) | st.text(max_size=30)


@settings(max_examples=600, deadline=None)
@given(text=_TEXT, aliases=st.lists(_TEXT, max_size=4))
def test_alias_label_equals_alias_match_label(text, aliases):
    assert [t for t, _, _ in token_spans(text)] == answer_tokens(text)
    ref = {"kind": "aliases", "aliases": aliases}
    g = grade_answer(ref, text)
    if not aliases:
        assert g.status == "no_reference"
        return
    assert g.label == alias_match_label(text, aliases)
    if g.label == 0:
        start, end = g.span
        assert 0 <= start < end <= len(text)
        assert normalize_answer(text[start:end])  # the span holds text, not only separators
    else:
        assert g.span is None


@settings(max_examples=300, deadline=None)
@given(
    before=_TEXT,
    alias=st.lists(
        st.sampled_from(["paris", "moby", "dick", "x1", "dc"]), min_size=1, max_size=3
    ).map(" ".join),
    after=_TEXT,
)
def test_alias_span_covers_the_alias(before, alias, after):
    text = f"{before} {alias.upper()} {after}"
    g = grade_answer({"kind": "aliases", "aliases": [alias]}, text)
    assert g.label == 0
    assert answer_tokens(text[g.span[0] : g.span[1]])[-len(alias.split()) :] == alias.split()


# ------------------------------------------------------------------------------------ choice


@pytest.mark.parametrize(
    "text,label,status,matched",
    [
        ("C", 0, "correct", "C"),
        ("(C)", 0, "correct", "C"),
        ("C.", 0, "correct", "C"),
        ("C) Paris, Texas", 0, "correct", "C"),
        ("**C**", 0, "correct", "C"),
        ("[C]", 0, "correct", "C"),
        ("  \n(C)\n", 0, "correct", "C"),
        ("Answer: C", 0, "correct", "C"),
        ("answer: C", 0, "correct", "C"),
        ("The answer is C.", 0, "correct", "C"),
        ("The correct answer is: (C)", 0, "correct", "C"),
        ("The answer is **(C)**.", 0, "correct", "C"),
        ("I think so.\nAnswer: C", 0, "correct", "C"),
        ("B", 1, "incorrect", "B"),
        ("B, Paris Texas", 1, "incorrect", "B"),  # the letter comes first
        ("E. no. The answer is (C)", 0, "correct", "C"),  # E is past the last choice
        ("Paris, Texas is it", 0, "correct", "Paris, Texas"),  # longest contains the other
        ("I think Paris", 1, "incorrect", "Paris"),
        ("rome", 1, "incorrect", "rome"),
        ("A cat sat on it", 1, "unparsed", None),  # the article A, not a letter
        ("The answer is B because it is", 1, "unparsed", None),  # a word follows the letter
        ("answer: c", 1, "unparsed", None),  # lower case never counts
        ("London or Rome", 1, "unparsed", None),  # two choices, neither contains
        ("No idea", 1, "unparsed", None),
        ("", 1, "unparsed", None),
    ],
)
def test_choice_rule(text, label, status, matched):
    g = grade_answer(CHOICES, text)
    assert (g.label, g.grader, g.status) == (label, "choice_match", status)
    assert span_text(text, g) == matched


def test_choice_letter_a_alone_or_marked():
    ref = {"kind": "choice", "choices": ["cat", "dog"], "answer_index": 0}
    assert grade_answer(ref, "A").label == 0
    assert grade_answer(ref, "A.").label == 0
    assert grade_answer(ref, "A, the cat").label == 0
    assert grade_answer(ref, "A dog").status == "incorrect"  # not a letter: the text "dog"
    assert grade_answer(ref, "A dog or a cat").status == "unparsed"


def test_parse_letter_range_and_identical_choices():
    assert parse_letter("D.", 4) == (3, (0, 1))
    assert parse_letter("D.", 3) is None
    same = {"kind": "choice", "choices": ["Paris", "paris"], "answer_index": 0}
    assert grade_answer(same, "Paris").status == "unparsed"  # two equally long matches
    assert grade_answer(same, "B").label == 1


# ----------------------------------------------------------------------------------- numeric


@pytest.mark.parametrize(
    "text,value,matched",
    [
        ("1,234", 1234, "1,234"),
        ("It is 1234.", 1234, "1234"),
        ("$1,234.00", 1234, "$1,234.00"),
        ("-3 degrees", -3, "-3"),
        ("x = \u22123", -3, "\u22123"),
        ("3.50", 3.5, "3.50"),
        (".5 of it", 0.5, ".5"),
        ("$12", 12, "$12"),
        ("12%", 12, "12%"),
        ("3/4", 0.75, "3/4"),
        ("first 7, then 12.", 12, "12"),  # the last number
        ("pages 5-10", 10, "10"),  # no minus after a digit
        ("1234kg", 1234, "1234"),
        ("The answer is 12 #### 18 apples, not 20", 18, "18"),  # the number after the last ####
        ("#### 5 #### 7", 7, "7"),
        ("1,2345", 2345, "2345"),  # not a thousands group
    ],
)
def test_parse_number(text, value, matched):
    x, (s, e) = parse_number(text)
    assert x == pytest.approx(value) and text[s:e] == matched


@pytest.mark.parametrize("text", ["no number", "H2O", "v1.2", "1234 ####", "1/0", ""])
def test_parse_number_none(text):
    assert parse_number(text) is None
    assert grade_answer(NUMBER, text) == Grade(1, "numeric_match", "unparsed", None)


def test_numeric_rule_and_tolerance():
    assert grade_answer(NUMBER, "So 1,234") == Grade(0, "numeric_match", "correct", (3, 8))
    assert grade_answer(NUMBER, "-1234") == Grade(1, "numeric_match", "incorrect", (0, 5))
    assert grade_answer(NUMBER, "1234.0001").label == 1
    loose = {"kind": "numeric", "number": 1234, "tolerance": 1e-3}
    assert grade_answer(loose, "1235").label == 0  # |1| <= 1e-3 * 1234
    assert grade_answer(loose, "1236").label == 1
    small = {"kind": "numeric", "number": 0.5, "tolerance": 0.01}
    assert grade_answer(small, "0.509").label == 0  # max(1, |0.5|) = 1
    assert grade_answer(small, "0.52").label == 1
    default = {"kind": "numeric", "number": 18}
    assert grade_answer(default, "18").label == 0 and grade_answer(default, "18.01").label == 1


def test_grader_is_prepared_once():
    grade = answer_grader(CHOICES)
    assert [grade(t).label for t in ("C", "B", "Paris, Texas")] == [0, 1, 0]
