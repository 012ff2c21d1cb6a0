"""Prompts as data (hallulog.tasks.prompting): rendering, few-shot, errors, the spec hash."""

from __future__ import annotations

import itertools

import pytest
from hallulog.tasks import triviaqa
from hallulog.tasks.base import DatasetFormatError
from hallulog.tasks.prompting import (
    TRIVIAQA_TEMPLATE,
    PromptFieldError,
    PromptSpec,
    PromptTemplateError,
    check_template,
    choose_fewshot,
    load_template_source,
)

TEMPLATE = "{% if context %}Context: {{ context }}\n{% endif %}Question: {{ question }}\nAnswer:"
SHOTS = (
    {"question": "2+2?", "context": None, "answer": "4"},
    {"question": "Capital of Peru?", "context": "Peru is in South America.", "answer": "Lima"},
)
RECORD = {"question": "Largest planet?", "context": None, "choices": None, "record": {}}


@pytest.mark.parametrize(
    "question", ["What is the capital of France?", "  Who wrote Hamlet? \n", "Ünïcode — “quotes”?"]
)
def test_the_triviaqa_default_is_byte_identical_to_the_task_prompt(question):
    rendered = PromptSpec(TRIVIAQA_TEMPLATE).render({"question": question})
    assert rendered.prompt is None
    assert rendered.messages == triviaqa.build_prompt(question)
    assert rendered.messages == [
        {"role": "user", "content": triviaqa.PROMPT_TEMPLATE.format(question=question.strip())}
    ]


def test_chat_assembly_system_then_shots_then_the_record():
    spec = PromptSpec(TEMPLATE, system_prompt="Answer briefly.", fewshot=SHOTS)
    rendered = spec.render(RECORD)
    assert rendered.prompt is None
    assert rendered.messages == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Question: 2+2?\nAnswer:"},
        {"role": "assistant", "content": "4"},
        {
            "role": "user",
            "content": "Context: Peru is in South America.\nQuestion: Capital of Peru?\nAnswer:",
        },
        {"role": "assistant", "content": "Lima"},
        {"role": "user", "content": "Question: Largest planet?\nAnswer:"},
    ]
    assert PromptSpec(TEMPLATE).render(RECORD).messages == [
        {"role": "user", "content": "Question: Largest planet?\nAnswer:"}
    ]


def test_completion_assembly_is_one_text():
    spec = PromptSpec(TEMPLATE, system_prompt="Answer briefly.", fewshot=SHOTS, chat=False)
    rendered = spec.render({**RECORD, "context": "Jupiter is big."})
    assert rendered.messages is None
    assert rendered.prompt == (
        "Answer briefly.\n\n"
        "Question: 2+2?\nAnswer: 4\n\n"
        "Context: Peru is in South America.\nQuestion: Capital of Peru?\nAnswer: Lima\n\n"
        "Context: Jupiter is big.\nQuestion: Largest planet?\nAnswer:"
    )
    bare = PromptSpec(TEMPLATE, chat=False).render(RECORD)
    assert bare.prompt == "Question: Largest planet?\nAnswer:"


def test_a_template_file_loses_its_final_newline_and_sees_the_record(tmp_path):
    path = tmp_path / "t.j2"
    path.write_text("{{ record.title }}: {{ choices_text }}\n", encoding="utf-8")
    source, origin = load_template_source(None, str(path), "unused")
    assert origin == str(path)
    out = PromptSpec(source, origin=origin).render(
        {"record": {"title": "T"}, "choices_text": "A. x\nB. y"}
    )
    assert out.messages == [{"role": "user", "content": "T: A. x\nB. y"}]


def test_load_template_source_inline_file_default(tmp_path):
    assert load_template_source("{{ question }}", None, "d") == (
        "{{ question }}",
        "--prompt-template",
    )
    assert load_template_source(None, None, "d")[0] == "d"
    missing = tmp_path / "nope.j2"
    with pytest.raises(PromptTemplateError, match=f"{missing}: cannot read it") as info:
        load_template_source(None, str(missing), "d")
    assert "\n" not in str(info.value)
    bad = tmp_path / "latin1.j2"
    bad.write_bytes(b"caf\xe9 {{ question }}")
    with pytest.raises(PromptTemplateError, match="latin1.j2: cannot read it"):
        load_template_source(None, str(bad), "d")


def test_a_missing_field_names_the_record_and_the_flag():
    spec = PromptSpec("Context: {{ context }}\n{{ question }}")
    with pytest.raises(PromptFieldError) as info:
        spec.render({"question": "q"}, where=("data.jsonl", 7))
    err = info.value
    assert isinstance(err, DatasetFormatError) and (err.file, err.line) == ("data.jsonl", 7)
    assert err.what == (
        'template field "context" is undefined for this record '
        "(set --context-field, or use a template without it)"
    )
    with pytest.raises(PromptFieldError, match='"contxt" is undefined'):
        PromptSpec("{% if contxt %}x{% endif %}").render(RECORD)  # a typo is not "false"


