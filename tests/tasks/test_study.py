"""A config's study fields: checked up front, turned into the task stream, fingerprinted."""

from __future__ import annotations

import pytest
from hallulog.config.manifest import build_manifest
from hallulog.config.run_config import ConfigError, RunConfig
from hallulog.config.specs import task_spec
from hallulog.contracts.ids import fingerprint
from hallulog.tasks import DatasetFormatError, load_task, open_task_spec
from hallulog.tasks.triviaqa import PROMPT_TEMPLATE


@pytest.mark.parametrize(
    "fields, flag",
    [
        ({"task": "nq_open", "question_field": "q"}, "--question-field"),
        ({"task": "qa"}, "--task-path"),
        ({"task": "gsm8k", "with_context": True}, "--with-context"),
        ({"task": "mmlu", "answer_kind": "numeric"}, "--answer-kind"),
        ({"task": "triviaqa", "answer_kind": "judge"}, "--answer-kind"),
        ({"task": "squadron"}, "--task"),
        ({"task": "nq_open", "fewshot_k": 2}, "--fewshot-k"),
    ],
)
def test_flags_that_do_not_fit_the_task_are_refused_up_front(fields, flag):
    with pytest.raises(ConfigError, match=flag):
        RunConfig(**fields)


def test_default_triviaqa_prompt_and_fingerprint_are_unchanged():
    config = RunConfig()
    stream = open_task_spec(task_spec(config))
    assert stream.spec is None and stream.prompt_template == PROMPT_TEMPLATE
    assert stream.answer_kind == "aliases"
    manifest = _manifest(config, stream)
    assert "prompt_template_hash" not in manifest["fingerprint_fields"]
    assert manifest["config_fingerprint"] == fingerprint(config.fingerprint_fields())


def test_a_system_prompt_on_triviaqa_keeps_ids_and_enters_the_fingerprint():
    config = RunConfig(system_prompt="Be brief.", limit=3)
    stream = open_task_spec(task_spec(config))
    groups = list(stream.groups())
    plain = load_task("triviaqa", limit=3).groups
    assert [g.prompt_id for g in groups] == [g.prompt_id for g in plain]
    for new, old in zip(groups, plain):
        assert new.messages == [{"role": "system", "content": "Be brief."}, *old.messages]
    manifest = _manifest(config, stream)
    assert manifest["fingerprint_fields"]["prompt_template_hash"] == stream.spec.hash
    other = RunConfig(system_prompt="Be terse.", limit=3)
    assert (
        _manifest(other, open_task_spec(task_spec(other)))["config_fingerprint"]
        != manifest["config_fingerprint"]
    )


def test_preset_stream_records_kind_template_and_completion_prompts():
    config = RunConfig(task="gsm8k", chat=False, limit=2)
    stream = open_task_spec(task_spec(config))
    assert stream.answer_kind == "numeric"
    groups = list(stream.groups())
    assert len(groups) == 2 and all(g.messages == [] and g.prompt for g in groups)
    assert groups[0].prompt.startswith("Solve the problem.")
    assert groups[0].reference["kind"] == "numeric"


def test_a_template_field_the_records_lack_stops_before_the_run(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "Q1?", "answer": "a"}\n{"question": "Q2?", "answer": "b"}\n')
    config = RunConfig(
        task="qa", task_path=str(data), prompt_template="{{ passage }} {{ question }}"
    )
    with pytest.raises(DatasetFormatError, match=r"qa\.jsonl:1: .*passage"):
        list(open_task_spec(task_spec(config)).groups())


def _manifest(config: RunConfig, stream) -> dict:
    return build_manifest(
        config,
        run_id="r",
        model_name="m",
        model_path="p",
        layer_ids=[0],
        hidden_size=1,
        num_hidden_layers=1,
        dataset=config.task,
        split="dev",
        prompt_template=stream.prompt_template,
        worker_count=1,
        total_prompts=1,
        answer_kind=stream.answer_kind,
        prompt_fingerprinted=stream.spec is not None,
    )


def test_fields_added_later_leave_earlier_runs_fingerprint_alone():
    """The default config's fingerprint is the one runs made before the study and model-size
    fields had: they still resume. A field set off its default enters it."""
    assert (
        fingerprint(RunConfig().fingerprint_fields())
        == "59573f6c6c1719d2f76497885b691df88c76a1532923730972b6d077a9e7884d"
    )
    assert "chat" in RunConfig(chat=False).fingerprint_fields()
    assert (
        "tensor_parallel_size"
        not in RunConfig(backend="vllm", tensor_parallel_size=2).fingerprint_fields()
    )
