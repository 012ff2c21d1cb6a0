"""Cell names from axis values: readable, filesystem-safe, unique, stable."""

from __future__ import annotations

import pytest
from hallulog.study.naming import NAME_RE, StudyError, axis_label, cell_name, check_labels, slug


def test_names_read_as_their_values():
    assert cell_name({"model": "/models/Llama-3.1-8B-Instruct/", "task": {"task": "nq_open"}}) == (
        "llama-3.1-8b-instruct__nq_open"
    )
    assert cell_name({"model": "meta-llama/Llama-3.1-8B", "seed": 3}) == "llama-3.1-8b__seed3"
    assert cell_name({"task": {"task": "qa", "task_path": "data/My File.jsonl"}}) == "qa-my-file"
    assert cell_name({}) == "cell"


def test_axis_order_is_fixed_whatever_the_key_order():
    a = cell_name({"seed": 1, "prompt": {"name": "terse"}, "model": "m", "task": {"task": "sciq"}})
    assert a == "m__sciq__terse__seed1"


def test_a_table_name_wins_and_other_keys_hash():
    assert axis_label("prompt", {"name": "CoT Prompt", "system_prompt": "think"}) == "cot-prompt"
    p = axis_label("prompt", {"system_prompt": "Answer briefly."})
    assert p.startswith("prompt-") and len(p) == len("prompt-") + 8
    t = axis_label("task", {"task": "qa", "task_path": "x.csv", "question_field": "q"})
    assert t.startswith("qa-x-") and len(t) == len("qa-x-") + 8


def test_labels_are_stable_and_independent_of_the_other_values():
    v = {"system_prompt": "Answer briefly.", "fewshot_k": 3}
    assert axis_label("prompt", v) == axis_label("prompt", dict(reversed(list(v.items()))))
    assert check_labels("prompt", [v])[0] == check_labels("prompt", [{"name": "x"}, v])[1]


@pytest.mark.parametrize(
    "text", ["", "...", "A/B\\C", "x" * 300, "__a__b__", "ü-ñ", "../../etc", " a b "]
)
def test_every_label_is_filesystem_safe(text):
    s = slug(text)
    assert NAME_RE.match(s) and "/" not in s and ".." not in s.replace("...", "")
    assert len(s) <= 48 and "__" not in s


def test_two_values_with_one_label_are_refused_naming_both():
    with pytest.raises(StudyError, match="/a/llama.*/b/llama.*`name`"):
        check_labels("model", ["/a/llama", "/b/llama"])
    assert check_labels("model", [{"model": "/a/llama", "name": "llama-a"}, "/b/llama"]) == [
        "llama-a",
        "llama",
    ]


def test_bad_axis_values_are_one_line():
    with pytest.raises(StudyError, match="axis seeds"):
        axis_label("seed", "1")
    with pytest.raises(StudyError, match="unknown axis 'temperature'"):
        cell_name({"temperature": 0.7})