def test_a_none_field_printed_is_an_error_but_can_be_tested():
    with pytest.raises(PromptFieldError, match='"context" is None for this record') as info:
        PromptSpec("Context: {{ context }}").render(RECORD, where=("f.csv", 3))
    assert str(info.value).startswith("f.csv:3: ")
    guarded = PromptSpec(
        "{% if context %}C{% endif %}{{ context | default('-') }}"
        "{{ context is defined }}{% for c in choices %}{{ c }}{% endfor %}"
        "{{ choices | length }}"
    )
    assert guarded.render(RECORD).messages[0]["content"] == "-False0"
    with pytest.raises(PromptFieldError, match="is None for this record"):
        PromptSpec("{{ record.extra }}").render({"record": {"extra": None}})
    with pytest.raises(PromptFieldError, match="has no attribute 'extra'"):
        PromptSpec("{{ record.extra }}").render({"record": {}})


def test_a_few_shot_example_that_cannot_render_names_the_few_shot_file():
    with pytest.raises(PromptFieldError) as info:
        PromptSpec(
            "{{ context }}",
            fewshot=({"context": "c", "answer": "a"}, {"answer": "b"}),
            fewshot_origin="train.jsonl",
        )
    assert (info.value.file, info.value.line) == ("train.jsonl", 2)
    with pytest.raises(PromptFieldError, match="few-shot example 1 has no answer"):
        PromptSpec("{{ question }}", fewshot=({"question": "q", "answer": None},))


def test_the_sandbox_refuses_internals():
    with pytest.raises(PromptFieldError, match="SecurityError: access to attribute '__class__'"):
        PromptSpec("{{ question.__class__.__mro__ }}").render(RECORD)


@pytest.mark.parametrize(
    "source,line",
    [
        ("Question: {{ question }", 1),
        ("ok\n{% for x in %}{% endfor %}", 2),
        ("{% if question %}never closed", 1),
    ],
)
def test_a_syntax_error_is_one_line_naming_origin_and_line(source, line):
    with pytest.raises(PromptTemplateError) as info:
        PromptSpec(source, origin="prompts/q.j2")
    message = str(info.value)
    assert message.startswith(f"prompt template prompts/q.j2: line {line}: ")
    assert "\n" not in message
    with pytest.raises(PromptTemplateError, match="--prompt-template: line"):
        check_template(source)


def test_the_hash_changes_with_every_part_and_only_with_them():
    base = PromptSpec(TEMPLATE, system_prompt="S", fewshot=SHOTS[:1], chat=True)
    same = PromptSpec(
        TEMPLATE,
        system_prompt="S",
        fewshot=({**SHOTS[0]},),
        chat=True,
        origin="elsewhere.j2",
        fewshot_origin="other.jsonl",
    )
    assert base.hash == same.hash and base.text == same.text and len(base.hash) == 64
    variants = [
        PromptSpec(TEMPLATE + " ", system_prompt="S", fewshot=SHOTS[:1]),
        PromptSpec(TEMPLATE, system_prompt="T", fewshot=SHOTS[:1]),
        PromptSpec(TEMPLATE, system_prompt=None, fewshot=SHOTS[:1]),
        PromptSpec(TEMPLATE, system_prompt="S", fewshot=()),
        PromptSpec(TEMPLATE, system_prompt="S", fewshot=({**SHOTS[0], "answer": "four"},)),
        PromptSpec(TEMPLATE, system_prompt="S", fewshot=({**SHOTS[0], "question": "3+1?"},)),
        PromptSpec(TEMPLATE, system_prompt="S", fewshot=SHOTS),
        PromptSpec(TEMPLATE, system_prompt="S", fewshot=SHOTS[:1], chat=False),
    ]
    hashes = {base.hash, *(v.hash for v in variants)}
    assert len(hashes) == len(variants) + 1
    # an example field the template does not print does not change the prompt, nor the hash
    unused = PromptSpec(TEMPLATE, system_prompt="S", fewshot=({**SHOTS[0], "record": {"x": 1}},))
    assert unused.hash == base.hash


def test_reservoir_sampling_is_deterministic_in_file_order_and_streams():
    records = [{"i": i} for i in range(1000)]
    first = choose_fewshot(records, 5, seed=11)
    assert first == choose_fewshot(iter(records), 5, seed=11)
    assert len(first) == 5 and [r["i"] for r in first] == sorted(r["i"] for r in first)
    assert choose_fewshot(records, 5, seed=12) != first
    assert choose_fewshot(records[:3], 5, seed=11) == records[:3]
    assert choose_fewshot(records, 0, seed=11) == []

    consumed = 0

    def stream():  # an endless-looking generator: only k records are ever held
        nonlocal consumed
        for i in itertools.count():
            if i == 100_000:
                return
            consumed += 1
            yield {"i": i}

    picked = choose_fewshot(stream(), 3, seed=1)
    assert consumed == 100_000 and len(picked) == 3


def test_reservoir_sampling_is_uniform_enough():
    counts = [0] * 10
    for seed in range(2000):
        for rec in choose_fewshot(({"i": i} for i in range(10)), 3, seed):
            counts[rec["i"]] += 1
    assert all(500 < c < 700 for c in counts)  # expected 600 each
